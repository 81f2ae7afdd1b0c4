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
 * DataPath_send_frame is the same for the relay's socket reader (relay_socket.c), which recv()s each chunk into
 * the frame's payload directly: only the header is written here, and the chunk is neither copied nor allocated
 * twice.
 *
 * Memory safety: the frame is sized from the caller's buffer (below 2**24 octets, and at most send_chunk, checked
 * before any use) and filled by memcpy of exactly that length; a frame built by the reader is a bytes object whose
 * own size, less the 9 octets of header, is the payload's. The GIL is held throughout.
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

/* The stream id send was given, if C may send on it: 1 (*stream_id), 0 (the Python path's: no native transport, an
 * id out of range), or -1 with an exception (not an int). */
static int sending_id(DataPath *self, PyObject *arg, unsigned long *stream_id)
{
    long id = PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred())
        return -1;
    if (self->transport == Py_None || id <= 0 || (unsigned long)id > STREAM_ID_MASK)
        return 0;
    *stream_id = (unsigned long)id;
    return 1;
}

/* Whether size octets may go on the stream now, and if so both windows taken for them: 1, 0, or -1. */
static int claim(DataPath *self, unsigned long stream_id, Py_ssize_t size)
{
    if (size <= 0 || size >= (1 << 24))
        return 0;
    PyObject *stream;
    int ok = sendable(self, stream_id, (long)size, &stream);
    if (ok > 0 && take_windows(self->core, stream, (long)size) < 0)
        ok = -1;
    Py_XDECREF(stream);
    return ok;
}

/* The 9-octet header of a DATA frame of length octets (below 2**24) on stream_id, no flags. */
static void frame_header(unsigned char *out, unsigned long length, unsigned long stream_id)
{
    out[0] = (unsigned char)(length >> 16);
    out[1] = (unsigned char)(length >> 8);
    out[2] = (unsigned char)length;
    out[3] = TYPE_DATA;
    out[4] = 0;
    for (int i = 0; i < 4; i++)
        out[5 + i] = (unsigned char)(stream_id >> (24 - 8 * i));
}

/* The transport's write of a whole frame, for a transport with nothing buffered: the records take it at once, and
 * ciphertext the socket refused is held (the transport's _hold follows it). Anything else the records raise (the
 * socket full of held bytes, WANT_READ, a failed socket) is the transport's to handle: its write gets the same
 * frame. Whether the writer may go on (not write_paused), or NULL with an exception. */
static PyObject *write_frame(DataPath *self, PyObject *frame)
{
    PyObject *records = attr_get(self->transport, &s_records);
    PyObject *held = records == NULL ? NULL : PyObject_CallMethodOneArg(records, m_write, frame);
    Py_XDECREF(records);
    if (held == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_OSError))
            return NULL;
        PyErr_Clear();
        PyObject *written = PyObject_CallMethodOneArg(self->transport, m_write, frame);
        if (written == NULL)
            return NULL;
        Py_DECREF(written);
    } else {
        int holding = PyObject_IsTrue(held);
        PyObject *told = holding > 0 ? PyObject_CallMethodOneArg(self->transport, m_hold, held) : NULL;
        Py_DECREF(held);
        if (holding < 0 || (holding > 0 && told == NULL))
            return NULL;
        Py_XDECREF(told);
    }
    int paused = get_true(self->session, &s_write_paused);
    return paused < 0 ? NULL : PyBool_FromLong(!paused);
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
    unsigned long stream_id = 0;
    int ok = sending_id(self, args[0], &stream_id);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *frame = NULL;
    ok = claim(self, stream_id, view.len);
    if (ok > 0 && (frame = PyBytes_FromStringAndSize(NULL, FRAME_HEADER + view.len)) == NULL)
        ok = -1;
    if (ok > 0) { /* copies, as send_data_now's join does */
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(frame);
        frame_header(out, (unsigned long)view.len, stream_id);
        memcpy(out + FRAME_HEADER, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = write_frame(self, frame);
    Py_DECREF(frame);
    return result;
}

PyObject *DataPath_send_frame(DataPath *self, PyObject *stream_id, PyObject *frame)
{
    unsigned long id = 0;
    Py_ssize_t length = PyBytes_GET_SIZE(frame) - FRAME_HEADER;
    int ok = sending_id(self, stream_id, &id);
    if (ok > 0)
        ok = claim(self, id, length);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    frame_header((unsigned char *)PyBytes_AS_STRING(frame), (unsigned long)length, id);
    return write_frame(self, frame);
}
