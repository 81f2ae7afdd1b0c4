/* What the C files of the _hbone_data extension share (hbone_data.c: the type, receiving; hbone_send.c:
 * sending; relay_socket.c: the relay's socket side): the frame constants, the DataPath object, the interned attribute names of the core, its streams, its
 * session and its transport, and the accessors of those attributes. */
#ifndef AMBIT_HBONE_DATA_H
#define AMBIT_HBONE_DATA_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "attr_cache.h"

#define FRAME_HEADER 9
#define TYPE_DATA 0x0
#define TYPE_WINDOW_UPDATE 0x8
#define FLAG_END_STREAM 0x1
#define FLAG_PADDED 0x8
#define STREAM_ID_MASK 0x7FFFFFFFu

/* The attribute names of the core, its streams, the session and the transport, each with its cache (attr_cache.h),
 * and the names of the methods called on them, interned once (hbone_data.c). */
extern AttrName s_closed, s_buf, s_data_left, s_data_stream, s_data_deliver, s_data_end, s_need_preface,
    s_continuation, s_peer_settings_seen, s_blocked, s_streams, s_settings, s_client_side, s_recv_window,
    s_recv_unacked, s_out, s_window, s_sink, s_remote_closed, s_ready, s_unacked, s_max_frame_size,
    s_connection_window, s_stream_window, s_received, s_held, s_write_paused, s_closing, s_backlog, s_size,
    s_records, s_queue, s_end_requested, s_send_window, s_conn_send_window, s_send_chunk, s_peer_max_frame,
    s_bucket_out, s_ack_window, s_acks_owed, s_acks_before;
extern PyObject *m_give_back, *m_flush, *m_write, *m_hold;
extern PyObject *zero;

typedef struct {
    PyObject_HEAD
    PyObject *core;    /* the ambit.hbone connection */
    PyObject *session; /* its shell: told of input (received) and asked to flush what was queued */
    PyObject *transport; /* the native TLS transport that send() writes through, or None */
    unsigned long long frames; /* DATA frames (or pieces of one) handed to sinks */
    unsigned long long octets; /* their payload octets */
} DataPath;


/* The DataPath type (hbone_data.c): the relay's socket reader checks a session's data_path is one. */
extern PyTypeObject DataPathType;

/* DataPath.send (hbone_send.c). */
extern const char DataPath_send_doc[];
PyObject *DataPath_send(DataPath *self, PyObject *const *args, Py_ssize_t nargs);
/* DataPath.send for a frame already built around its payload (the relay's reader recv()s at its 10th octet):
 * frame is a bytes object of 9 octets more than the payload, referenced by the caller alone; its header is
 * written here when C sends it. The same answer as send (None: nothing done, the payload untouched). */
PyObject *DataPath_send_frame(DataPath *self, PyObject *stream_id, PyObject *frame);

/* The relay's plain socket side (relay_socket.c): SocketSink and SocketReader added to the module. 0, or -1. */
int relay_socket_init(PyObject *module);

#endif
