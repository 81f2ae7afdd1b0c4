/* DATA frames of attached HBONE streams, parsed in C (issue 23, step 2 of docs/native-data-path.md).
 *
 * Theory of operation. A DataPath is made for one ambit.hbone connection (the core) and the shell that drives it
 * (the session). feed(data) walks the frames at the start of data, the plaintext of one read, and does for DATA
 * frames of attached streams exactly what the core's receive_data does for them: the windows and the consumed
 * counts are taken, a WINDOW_UPDATE is queued when half a window is used up, and the payload goes to the stream's
 * sink as a read-only memoryview of data (no copy). It returns how many octets it handled; the caller hands the
 * rest, unchanged, to the core's receive_data, which starts at that frame's first octet.
 *
 * State has one owner: the core. A DataPath keeps no copy of any window, count or stream: it reads the core's own
 * fields before each frame and writes them back before each sink call (a sink may call back into the core), so
 * between calls nothing differs from the state receive_data would have left. What it handles:
 *
 *   1. the rest of a DATA frame the core has begun (its _data_left), when that frame goes to an attached sink and
 *      does not end the stream;
 *   2. a DATA frame whose 9-octet header is all in data, with no flag but the ignored ones (no PADDED, no
 *      END_STREAM), 1 octet to max_frame_size long, for an attached stream in good standing whose windows hold it;
 *      its payload may be cut by the end of data, and the core then holds the rest as in 1.
 *
 * It stops, handing the rest to receive_data, at anything else: fewer than 9 octets (the core keeps a partial
 * header in its own buffer), another frame type, a flag it does not handle, an empty frame, a length over
 * max_frame_size, a stream that is not attached or not known, a window the frame would overrun, and any state of
 * the core it does not handle (closed, a buffered partial frame, a frame the core began and C does not continue,
 * whose payload, whatever it looks like, is the core's to the end; the preface or the peer's first SETTINGS still to
 * come, a header block in progress, streams waiting for a window). Every refusal of the core therefore stays the
 * core's, by the same code: FRAME_SIZE_ERROR, FLOW_CONTROL_ERROR, the flood budgets (rules A to C).
 *
 * Sending (DataPath.send) is in hbone_send.c: a relay's chunk framed as DATA and written through the transport's
 * records in one call, on the same fields of the core. The relay's plain socket side (SocketSink, SocketReader:
 * step 3) is in relay_socket.c.
 *
 * Memory safety: every length is the peer's 24-bit field checked against max_frame_size and against the octets
 * held before any use; the header is read only when 9 octets are held; nothing is copied into a buffer of ours.
 * The GIL is held throughout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "hbone_data.h"

/* The attribute names of the core, its streams and the session, with their caches; the methods' names. */
AttrName s_closed, s_buf, s_data_left, s_data_stream, s_data_deliver, s_data_end, s_need_preface, s_continuation,
    s_peer_settings_seen, s_blocked, s_streams, s_settings, s_client_side, s_recv_window, s_recv_unacked, s_out,
    s_window, s_sink, s_remote_closed, s_ready, s_unacked, s_max_frame_size, s_connection_window, s_stream_window,
    s_received, s_held, s_write_paused, s_closing, s_backlog, s_size, s_records, s_queue, s_end_requested,
    s_send_window, s_conn_send_window, s_send_chunk, s_peer_max_frame, s_bucket_out, s_ack_window, s_acks_owed,
    s_acks_before;
PyObject *m_give_back, *m_flush, *m_write, *m_hold;
PyObject *zero;

/* Whether the core is in a state where the rest of data may be parsed here: 1, 0, or -1 with an exception. At a
 * frame's first octet (at_frame), also that the core has no frame in progress: the octets that follow a frame it
 * began and C did not continue are that frame's payload, whatever they look like. */
static int core_accepts(PyObject *core, int at_frame)
{
    static AttrName *const must_be_false[] = {&s_closed, &s_need_preface, &s_buf, &s_blocked, &s_data_left};
    size_t checks = sizeof must_be_false / sizeof must_be_false[0] - (at_frame ? 0 : 1);
    for (size_t i = 0; i < checks; i++) {
        int truth = get_true(core, must_be_false[i]);
        if (truth != 0)
            return truth < 0 ? -1 : 0;
    }
    int seen = get_true(core, &s_peer_settings_seen);
    if (seen <= 0)
        return seen;
    PyObject *continuation = attr_get(core, &s_continuation);
    if (continuation == NULL)
        return -1;
    int none = continuation == Py_None;
    Py_DECREF(continuation);
    return none;
}

/* The core's consumed(stream_id, length) for a stream known to be open and attached, with the stream's unacked
 * count and window: the connection's count first (its WINDOW_UPDATE by the core's _give_back), then the stream's,
 * a WINDOW_UPDATE queued once half of stream_window is used. 0, or -1 with an exception set. */
static int consume(PyObject *core, PyObject *stream, unsigned long stream_id, long length, long connection_window,
                   long stream_window)
{
    long unacked;
    if (get_long(core, &s_recv_unacked, &unacked) < 0 || set_long(core, &s_recv_unacked, unacked + length) < 0)
        return -1;
    if (unacked + length >= connection_window >> 1) {
        PyObject *done = PyObject_CallMethodObjArgs(core, m_give_back, zero, NULL);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    if (get_long(stream, &s_unacked, &unacked) < 0)
        return -1;
    unacked += length;
    if (unacked >= stream_window >> 1) {
        unsigned char update[FRAME_HEADER + 4] = {0, 0, 4, TYPE_WINDOW_UPDATE, 0};
        for (int i = 0; i < 4; i++) {
            update[5 + i] = (unsigned char)(stream_id >> (24 - 8 * i));
            update[9 + i] = (unsigned char)((unsigned long)unacked >> (24 - 8 * i));
        }
        PyObject *out = attr_get(core, &s_out);
        if (out == NULL)
            return -1;
        PyObject *frame = PyList_Check(out) ? PyBytes_FromStringAndSize((const char *)update, sizeof update) : NULL;
        if (frame == NULL && !PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "the core's output is not a list");
        long window;
        int failed = frame == NULL || PyList_Append(out, frame) < 0 || get_long(stream, &s_window, &window) < 0 ||
                     set_long(stream, &s_window, window + unacked) < 0;
        Py_XDECREF(frame);
        Py_DECREF(out);
        if (failed)
            return -1;
        unacked = 0;
    }
    return set_long(stream, &s_unacked, unacked);
}

/* The stream object for stream_id if it is attached and may take DATA (the core's _streams entry, a new
 * reference, and its sink in *sink, a new reference); NULL without an exception when it may not. */
static PyObject *attached_stream(PyObject *core, unsigned long stream_id, int client_side, PyObject **sink)
{
    *sink = NULL;
    PyObject *streams = attr_get(core, &s_streams);
    if (streams == NULL)
        return NULL;
    if (!PyDict_CheckExact(streams)) {
        Py_DECREF(streams);
        PyErr_SetString(PyExc_TypeError, "the core's streams are not a dict");
        return NULL;
    }
    PyObject *key = PyLong_FromUnsignedLong(stream_id);
    PyObject *stream = key == NULL ? NULL : PyDict_GetItemWithError(streams, key);
    Py_XDECREF(key);
    Py_XINCREF(stream);
    Py_DECREF(streams);
    if (stream == NULL)
        return NULL;
    PyObject *found = attr_get(stream, &s_sink);
    int closed = found == NULL ? -1 : get_true(stream, &s_remote_closed);
    int ready = closed != 0 ? -1 : client_side ? get_true(stream, &s_ready) : 1;
    if (found == NULL || closed != 0 || ready <= 0 || found == Py_None) {
        Py_XDECREF(found);
        Py_DECREF(stream);
        return NULL;
    }
    *sink = found;
    return stream;
}

/* Hand data[start:start+length] to sink as a read-only memoryview of data. 0, or -1 with the sink's exception. */
static int deliver(DataPath *self, PyObject **view, PyObject *data, PyObject *sink, Py_ssize_t start, long length)
{
    if (*view == NULL && (*view = PyMemoryView_FromObject(data)) == NULL)
        return -1;
    PyObject *piece = PySequence_GetSlice(*view, start, start + length);
    if (piece == NULL)
        return -1;
    PyObject *result = PyObject_CallOneArg(sink, piece);
    Py_DECREF(piece);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    self->frames++;
    self->octets += (unsigned long long)length;
    return 0;
}

/* The rest of the DATA frame the core has begun, if it may be handled here: the octets handled (0 when not), or
 * -1 with an exception set. */
static Py_ssize_t continue_frame(DataPath *self, PyObject **view, PyObject *data, Py_ssize_t size, long windows[2])
{
    PyObject *core = self->core;
    long left, stream_id;
    if (get_long(core, &s_data_left, &left) < 0)
        return -1;
    if (left <= 0)
        return 0;
    int deliver_it = get_true(core, &s_data_deliver);
    int ends = deliver_it <= 0 ? -1 : get_true(core, &s_data_end);
    if (deliver_it < 0 || (deliver_it && ends < 0))
        return -1;
    if (!deliver_it || ends != 0 || get_long(core, &s_data_stream, &stream_id) < 0)
        return PyErr_Occurred() ? -1 : 0;
    int client_side = get_true(core, &s_client_side);
    if (client_side < 0)
        return -1;
    PyObject *sink;
    PyObject *stream = attached_stream(core, (unsigned long)stream_id, client_side, &sink);
    if (stream == NULL)
        return PyErr_Occurred() ? -1 : 0;
    long take = size < left ? (long)size : left;
    int failed = set_long(core, &s_data_left, left - take) < 0 ||
                 consume(core, stream, (unsigned long)stream_id, take, windows[0], windows[1]) < 0 ||
                 deliver(self, view, data, sink, 0, take) < 0;
    Py_DECREF(sink);
    Py_DECREF(stream);
    return failed ? -1 : take;
}

PyDoc_STRVAR(feed_doc, "feed(data: bytes) -> int: hand the DATA frames of attached streams at the start of data to "
                       "their sinks, as the core's receive_data would; the octets handled (see hbone_data.c).");

static PyObject *DataPath_feed(DataPath *self, PyObject *data)
{
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "feed takes bytes");
        return NULL;
    }
    PyObject *core = self->core, *view = NULL;
    const unsigned char *octets = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data), pos = 0;
    long max_frame, windows[2];
    int accepts = core_accepts(core, 0), client_side = -1;
    if (accepts > 0) {
        PyObject *settings = attr_get(core, &s_settings);
        if (settings == NULL || get_long(settings, &s_max_frame_size, &max_frame) < 0 ||
            get_long(settings, &s_connection_window, &windows[0]) < 0 ||
            get_long(settings, &s_stream_window, &windows[1]) < 0 ||
            (client_side = get_true(core, &s_client_side)) < 0)
            accepts = -1;
        Py_XDECREF(settings);
    }
    if (accepts > 0) {
        pos = continue_frame(self, &view, data, size, windows);
        accepts = pos < 0 ? -1 : 1;
    }
    while (accepts > 0 && size - pos >= FRAME_HEADER) {
        /* Is pos a frame's first octet still (a begun frame may not be done, a sink may have changed the core)? */
        if ((accepts = core_accepts(core, 1)) <= 0)
            break;
        const unsigned char *header = octets + pos;
        long length = (long)header[0] << 16 | (long)header[1] << 8 | (long)header[2];
        unsigned long stream_id = ((unsigned long)header[5] << 24 | (unsigned long)header[6] << 16 |
                                   (unsigned long)header[7] << 8 | (unsigned long)header[8]) &
                                  STREAM_ID_MASK;
        if (header[3] != TYPE_DATA || header[4] & (FLAG_END_STREAM | FLAG_PADDED) || length == 0 ||
            length > max_frame || stream_id == 0)
            break;
        long connection_left, stream_left;
        PyObject *sink;
        PyObject *stream = attached_stream(core, stream_id, client_side, &sink);
        if (stream == NULL) {
            accepts = PyErr_Occurred() ? -1 : 0;
            break;
        }
        if (get_long(core, &s_recv_window, &connection_left) < 0 ||
            get_long(stream, &s_window, &stream_left) < 0) {
            accepts = -1;
        } else if (length <= connection_left && length <= stream_left) {
            Py_ssize_t held = size - pos - FRAME_HEADER;
            long take = held < length ? (long)held : length;
            /* The core's _data_begin for a frame in good standing, then _data_piece for what is here. */
            if (set_long(core, &s_recv_window, connection_left - length) < 0 ||
                set_long(stream, &s_window, stream_left - length) < 0 ||
                (take < length && (set_long(core, &s_data_stream, (long)stream_id) < 0 ||
                                   attr_set(core, &s_data_deliver, Py_True) < 0 ||
                                   attr_set(core, &s_data_end, Py_False) < 0 ||
                                   set_long(core, &s_data_left, length - take) < 0)) ||
                (take > 0 && (consume(core, stream, stream_id, take, windows[0], windows[1]) < 0 ||
                              deliver(self, &view, data, sink, pos + FRAME_HEADER, take) < 0)))
                accepts = -1;
            else
                pos += FRAME_HEADER + take;
        } else {
            accepts = 0; /* an overrun: the core's FLOW_CONTROL_ERROR */
        }
        Py_DECREF(sink);
        Py_DECREF(stream);
    }
    Py_XDECREF(view);
    if (accepts < 0)
        return NULL;
    if (pos > 0) {
        PyObject *out = attr_get(core, &s_out);
        int flush = out == NULL ? -1 : PyObject_IsTrue(out);
        Py_XDECREF(out);
        if (flush < 0 || attr_set(self->session, &s_received, Py_True) < 0)
            return NULL;
        if (flush) {
            PyObject *done = PyObject_CallMethodNoArgs(self->session, m_flush);
            if (done == NULL)
                return NULL;
            Py_DECREF(done);
        }
    }
    return PyLong_FromSsize_t(pos);
}

static PyObject *DataPath_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"core", "session", "transport", NULL};
    PyObject *core, *session, *transport = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O", keywords, &core, &session, &transport))
        return NULL;
    DataPath *self = (DataPath *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->core = Py_NewRef(core);
    self->session = Py_NewRef(session);
    self->transport = Py_NewRef(transport);
    return (PyObject *)self;
}

static int DataPath_traverse(DataPath *self, visitproc visit, void *arg)
{
    Py_VISIT(self->core);
    Py_VISIT(self->session);
    Py_VISIT(self->transport);
    return 0;
}

static int DataPath_clear(DataPath *self)
{
    Py_CLEAR(self->core);
    Py_CLEAR(self->session);
    Py_CLEAR(self->transport);
    return 0;
}

static void DataPath_dealloc(DataPath *self)
{
    PyObject_GC_UnTrack(self);
    DataPath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef DataPath_methods[] = {
    {"feed", (PyCFunction)DataPath_feed, METH_O, feed_doc},
    {"send", (PyCFunction)(void (*)(void))DataPath_send, METH_FASTCALL, DataPath_send_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef DataPath_members[] = {
    {"frames", T_ULONGLONG, offsetof(DataPath, frames), READONLY, "DATA frames (or pieces) handed to sinks"},
    {"octets", T_ULONGLONG, offsetof(DataPath, octets), READONLY, "their payload octets"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject DataPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ambit.native._hbone_data.DataPath",
    .tp_basicsize = sizeof(DataPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("DataPath(core, session): DATA frames of the core's attached streams, parsed in C."),
    .tp_new = DataPath_new,
    .tp_traverse = (traverseproc)DataPath_traverse,
    .tp_clear = (inquiry)DataPath_clear,
    .tp_dealloc = (destructor)DataPath_dealloc,
    .tp_methods = DataPath_methods,
    .tp_members = DataPath_members,
};

/* Test hooks: the cached attribute path (attr_cache.h) for any name, compared with Python's getattr and setattr by
 * tests/security/test_native_attr_cache.py. Each name gets one AttrName for the life of the process, as the
 * module's own names do (probe_names: name -> capsule of its AttrName). */
static PyObject *probe_names;

static void probe_free(PyObject *capsule)
{
    AttrName *attr = PyCapsule_GetPointer(capsule, "ambit.attr_probe");
    if (attr != NULL) {
        Py_XDECREF(attr->name);
        PyMem_Free(attr);
    }
}

static AttrName *probe(PyObject *name)
{
    if (!PyUnicode_CheckExact(name)) {
        PyErr_SetString(PyExc_TypeError, "an attribute name is a str");
        return NULL;
    }
    if (probe_names == NULL && (probe_names = PyDict_New()) == NULL)
        return NULL;
    PyObject *capsule = PyDict_GetItemWithError(probe_names, name);
    if (capsule != NULL)
        return PyCapsule_GetPointer(capsule, "ambit.attr_probe");
    if (PyErr_Occurred())
        return NULL;
    AttrName *attr = PyMem_Calloc(1, sizeof *attr);
    if (attr == NULL)
        return (AttrName *)PyErr_NoMemory();
    attr->name = Py_NewRef(name);
    PyUnicode_InternInPlace(&attr->name);
    capsule = PyCapsule_New(attr, "ambit.attr_probe", probe_free);
    if (capsule == NULL) {
        Py_DECREF(attr->name);
        PyMem_Free(attr);
        return NULL;
    }
    int stored = PyDict_SetItem(probe_names, name, capsule);
    Py_DECREF(capsule);
    return stored < 0 ? NULL : attr;
}

static PyObject *probe_get(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_attr_get takes an object and a name");
        return NULL;
    }
    AttrName *attr = probe(args[1]);
    return attr == NULL ? NULL : attr_get(args[0], attr);
}

static PyObject *probe_set(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_attr_set takes an object, a name and a value");
        return NULL;
    }
    AttrName *attr = probe(args[1]);
    if (attr == NULL || attr_set(args[0], attr, args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *probe_kind(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_attr_kind takes an object and a name");
        return NULL;
    }
    AttrName *attr = probe(args[1]);
    if (attr == NULL)
        return NULL;
    AttrWay *way = attr_way(attr, Py_TYPE(args[0]));
    const char *kind = way == NULL || !way->reads ? "generic"
                       : way->kind == ATTR_SLOT   ? "slot"
                       : way->kind == ATTR_DICT   ? "dict"
                                                  : "generic";
    return PyUnicode_FromString(kind);
}

static PyMethodDef module_methods[] = {
    {"_attr_get", (PyCFunction)(void (*)(void))probe_get, METH_FASTCALL, "obj.<name> through the attribute cache"},
    {"_attr_set", (PyCFunction)(void (*)(void))probe_set, METH_FASTCALL, "obj.<name> = value through the cache"},
    {"_attr_kind", (PyCFunction)(void (*)(void))probe_kind, METH_FASTCALL,
     "how the cache reads obj.<name>: 'slot', 'dict' or 'generic'"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_hbone_data",
    .m_doc = "DATA frames of attached HBONE streams, parsed in C (see hbone_data.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__hbone_data(void)
{
    static const AttrNameInit attrs[] = {
        {&s_closed, "_closed"},
        {&s_buf, "_buf"},
        {&s_data_left, "_data_left"},
        {&s_data_stream, "_data_stream"},
        {&s_data_deliver, "_data_deliver"},
        {&s_data_end, "_data_end"},
        {&s_need_preface, "_need_preface"},
        {&s_continuation, "_continuation"},
        {&s_peer_settings_seen, "_peer_settings_seen"},
        {&s_blocked, "_blocked"},
        {&s_streams, "_streams"},
        {&s_settings, "_settings"},
        {&s_client_side, "_client_side"},
        {&s_recv_window, "_recv_window"},
        {&s_recv_unacked, "_recv_unacked"},
        {&s_out, "_out"},
        {&s_window, "recv_window"},
        {&s_sink, "sink"},
        {&s_remote_closed, "remote_closed"},
        {&s_ready, "ready"},
        {&s_unacked, "unacked"},
        {&s_max_frame_size, "max_frame_size"},
        {&s_connection_window, "connection_window"},
        {&s_stream_window, "stream_window"},
        {&s_received, "received"},
        {&s_held, "held"},
        {&s_write_paused, "write_paused"},
        {&s_closing, "_closing"},
        {&s_backlog, "_backlog"},
        {&s_size, "size"},
        {&s_records, "_records"},
        {&s_queue, "queue"},
        {&s_end_requested, "end_requested"},
        {&s_send_window, "send_window"},
        {&s_conn_send_window, "_send_window"},
        {&s_send_chunk, "send_chunk"},
        {&s_peer_max_frame, "_peer_max_frame"},
        {&s_bucket_out, "_bucket_out"},
        {&s_ack_window, "_ack_window"},
        {&s_acks_owed, "_acks_owed"},
        {&s_acks_before, "_acks_before"},
    };
    struct {
        PyObject **slot;
        const char *name;
    } methods[] = {
        {&m_give_back, "_give_back"},
        {&m_flush, "flush"},
        {&m_write, "write"},
        {&m_hold, "_hold"},
    };
    if (attr_names_init(attrs, sizeof attrs / sizeof attrs[0]) < 0)
        return NULL;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (*methods[i].slot == NULL && (*methods[i].slot = PyUnicode_InternFromString(methods[i].name)) == NULL)
            return NULL;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    if (PyType_Ready(&DataPathType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "DataPath", (PyObject *)&DataPathType) < 0 || relay_socket_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
