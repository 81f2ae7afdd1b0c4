/* The relay's plain socket side in C (issue 23, step 3 of docs/native-data-path.md): SocketSink and SocketReader,
 * the two callables through which a splice between a TCP socket (ambit.proxy.streams.SocketStream) and an HBONE
 * stream on the native DATA path (ambit.proxy.hbone_stream.HboneStream whose session has a DataPath) moves its
 * bytes in the steady state, with no Python frame.
 *
 * Theory of operation. Each is made for one direction of a splice (ambit.proxy.relay._Direction) and holds only
 * that direction; the Python objects stay the one owner of every piece of state, and each call reads what it needs
 * from them (the splice's over and callbacks, the socket stream's _closed, _eof_sent, _out, _read_armed, _sink,
 * _chunk, the HBONE stream's _error and _local_ended, its session's data_path) before acting, as hbone_data.c does.
 *
 *   SocketSink(direction), HBONE -> socket: attached to the HBONE core in place of the direction's on_data, so the
 *   DATA parser (feed, or the core's inline case) calls it with each payload. In the steady state (the splice runs
 *   with no per-chunk callbacks; the socket stream is open, not half-closed, with nothing queued) it send()s the
 *   payload on the socket and adds it to the splice's totals. A partial or refused send counts what the kernel
 *   took and hands the rest to on_data (whose write_nowait queues it, arms the writer and pauses the HBONE source),
 *   a failed send goes to the direction's send_failed, and anything not steady goes whole to on_data.
 *
 *   SocketReader(direction), socket -> HBONE: the loop's reader callback for the socket in place of the socket
 *   stream's _push_readable. In the steady state (the splice as above; the socket stream open, reading armed, not at
 *   EOF, delivering to this direction; the HBONE stream not failed or half-closed, its session on a DataPath) it
 *   recv()s one read of the stream's read size straight into the payload of the DATA frame it will travel in (9
 *   octets of header in front), grows that size as _push_readable does, and hands the frame to DataPath.send's
 *   frame entry in the same call (C to C), which writes the header and sends it: no second buffer and no copy per
 *   chunk. True: counted. False (taken, over the bound): counted, then the direction's hold_source pauses the
 *   socket until the HBONE stream drains, as on_data does. None (not taken): the chunk goes to on_data (a
 *   read-only view of the frame's payload), the Python path, which sends or queues it with all its rules. An
 *   exception from send goes to the direction's write_failed (which finishes the splice or raises, as on_data
 *   would). EOF and read errors go to the socket stream's _read_eof and _read_failed; anything not steady to
 *   _push_readable itself, before any read.
 *
 * Every fallback therefore starts at the exact octet C stopped at: nothing is read that is not delivered, counted
 * or handed on, and nothing is sent twice.
 *
 * Memory safety and descriptors. No descriptor is kept: each call asks the socket object for its descriptor
 * (fileno(), -1 once closed) after checking, in the same call and with the GIL held, that the socket stream is not
 * closed; nothing runs between that check and the send() or recv(), so a closed socket whose number was reused by
 * another connection is never written to or read from. recv() fills a bytes object of 9 octets more than the read
 * size from its 10th octet, for the read size exactly (checked to be 1 octet to 16 MiB first), and the object is
 * then shrunk to 9 octets more than what was read; send() reads the caller's buffer through the buffer protocol for
 * its own length. send() uses MSG_NOSIGNAL | MSG_DONTWAIT, recv() MSG_DONTWAIT: no
 * call blocks, and the GIL is held throughout.
 */
#include "hbone_data.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_READ (16 * 1024 * 1024)

static AttrName s_relay, s_over, s_callbacks, s_result, s_upward, s_upstream_bytes, s_downstream_bytes, s_src, s_dst,
    s_eof_sent, s_sock_out, s_sock, s_eof_seen, s_read_armed, s_sock_sink, s_chunk, s_max_chunk, s_error,
    s_local_ended, s_stream_id, s_session, s_data_path;
static PyObject *m_push_readable, *m_read_failed, *m_read_eof, *m_on_data, *m_write_failed, *m_send_failed,
    *m_hold_source, *m_fileno;

typedef struct {
    PyObject_HEAD
    PyObject *direction; /* the splice's _Direction this callable moves bytes for */
    vectorcallfunc vectorcall;
} RelaySide;

/* The direction's splice if it runs with no per-chunk callbacks (*relay, a new reference): 1, 0, or -1. */
static int running(PyObject *direction, PyObject **relay)
{
    *relay = attr_get(direction, &s_relay);
    if (*relay == NULL)
        return -1;
    int ok = *relay != Py_None;
    if (ok) {
        int over = get_true(*relay, &s_over);
        ok = over < 0 ? -1 : !over;
    }
    if (ok > 0) {
        PyObject *callbacks = attr_get(*relay, &s_callbacks);
        ok = callbacks == NULL ? -1 : callbacks == Py_None;
        Py_XDECREF(callbacks);
    }
    if (ok <= 0)
        Py_CLEAR(*relay);
    return ok;
}

/* Each of names is false on obj: 1, 0, or -1. */
static int all_false(PyObject *obj, AttrName *const names[], size_t count)
{
    for (size_t i = 0; i < count; i++) {
        int truth = get_true(obj, names[i]);
        if (truth != 0)
            return truth < 0 ? -1 : 0;
    }
    return 1;
}

/* The socket stream's descriptor, asked of its socket object now: 1 (*fd), 0 (closed), or -1. */
static int socket_fd(PyObject *stream, int *fd)
{
    PyObject *sock = attr_get(stream, &s_sock);
    if (sock == NULL)
        return -1;
    PyObject *number = PyObject_CallMethodNoArgs(sock, m_fileno);
    Py_DECREF(sock);
    if (number == NULL)
        return -1;
    long value = PyLong_AsLong(number);
    Py_DECREF(number);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0 || value > INT_MAX)
        return 0;
    *fd = (int)value;
    return 1;
}

/* Add n octets to the splice's total for this direction. 0, or -1. */
static int count(PyObject *relay, PyObject *direction, Py_ssize_t n)
{
    int upward = get_true(direction, &s_upward);
    if (upward < 0)
        return -1;
    PyObject *result = attr_get(relay, &s_result);
    if (result == NULL)
        return -1;
    AttrName *name = upward ? &s_upstream_bytes : &s_downstream_bytes;
    long total;
    int failed = get_long(result, name, &total) < 0 || set_long(result, name, total + (long)n) < 0;
    Py_DECREF(result);
    return failed ? -1 : 0;
}

/* obj.name(arg) (arg may be NULL: no argument), its result dropped: None, or NULL with the exception. */
static PyObject *call(PyObject *obj, PyObject *name, PyObject *arg)
{
    PyObject *result = arg == NULL ? PyObject_CallMethodNoArgs(obj, name) : PyObject_CallMethodOneArg(obj, name, arg);
    if (result == NULL)
        return NULL;
    Py_DECREF(result);
    Py_RETURN_NONE;
}

/* The pending exception, normalised, as an object (a new reference); the error indicator is cleared. */
static PyObject *take_exception(void)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value != NULL && traceback != NULL)
        PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return value;
}

static PyObject *direction_of(PyObject *callable);

/* SocketSink: HBONE -> socket. */

/* Whether the sink may send on the direction's socket now: 1 (*relay a new reference, *fd), 0, or -1. */
static int sink_steady(PyObject *direction, PyObject **relay, int *fd)
{
    static AttrName *const must_be_false[] = {&s_closed, &s_eof_sent, &s_sock_out};
    int ok = running(direction, relay);
    if (ok <= 0)
        return ok;
    PyObject *dst = attr_get(direction, &s_dst);
    ok = dst == NULL ? -1 : all_false(dst, must_be_false, 3);
    if (ok > 0)
        ok = socket_fd(dst, fd);
    Py_XDECREF(dst);
    if (ok <= 0)
        Py_CLEAR(*relay);
    return ok;
}

static PyObject *SocketSink_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a SocketSink takes one chunk");
        return NULL;
    }
    PyObject *direction = direction_of(callable), *data = args[0], *relay = NULL, *result = NULL;
    if (direction == NULL)
        return NULL;
    int fd = -1;
    int steady = sink_steady(direction, &relay, &fd);
    if (steady <= 0) {
        result = steady < 0 ? NULL : call(direction, m_on_data, data);
        Py_DECREF(direction);
        return result;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(relay);
        Py_DECREF(direction);
        return NULL;
    }
    Py_ssize_t size = view.len, sent = 0;
    int error = 0;
    if (size > 0) {
        do
            sent = send(fd, view.buf, (size_t)size, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (sent < 0 && errno == EINTR);
        error = sent < 0 ? errno : 0;
    }
    PyBuffer_Release(&view);
    if (sent < 0 && error != EAGAIN && error != EWOULDBLOCK) { /* as write_nowait's send would have raised */
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        PyObject *exc = take_exception();
        result = exc == NULL ? NULL : call(direction, m_send_failed, exc);
        Py_XDECREF(exc);
    } else if (sent > 0 && count(relay, direction, sent) < 0) {
        result = NULL;
    } else if (sent == size && size > 0) {
        result = Py_NewRef(Py_None);
    } else { /* refused in part or whole (or empty): the rest goes the Python way, which queues it and pauses */
        PyObject *whole = PyMemoryView_FromObject(data);
        PyObject *rest = whole == NULL ? NULL : PySequence_GetSlice(whole, sent > 0 ? sent : 0, size);
        Py_XDECREF(whole);
        result = rest == NULL ? NULL : call(direction, m_on_data, rest);
        Py_XDECREF(rest);
    }
    Py_DECREF(relay);
    Py_DECREF(direction);
    return result;
}

/* SocketReader: socket -> HBONE. */

typedef struct {
    PyObject *relay, *src, *dst, *data_path, *stream_id;
    long chunk, max_chunk;
    int fd;
} Reading;

static void reading_clear(Reading *r)
{
    Py_CLEAR(r->relay);
    Py_CLEAR(r->src);
    Py_CLEAR(r->dst);
    Py_CLEAR(r->data_path);
    Py_CLEAR(r->stream_id);
}

/* Whether the reader may read the direction's socket and send on its HBONE stream now: 1 (r filled), 0, or -1 (r
 * cleared). */
static int reader_steady(PyObject *direction, Reading *r)
{
    static AttrName *const src_false[] = {&s_closed, &s_eof_seen};
    static AttrName *const dst_false[] = {&s_local_ended};
    int ok = running(direction, &r->relay);
    if (ok > 0) {
        r->src = attr_get(direction, &s_src);
        ok = r->src == NULL ? -1 : all_false(r->src, src_false, 2);
    }
    if (ok > 0)
        ok = get_true(r->src, &s_read_armed);
    if (ok > 0) {
        PyObject *sink = attr_get(r->src, &s_sock_sink);
        ok = sink == NULL ? -1 : sink == direction;
        Py_XDECREF(sink);
    }
    if (ok > 0) {
        r->dst = attr_get(direction, &s_dst);
        ok = r->dst == NULL ? -1 : all_false(r->dst, dst_false, 1);
    }
    if (ok > 0) {
        PyObject *error = attr_get(r->dst, &s_error);
        ok = error == NULL ? -1 : error == Py_None;
        Py_XDECREF(error);
    }
    if (ok > 0) {
        PyObject *session = attr_get(r->dst, &s_session);
        r->data_path = session == NULL ? NULL : attr_get(session, &s_data_path);
        Py_XDECREF(session);
        ok = r->data_path == NULL ? -1 : Py_IS_TYPE(r->data_path, &DataPathType);
    }
    if (ok > 0) {
        r->stream_id = attr_get(r->dst, &s_stream_id);
        ok = r->stream_id == NULL ? -1 : 1;
    }
    if (ok > 0 && (get_long(r->src, &s_chunk, &r->chunk) < 0 || get_long(r->src, &s_max_chunk, &r->max_chunk) < 0))
        ok = -1;
    if (ok > 0)
        ok = r->chunk >= 1 && r->chunk <= r->max_chunk && r->max_chunk <= MAX_READ;
    if (ok > 0)
        ok = socket_fd(r->src, &r->fd);
    if (ok <= 0)
        reading_clear(r);
    return ok;
}

/* The read of n octets is in, at the 10th octet of frame: grow the read size as _push_readable does, send the
 * frame, count, and act on send's answer. */
static PyObject *relay_frame(PyObject *direction, Reading *r, PyObject *frame, Py_ssize_t n)
{
    if (n == r->chunk && r->chunk < r->max_chunk) {
        long grown = r->chunk * 2 < r->max_chunk ? r->chunk * 2 : r->max_chunk;
        if (set_long(r->src, &s_chunk, grown) < 0)
            return NULL;
    }
    PyObject *taken = DataPath_send_frame((DataPath *)r->data_path, r->stream_id, frame);
    if (taken == NULL) {
        PyObject *exc = take_exception();
        PyObject *result = exc == NULL ? NULL : call(direction, m_write_failed, exc);
        Py_XDECREF(exc);
        return result;
    }
    if (taken == Py_None) { /* the Python path gets the chunk: a read-only view of the frame's payload, no copy */
        Py_DECREF(taken);
        PyObject *whole = PyMemoryView_FromObject(frame);
        PyObject *chunk = whole == NULL ? NULL : PySequence_GetSlice(whole, FRAME_HEADER, FRAME_HEADER + n);
        Py_XDECREF(whole);
        PyObject *result = chunk == NULL ? NULL : call(direction, m_on_data, chunk);
        Py_XDECREF(chunk);
        return result;
    }
    int below_bound = PyObject_IsTrue(taken);
    Py_DECREF(taken);
    if (below_bound < 0 || count(r->relay, direction, n) < 0)
        return NULL;
    if (below_bound)
        Py_RETURN_NONE;
    return call(direction, m_hold_source, NULL);
}

static PyObject *SocketReader_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                         PyObject *kwnames)
{
    (void)args;
    if (PyVectorcall_NARGS(nargsf) != 0 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a SocketReader takes no arguments");
        return NULL;
    }
    PyObject *direction = direction_of(callable);
    if (direction == NULL)
        return NULL;
    Reading r = {NULL, NULL, NULL, NULL, NULL, 0, 0, -1};
    PyObject *frame = NULL, *result = NULL;
    int steady = reader_steady(direction, &r);
    if (steady <= 0) {
        PyObject *src = steady < 0 ? NULL : attr_get(direction, &s_src);
        result = src == NULL ? NULL : call(src, m_push_readable, NULL);
        Py_XDECREF(src);
        goto done;
    }
    /* The DATA frame the chunk will travel in, read into at its payload; its header is written when it is sent,
     * and is zeroes until then (a refused chunk is handed on as a view of this object: no uninitialised octet). */
    if ((frame = PyBytes_FromStringAndSize(NULL, FRAME_HEADER + (Py_ssize_t)r.chunk)) == NULL)
        goto done;
    memset(PyBytes_AS_STRING(frame), 0, FRAME_HEADER);
    Py_ssize_t n;
    do
        n = recv(r.fd, PyBytes_AS_STRING(frame) + FRAME_HEADER, (size_t)r.chunk, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            result = Py_NewRef(Py_None);
        } else {
            PyErr_SetFromErrno(PyExc_OSError);
            PyObject *exc = take_exception();
            result = exc == NULL ? NULL : call(r.src, m_read_failed, exc);
            Py_XDECREF(exc);
        }
    } else if (n == 0) {
        result = call(r.src, m_read_eof, NULL);
    } else if (n == r.chunk || _PyBytes_Resize(&frame, FRAME_HEADER + n) == 0) {
        result = relay_frame(direction, &r, frame, n);
    }
done:
    Py_XDECREF(frame);
    reading_clear(&r);
    Py_DECREF(direction);
    return result;
}

/* The two types. */

/* The direction, a new reference held for the whole call (the Python code it calls may let this object go), or
 * NULL with an exception once the collector cleared the object (broke a cycle through it). */
static PyObject *direction_of(PyObject *callable)
{
    PyObject *direction = ((RelaySide *)callable)->direction;
    if (direction == NULL)
        PyErr_SetString(PyExc_RuntimeError, "the relay side was cleared");
    return Py_XNewRef(direction);
}

static PyObject *RelaySide_new(PyTypeObject *type, PyObject *args, PyObject *kwargs, vectorcallfunc vectorcall)
{
    static char *keywords[] = {"direction", NULL};
    PyObject *direction;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O", keywords, &direction))
        return NULL;
    RelaySide *self = (RelaySide *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->direction = Py_NewRef(direction);
    self->vectorcall = vectorcall;
    return (PyObject *)self;
}

static PyObject *SocketSink_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    return RelaySide_new(type, args, kwargs, SocketSink_vectorcall);
}

static PyObject *SocketReader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    return RelaySide_new(type, args, kwargs, SocketReader_vectorcall);
}

static int RelaySide_traverse(RelaySide *self, visitproc visit, void *arg)
{
    Py_VISIT(self->direction);
    return 0;
}

static int RelaySide_clear(RelaySide *self)
{
    Py_CLEAR(self->direction);
    return 0;
}

static void RelaySide_dealloc(RelaySide *self)
{
    PyObject_GC_UnTrack(self);
    RelaySide_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define RELAY_SIDE_TYPE(NAME, DOC)                                                                                  \
    {                                                                                                              \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ambit.native._hbone_data." #NAME,                                \
        .tp_basicsize = sizeof(RelaySide),                                                                         \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,                          \
        .tp_vectorcall_offset = offsetof(RelaySide, vectorcall), .tp_call = PyVectorcall_Call, .tp_doc = PyDoc_STR(DOC), \
        .tp_new = NAME##_new, .tp_traverse = (traverseproc)RelaySide_traverse,                                     \
        .tp_clear = (inquiry)RelaySide_clear, .tp_dealloc = (destructor)RelaySide_dealloc,                         \
    }

static PyTypeObject SocketSinkType = RELAY_SIDE_TYPE(
    SocketSink, "SocketSink(direction): a splice's HBONE -> socket payloads sent on the socket in C (relay_socket.c).");
static PyTypeObject SocketReaderType = RELAY_SIDE_TYPE(
    SocketReader, "SocketReader(direction): a splice's socket -> HBONE reader callback in C (relay_socket.c).");

int relay_socket_init(PyObject *module)
{
    static const AttrNameInit attrs[] = {
        {&s_relay, "relay"},
        {&s_over, "over"},
        {&s_callbacks, "callbacks"},
        {&s_result, "result"},
        {&s_upward, "upward"},
        {&s_upstream_bytes, "upstream_bytes"},
        {&s_downstream_bytes, "downstream_bytes"},
        {&s_src, "src"},
        {&s_dst, "dst"},
        {&s_eof_sent, "_eof_sent"},
        {&s_sock_out, "_out"},
        {&s_sock, "_sock"},
        {&s_eof_seen, "_eof_seen"},
        {&s_read_armed, "_read_armed"},
        {&s_sock_sink, "_sink"},
        {&s_chunk, "_chunk"},
        {&s_max_chunk, "_max_chunk"},
        {&s_error, "_error"},
        {&s_local_ended, "_local_ended"},
        {&s_stream_id, "stream_id"},
        {&s_session, "_session"},
        {&s_data_path, "data_path"},
    };
    struct {
        PyObject **slot;
        const char *name;
    } methods[] = {
        {&m_push_readable, "_push_readable"},
        {&m_read_failed, "_read_failed"},
        {&m_read_eof, "_read_eof"},
        {&m_on_data, "on_data"},
        {&m_write_failed, "write_failed"},
        {&m_send_failed, "send_failed"},
        {&m_hold_source, "hold_source"},
        {&m_fileno, "fileno"},
    };
    if (attr_names_init(attrs, sizeof attrs / sizeof attrs[0]) < 0)
        return -1;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (*methods[i].slot == NULL && (*methods[i].slot = PyUnicode_InternFromString(methods[i].name)) == NULL)
            return -1;
    if (PyType_Ready(&SocketSinkType) < 0 || PyType_Ready(&SocketReaderType) < 0)
        return -1;
    if (PyModule_AddObjectRef(module, "SocketSink", (PyObject *)&SocketSinkType) < 0 ||
        PyModule_AddObjectRef(module, "SocketReader", (PyObject *)&SocketReaderType) < 0)
        return -1;
    return 0;
}
