/* Sending on the native DATA path (issue 23, step 2): DataPath.send, a relay's chunk framed as one DATA frame and
 * written through the transport's TLS records in the same call (see hbone_data.c for the object).
 *
 * Theory of operation. send(stream_id, data) does what HboneStream.write_nowait does through send_data_now and the
 * native transport's write, for their common case only: the session is released, the transport is open with
 * nothing buffered (no refused plaintext, no held ciphertext), and the core's send_data_now would frame the chunk
 * inline (no output queued, the stream established, nothing queued on it, not ended, both send windows, send_chunk
 * and the peer's SETTINGS_MAX_FRAME_SIZE at least the chunk). It then takes both windows and rule B's output count
 * on the core's own fields, copies the chunk behind a 9-octet header into one bytes object and hands it to the
 * records' write; ciphertext the socket refused is held, and the transport's _hold is told, as its write would.
 * In every other case it does nothing and returns None: the Python path sends the chunk, with all its rules.
 *
 * Memory safety: the frame is sized from the caller's buffer (below 2**24 octets, and at most send_chunk, checked
 * before any use) and filled by memcpy of exactly that length. The GIL is held throughout.
 */
#include "hbone_data.h"

#include <string.h>

/* An attribute that must be an int and at least need: 1, 0, or -1 with an exception set. */
static int at_least(PyObject *obj, AttrName *name, long need)
{
    long value;
    if (get_long(obj, name, &value) < 0)
        return -1;
    return value >= need;
}

/* Whether send() may frame size octets for the stream now: the session is released, the transport takes writes
 * with nothing buffered, and send_data_now's own inline case holds (no output queued, the stream established with
 * nothing queued and not ended, every window and frame limit above size). 1 (the stream in *stream, a new
 * reference), 0, or -1 with an exception set. */
static int sendable(DataPath *self, unsigned long stream_id, long size, PyObject **stream)
{
    PyObject *core = self->core, *transport = self->transport;
    *stream = NULL;
    int ok = get_true(self->session, &s_held);
    if (ok != 0)
        return ok < 0 ? -1 : 0;
    if ((ok = get_true(transport, &s_closing)) != 0 || (ok = get_true(core, &s_out)) != 0)
        return ok < 0 ? -1 : 0;
    PyObject *backlog = attr_get(transport, &s_backlog);
    ok = backlog == NULL ? -1 : get_true(backlog, &s_size);
    Py_XDECREF(backlog);
    if (ok != 0)
        return ok < 0 ? -1 : 0;
    PyObject *settings = attr_get(core, &s_settings);
    ok = settings == NULL ? -1 : at_least(settings, &s_send_chunk, size);
    Py_XDECREF(settings);
    if (ok > 0)
        ok = at_least(core, &s_conn_send_window, size);
    if (ok > 0)
        ok = at_least(core, &s_peer_max_frame, size);
    if (ok <= 0)
        return ok;
    PyObject *found = NULL;
    PyObject *streams = attr_get(core, &s_streams);
    if (streams == NULL)
        return -1;
    PyObject *key = PyDict_CheckExact(streams) ? PyLong_FromUnsignedLong(stream_id) : NULL;
    if (key != NULL)
        found = PyDict_GetItemWithError(streams, key);
    else if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "the core's streams are not a dict");
    Py_XINCREF(found);
    Py_XDECREF(key);
    Py_DECREF(streams);
    if (found == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *queue = attr_get(found, &s_queue);
    ok = queue == NULL ? -1 : queue == Py_None;
    Py_XDECREF(queue);
    if (ok > 0)
        ok = get_true(found, &s_ready);
    if (ok > 0) {
        int ended = get_true(found, &s_end_requested);
        ok = ended < 0 ? -1 : !ended;
    }
    if (ok > 0)
        ok = at_least(found, &s_send_window, size);
    if (ok <= 0) {
        Py_DECREF(found);
        return ok;
    }
    *stream = found;
    return 1;
}

/* send_data_now's inline case on the core's fields: both send windows taken, rule B's output count kept. */
static int take_windows(PyObject *core, PyObject *stream, long size)
{
    long stream_window, connection_window, bucket, ack_window, owed;
    if (get_long(stream, &s_send_window, &stream_window) < 0 ||
        set_long(stream, &s_send_window, stream_window - size) < 0 ||
        get_long(core, &s_conn_send_window, &connection_window) < 0 ||
        set_long(core, &s_conn_send_window, connection_window - size) < 0 ||
        get_long(core, &s_bucket_out, &bucket) < 0 || get_long(core, &s_ack_window, &ack_window) < 0)
        return -1;
    bucket += size + FRAME_HEADER;
    if (bucket >= ack_window) {
        if (get_long(core, &s_acks_owed, &owed) < 0 || set_long(core, &s_acks_before, owed) < 0 ||
            set_long(core, &s_acks_owed, 0) < 0)
            return -1;
        bucket = 0;
    }
    return set_long(core, &s_bucket_out, bucket);
}

const char DataPath_send_doc[] = "send(stream_id, data) -> bool | None: frame data as one DATA frame and write it "
                                 "through the transport's records, as send_data_now then transport.write would; "
                                 "whether the writer may go on (not write_paused), or None (nothing done) where only "
                                 "the Python path may send it.";

PyObject *DataPath_send(DataPath *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "send takes a stream id and data");
        return NULL;
    }
    long stream_id = PyLong_AsLong(args[0]);
    if (stream_id == -1 && PyErr_Occurred())
        return NULL;
    if (self->transport == Py_None || stream_id <= 0 || (unsigned long)stream_id > STREAM_ID_MASK)
        Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *stream = NULL, *frame = NULL, *result = NULL;
    int ok = view.len > 0 && view.len < (1 << 24) ? sendable(self, (unsigned long)stream_id, (long)view.len, &stream)
                                                  : 0;
    if (ok > 0 && take_windows(self->core, stream, (long)view.len) < 0)
        ok = -1;
    if (ok > 0 && (frame = PyBytes_FromStringAndSize(NULL, FRAME_HEADER + view.len)) == NULL)
        ok = -1;
    if (ok > 0) { /* copies, as send_data_now's join does */
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(frame);
        unsigned long length = (unsigned long)view.len;
        out[0] = (unsigned char)(length >> 16);
        out[1] = (unsigned char)(length >> 8);
        out[2] = (unsigned char)length;
        out[3] = TYPE_DATA;
        out[4] = 0;
        for (int i = 0; i < 4; i++)
            out[5 + i] = (unsigned char)((unsigned long)stream_id >> (24 - 8 * i));
        memcpy(out + FRAME_HEADER, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    Py_XDECREF(stream);
    if (ok <= 0) {
        Py_XDECREF(frame);
        if (ok < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    /* The transport's write for a transport with nothing buffered: the records take it at once, and ciphertext the
     * socket refused is held (the transport's _hold follows it). Anything else the records raise (the socket full
     * of held bytes, WANT_READ, a failed socket) is the transport's to handle: its write gets the same frame. */
    PyObject *records = attr_get(self->transport, &s_records);
    PyObject *held = records == NULL ? NULL : PyObject_CallMethodOneArg(records, m_write, frame);
    Py_XDECREF(records);
    if (held == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_OSError))
            goto done;
        PyErr_Clear();
        PyObject *written = PyObject_CallMethodOneArg(self->transport, m_write, frame);
        if (written == NULL)
            goto done;
        Py_DECREF(written);
    } else {
        int holding = PyObject_IsTrue(held);
        PyObject *told = holding > 0 ? PyObject_CallMethodOneArg(self->transport, m_hold, held) : NULL;
        Py_DECREF(held);
        if (holding < 0 || (holding > 0 && told == NULL))
            goto done;
        Py_XDECREF(told);
    }
    int paused = get_true(self->session, &s_write_paused);
    if (paused >= 0)
        result = PyBool_FromLong(!paused);
done:
    Py_DECREF(frame);
    return result;
}
