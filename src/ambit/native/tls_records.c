/* The TLS record path of ambit.tls.native_transport, in C (issue 23, step 1 of docs/native-data-path.md).
 *
 * Theory of operation. A Records object is attached, after the handshake, to one non-blocking ssl.SSLSocket. It
 * reaches that socket's SSL * the checked way ambit.tls.contexts.read_ahead does (the pointer is used only once the
 * _ssl object's context slot is the socket's context, libssl names that context's SSL_CTX * for it, the SSL_CTX
 * reports the context's options and verify mode, and the SSL reads and writes the socket's descriptor), and keeps
 * strong references to the SSLSocket and to its _ssl object, which owns the SSL *: the pointer outlives every call.
 * close() forgets the pointer; no call touches it afterwards.
 *
 * Reads: read(limit) calls SSL_read_ex into one bytes object until OpenSSL wants more input, the peer closed, the
 * limit is reached, or a record shorter than a full one ended with nothing more held by OpenSSL (SSL_has_pending):
 * one call per readiness event, one bytes object, no join. What OpenSSL writes while reading (the answer to a
 * KeyUpdate that asks for one) is sent at the end of the call; a read stops once it wrote ANSWERS_PER_READ bytes, and
 * if any of its own output is left held it returns READ_WANTS_WRITE, so Python reads again only once the socket is
 * writable, as a socket BIO's WANT_WRITE would have it (else a peer asking for key updates and never reading would
 * have us hold one answer per request).
 *
 * Writes: the SSL's write BIO is replaced (SSL_set0_wbio) by an in-memory sink of our own (record_sink.c), so
 * SSL_write_ex encrypts all the caller's bytes into one buffer of records and the buffer leaves with one send();
 * what the socket refuses stays here, in order, and its size (held) is what Python's flow control counts. Every
 * OpenSSL call that may write (SSL_read answering a post-handshake message, SSL_shutdown's close_notify) is followed
 * by the same send, so nothing written by OpenSSL waits for a writer that is not registered: Python reads held after
 * each call.
 *
 * Memory safety: every length from Python is checked before use (limit, buffer sizes), nothing from the peer is
 * copied into a fixed-size buffer (OpenSSL parses the records; we only move plaintext it returns into a bytes object
 * sized for it and ciphertext it writes into a buffer grown with overflow checks, at most OUT_MAX bytes). The GIL is
 * held throughout: every call is non-blocking.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "attr_cache.h"
#include "record_sink.h"
#include "verify_cache.h"

#define FULL_RECORD 16384      /* the most plaintext one TLS record carries */
#define READ_MAX (16 << 20)    /* the largest read limit accepted from Python */
#define RECORD_OVERHEAD 64        /* more than a TLS 1.3 record adds to its plaintext (header, type, tag: 22) */
#define ANSWERS_PER_READ 16384 /* the most ciphertext one read writes (KeyUpdate answers) before it stops to send */

enum { READ_AGAIN = 0, READ_MORE = 1, READ_WANTS_WRITE = 2, READ_EOF = 3, READ_FAILED = 4 };

static PyObject *SSLError, *SSLWantReadError, *SSLWantWriteError, *SSLZeroReturnError, *SSLEOFError;

/* ---------------------------------------------------------------- errors, as Python's ssl raises them */

static PyObject *new_exception(PyObject *type, int code, const char *message)
{
    return PyObject_CallFunction(type, "is", code, message);
}

/* The exception for an SSL_get_error() code (a new reference, or NULL with an exception set). */
static PyObject *ssl_exception(int code, int saved_errno)
{
    unsigned long e = ERR_peek_last_error();
    switch (code) {
    case SSL_ERROR_WANT_READ:
        return new_exception(SSLWantReadError, code, "The operation did not complete (read)");
    case SSL_ERROR_WANT_WRITE:
        return new_exception(SSLWantWriteError, code, "The operation did not complete (write)");
    case SSL_ERROR_ZERO_RETURN:
        return new_exception(SSLZeroReturnError, code, "TLS/SSL connection has been closed (EOF)");
    case SSL_ERROR_SYSCALL:
        if (e == 0) {
            ERR_clear_error();
            if (saved_errno != 0)
                return PyObject_CallFunction(PyExc_OSError, "is", saved_errno, strerror(saved_errno));
            return new_exception(SSLEOFError, 8, "EOF occurred in violation of protocol");
        }
        break;
    default:
        break;
    }
    const char *reason = e ? ERR_reason_error_string(e) : NULL;
    const char *library = e ? ERR_lib_error_string(e) : NULL;
    PyObject *type = SSLError;
    if (ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == SSL_R_UNEXPECTED_EOF_WHILE_READING)
        type = SSLEOFError;
    char message[256]; /* filled from OpenSSL's own constant strings, truncated by snprintf */
    snprintf(message, sizeof message, "[%s] %s (tls_records)", library ? library : "SSL",
             reason ? reason : "unknown error");
    ERR_clear_error();
    PyObject *exc = new_exception(type, code, message);
    if (exc != NULL) {
        PyObject *lib = PyUnicode_FromString(library ? library : "SSL");
        PyObject *why = PyUnicode_FromString(reason ? reason : "unknown error");
        if (lib == NULL || why == NULL || PyObject_SetAttrString(exc, "library", lib) < 0 ||
            PyObject_SetAttrString(exc, "reason", why) < 0) {
            Py_CLEAR(exc);
        }
        Py_XDECREF(lib);
        Py_XDECREF(why);
    }
    return exc;
}

static void raise_exception(PyObject *exc)
{
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* ---------------------------------------------------------------- Records */

typedef struct {
    PyObject_HEAD
    PyObject *tls;    /* the ssl.SSLSocket */
    PyObject *sslobj; /* its _ssl._SSLSocket, which owns the SSL * */
    SSL *ssl;         /* NULL once closed */
    OutBuf *out;      /* the sink's buffer, owned by the sink BIO, owned by ssl */
    int fd;
    Py_ssize_t held;  /* ciphertext the socket has not taken yet */
} Records;

static int type_is(PyTypeObject *type, const char *name)
{
    for (; type != NULL; type = type->tp_base)
        if (strcmp(type->tp_name, name) == 0)
            return 1;
    return 0;
}

/* The descriptor of a Python socket object: the first field after the object header (PySocketSockObject). */
static int socket_fd(PyObject *sock)
{
    return *(int *)((char *)sock + sizeof(PyObject));
}

/* Send what is held, with one send(); 0, or -1 with an OSError set. */
static int send_held(Records *self)
{
    OutBuf *out = self->out;
    while (out->end > out->start) {
        if (socket_fd(self->tls) != self->fd) {
            PyErr_SetString(PyExc_OSError, "the socket was closed under the TLS records");
            return -1;
        }
        ssize_t sent = send(self->fd, out->data + out->start, out->end - out->start, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        out->start += (size_t)sent;
        break; /* a short send means the socket is full: the next would only hear EAGAIN */
    }
    if (out->start == out->end) {
        out->start = out->end = 0;
        if (out->cap > OUT_KEEP)
            out_release(out);
    }
    self->held = (Py_ssize_t)(out->end - out->start);
    return 0;
}

static int check_open(Records *self)
{
    if (self->ssl == NULL) {
        PyErr_SetString(PyExc_ValueError, "the TLS records are closed");
        return -1;
    }
    if (socket_fd(self->tls) != self->fd) {
        PyErr_SetString(PyExc_OSError, "the socket was closed under the TLS records");
        return -1;
    }
    return 0;
}

static PyObject *Records_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"tls", "sslobj", "context", "options", "verify_mode", NULL};
    PyObject *tls, *sslobj, *context;
    unsigned long long options;
    int verify_mode;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOKi", keywords, &tls, &sslobj, &context, &options,
                                     &verify_mode))
        return NULL;
    if (!type_is(Py_TYPE(tls), "_socket.socket") || !type_is(Py_TYPE(sslobj), "_ssl._SSLSocket") ||
        !type_is(Py_TYPE(context), "_ssl._SSLContext")) {
        PyErr_SetString(PyExc_TypeError, "an ssl.SSLSocket, its _ssl object and its context are needed");
        return NULL;
    }
    PyObject *inner = PyObject_GetAttrString(tls, "_sslobj");
    if (inner == NULL)
        PyErr_Clear();
    Py_XDECREF(inner); /* compared by identity only: tls keeps it alive */
    if (inner != sslobj) {
        PyErr_SetString(PyExc_TypeError, "sslobj is not the _ssl object of tls");
        return NULL;
    }
    int fd = socket_fd(tls);
    PyObject **slots = (PyObject **)((char *)sslobj + sizeof(PyObject)); /* Socket, ssl, ctx */
    SSL_CTX *ctx = *(SSL_CTX **)((char *)context + sizeof(PyObject));
    if (fd < 0 || slots[2] != context || ctx == NULL || SSL_CTX_get_options(ctx) != options ||
        SSL_CTX_get_verify_mode(ctx) != verify_mode) {
        PyErr_SetString(PyExc_ValueError, "the _ssl object's layout is not the one expected");
        return NULL;
    }
    SSL *ssl = (SSL *)slots[1];
    if (ssl == NULL || SSL_get_SSL_CTX(ssl) != ctx || SSL_get_fd(ssl) != fd ||
        SSL_get_rbio(ssl) != SSL_get_wbio(ssl) || BIO_method_type(SSL_get_wbio(ssl)) != BIO_TYPE_SOCKET) {
        PyErr_SetString(PyExc_ValueError, "the SSL of this socket is not the one expected");
        return NULL;
    }
    BIO *sink = BIO_new(record_sink_method);
    if (sink == NULL)
        return PyErr_NoMemory();
    Records *self = (Records *)type->tp_alloc(type, 0);
    if (self == NULL) {
        BIO_free(sink);
        return NULL;
    }
    SSL_set0_wbio(ssl, sink); /* the SSL owns the sink from now on (and drops its second socket BIO reference) */
    Py_INCREF(tls);
    Py_INCREF(sslobj);
    self->tls = tls;
    self->sslobj = sslobj;
    self->ssl = ssl;
    self->out = BIO_get_data(sink);
    self->fd = fd;
    self->held = 0;
    return (PyObject *)self;
}

static void Records_dealloc(Records *self)
{
    self->ssl = NULL;
    Py_CLEAR(self->sslobj);
    Py_CLEAR(self->tls);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(read_doc, "read(limit) -> (bytes | None, status, error | None): plaintext until WANT_READ, EOF, the "
                       "limit or a short record with nothing more held (see the module docstring).");

static PyObject *Records_read(Records *self, PyObject *arg)
{
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    if (limit < 1 || limit > READ_MAX) {
        PyErr_Format(PyExc_ValueError, "read limit %zd out of 1..%d", limit, READ_MAX);
        return NULL;
    }
    if (check_open(self) < 0)
        return NULL;
    Py_ssize_t cap = limit < FULL_RECORD ? limit : FULL_RECORD;
    PyObject *buffer = PyBytes_FromStringAndSize(NULL, cap);
    if (buffer == NULL)
        return NULL;
    Py_ssize_t total = 0;
    int status = READ_AGAIN;
    PyObject *error = NULL;
    size_t held_before = self->out->end - self->out->start;
    ERR_clear_error();
    for (;;) {
        if (total == cap) {
            if (cap >= limit) {
                status = READ_MORE;
                break;
            }
            cap = limit; /* more than one full record: room for the rest of the limit at once */
            if (_PyBytes_Resize(&buffer, cap) < 0)
                return NULL;
        }
        size_t room = (size_t)(cap - total), got = 0;
        errno = 0;
        int ok = SSL_read_ex(self->ssl, PyBytes_AS_STRING(buffer) + total, room, &got);
        int saved_errno = errno;
        if (ok) {
            if (got == 0 || got > room) { /* never: OpenSSL returns 1 to 'room' bytes on success */
                Py_DECREF(buffer);
                PyErr_SetString(PyExc_SystemError, "SSL_read_ex returned a length out of its bounds");
                return NULL;
            }
            total += (Py_ssize_t)got;
            if (self->out->end - self->out->start > held_before + ANSWERS_PER_READ) {
                status = READ_MORE; /* answers to post-handshake messages pile up: send them before reading on */
                break;
            }
            if (got < (room < FULL_RECORD ? room : FULL_RECORD) && !SSL_has_pending(self->ssl))
                break; /* the end of the peer's write, likely, and nothing held: no read only to hear EAGAIN */
            continue;
        }
        int code = SSL_get_error(self->ssl, ok);
        if (code == SSL_ERROR_WANT_READ) {
            ERR_clear_error();
            break;
        }
        if (code == SSL_ERROR_WANT_WRITE) {
            ERR_clear_error();
            status = READ_WANTS_WRITE;
        } else if (code == SSL_ERROR_ZERO_RETURN) {
            ERR_clear_error();
            status = READ_EOF;
        } else {
            status = READ_FAILED;
            error = ssl_exception(code, saved_errno);
            if (error == NULL) {
                Py_DECREF(buffer);
                return NULL;
            }
        }
        break;
    }
    /* Did OpenSSL write while reading (a KeyUpdate's answer)? What the socket then refuses must stop the reading, as
     * a socket BIO's WANT_WRITE does on the Python path: else a peer that asks for key updates and never reads would
     * have us read on and hold every answer (up to OUT_MAX per connection). */
    int wrote = self->out->end - self->out->start > held_before;
    if (self->out->end > self->out->start && send_held(self) < 0) { /* an answer to a post-handshake message */
        if (error == NULL) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            PyErr_NormalizeException(&type, &value, &traceback);
            Py_XDECREF(type);
            Py_XDECREF(traceback);
            error = value;
            status = READ_FAILED;
        } else {
            PyErr_Clear();
        }
    }
    if (wrote && self->held > 0 && (status == READ_AGAIN || status == READ_MORE))
        status = READ_WANTS_WRITE;
    PyObject *data;
    if (total == 0) {
        Py_DECREF(buffer);
        data = Py_NewRef(Py_None);
    } else {
        if (total < cap && _PyBytes_Resize(&buffer, total) < 0) {
            Py_XDECREF(error);
            return NULL;
        }
        data = buffer;
    }
    return Py_BuildValue("(NiN)", data, status, error != NULL ? error : Py_NewRef(Py_None));
}

PyDoc_STRVAR(write_doc, "write(data) -> held: encrypt all of data (or raise, as SSLObject.write does) and send "
                        "what is held with one send(); the ciphertext the socket did not take.");

static PyObject *Records_write(Records *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (check_open(self) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    PyObject *error = NULL;
    if (view.len > 0 && self->held > 0) {
        /* The socket is full: the plaintext waits in Python (as it would behind a socket BIO's WANT_WRITE) rather
         * than being encrypted behind what is held, which would cost a send() only to hear EAGAIN and moving the
         * held bytes to make room. */
        PyBuffer_Release(&view);
        raise_exception(new_exception(SSLWantWriteError, SSL_ERROR_WANT_WRITE, "The socket is full (write)"));
        return NULL;
    }
    if (view.len > 0) {
        size_t written = 0;
        /* Room for all the records at once (a record adds at most RECORD_OVERHEAD): no growth while encrypting. */
        size_t records = (size_t)view.len / FULL_RECORD + 1;
        if ((size_t)view.len < OUT_MAX && !out_reserve(self->out, (size_t)view.len + records * RECORD_OVERHEAD)) {
            PyBuffer_Release(&view);
            errno = ENOBUFS; /* an OSError: the transport fails the connection */
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        ERR_clear_error();
        errno = 0;
        int ok = SSL_write_ex(self->ssl, view.buf, (size_t)view.len, &written);
        int saved_errno = errno;
        if (!ok) {
            error = ssl_exception(SSL_get_error(self->ssl, ok), saved_errno);
            if (error == NULL) {
                PyBuffer_Release(&view);
                return NULL;
            }
        }
    }
    PyBuffer_Release(&view);
    if (send_held(self) < 0) {
        if (error == NULL)
            return NULL;
        PyErr_Clear(); /* OpenSSL's refusal is the one the caller must act on */
    }
    if (error != NULL) {
        raise_exception(error);
        return NULL;
    }
    return PyLong_FromSsize_t(self->held);
}

PyDoc_STRVAR(flush_doc, "flush() -> held: send what is held with one send(); what the socket did not take.");

static PyObject *Records_flush(Records *self, PyObject *Py_UNUSED(ignored))
{
    if (check_open(self) < 0 || send_held(self) < 0)
        return NULL;
    return PyLong_FromSsize_t(self->held);
}

PyDoc_STRVAR(shutdown_doc, "shutdown() -> bool: send close_notify (queued behind what is held); True once the "
                           "peer's close_notify has arrived too.");

static PyObject *Records_shutdown(Records *self, PyObject *Py_UNUSED(ignored))
{
    if (check_open(self) < 0)
        return NULL;
    ERR_clear_error();
    errno = 0;
    int done = SSL_shutdown(self->ssl);
    int saved_errno = errno;
    PyObject *error = NULL;
    if (done < 0) {
        int code = SSL_get_error(self->ssl, done);
        if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) {
            ERR_clear_error();
            done = 0;
        } else if ((error = ssl_exception(code, saved_errno)) == NULL) {
            return NULL;
        }
    }
    if (send_held(self) < 0) {
        if (error == NULL)
            return NULL;
        PyErr_Clear();
    }
    if (error != NULL) {
        raise_exception(error);
        return NULL;
    }
    return PyBool_FromLong(done == 1);
}

PyDoc_STRVAR(close_doc, "close(): forget the SSL; every later call raises ValueError. What is held is dropped.");

PyDoc_STRVAR(pending_doc, "pending() -> bool: whether OpenSSL holds input not returned yet (SSL_has_pending), as "
                          "read-ahead may leave after the handshake: then a read must not wait for the poller.");

static PyObject *Records_pending(Records *self, PyObject *Py_UNUSED(ignored))
{
    if (check_open(self) < 0)
        return NULL;
    return PyBool_FromLong(SSL_has_pending(self->ssl));
}

static PyObject *Records_close(Records *self, PyObject *Py_UNUSED(ignored))
{
    if (self->ssl != NULL) {
        self->out->start = self->out->end = 0;
        self->held = 0;
        self->ssl = NULL;
        self->out = NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef Records_methods[] = {
    {"read", (PyCFunction)Records_read, METH_O, read_doc},
    {"write", (PyCFunction)Records_write, METH_O, write_doc},
    {"flush", (PyCFunction)Records_flush, METH_NOARGS, flush_doc},
    {"shutdown", (PyCFunction)Records_shutdown, METH_NOARGS, shutdown_doc},
    {"pending", (PyCFunction)Records_pending, METH_NOARGS, pending_doc},
    {"close", (PyCFunction)Records_close, METH_NOARGS, close_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Records_members[] = {
    {"held", T_PYSSIZET, offsetof(Records, held), READONLY, "ciphertext bytes the socket has not taken yet"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ambit.native._tls_records.Records",
    .tp_basicsize = sizeof(Records),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PyDoc_STR("Records(tls, sslobj, context, options, verify_mode): the record path of one SSLSocket."),
    .tp_new = Records_new,
    .tp_dealloc = (destructor)Records_dealloc,
    .tp_methods = Records_methods,
    .tp_members = Records_members,
};

/* ---------------------------------------------------------------- ReadPump
 *
 * The read callback of a native transport whose protocol gave it a feed (issue 23: the HBONE session's DataPath),
 * registered with the loop in place of the transport's Python _read_ready. In the steady state of a relayed
 * connection it does what _read_ready does with no Python frame: one Records.read, the plaintext to the feed, and
 * nothing else when the feed took all of it, the read ended waiting for the poller (READ_AGAIN) and no ciphertext
 * was held or released by it. Everything else is the transport's, from the exact point reached:
 *
 *   - a transport that must not read now (lost, draining, paused, EOF seen, a write waiting for a read or a read
 *     for a write: what its _read_deferred checks): its _read_ready, which does what is due instead; nothing read;
 *   - an OSError of the read: its _fail(exc); any exception of the feed: its _protocol_failed(exc) (an Exception;
 *     anything else propagates, as from Python);
 *   - what the feed did not take, another status, or a change in what is held: its _after_read(rest, status,
 *     error), the tail of _read_ready.
 *
 * The transport stays the one owner of its state: the pump reads its flags before each read and keeps none. It holds
 * the transport (a cycle the transport breaks when it finishes, and which the collector can see). The GIL is held. */

typedef struct {
    PyObject_HEAD
    PyObject *transport; /* the NativeTlsSocketTransport */
    PyObject *records;   /* its Records (exactly that type) */
    PyObject *feed;      /* the protocol's feed (DataPath.feed) */
    PyObject *limit;     /* the read limit, as an int */
} ReadPump;

/* The transport's fields the pump reads, with their caches (attr_cache.h), and the methods it calls. */
static AttrName s_lost, s_draining, s_read_paused, s_eof, s_write_wants_read, s_read_wants_write, s_backlog, s_held;
static PyObject *m_read_ready, *m_after_read, *m_fail, *m_protocol_failed;

static PyObject *ReadPump_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *transport, *records, *feed, *limit;
    static char *keywords[] = {"transport", "records", "feed", "limit", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OO!:ReadPump", keywords, &transport, &RecordsType, &records,
                                     &feed, &PyLong_Type, &limit))
        return NULL;
    if (!PyCallable_Check(feed)) {
        PyErr_SetString(PyExc_TypeError, "feed must be callable");
        return NULL;
    }
    Py_ssize_t size = PyLong_AsSsize_t(limit);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size < 1 || size > READ_MAX) {
        PyErr_Format(PyExc_ValueError, "read limit %zd out of 1..%d", size, READ_MAX);
        return NULL;
    }
    ReadPump *self = (ReadPump *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->transport = Py_NewRef(transport);
    self->records = Py_NewRef(records);
    self->feed = Py_NewRef(feed);
    self->limit = Py_NewRef(limit);
    return (PyObject *)self;
}

static int ReadPump_traverse(ReadPump *self, visitproc visit, void *arg)
{
    Py_VISIT(self->transport);
    Py_VISIT(self->records);
    Py_VISIT(self->feed);
    Py_VISIT(self->limit);
    return 0;
}

static int ReadPump_clear(ReadPump *self)
{
    Py_CLEAR(self->transport);
    Py_CLEAR(self->records);
    Py_CLEAR(self->feed);
    Py_CLEAR(self->limit);
    return 0;
}

static void ReadPump_dealloc(ReadPump *self)
{
    PyObject_GC_UnTrack(self);
    ReadPump_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Call transport.<name>(exc) with the raised exception, as an except clause would: sys.exc_info() is exc during the
 * call (its handler may log it with its traceback). NULL if that call failed. */
static PyObject *hand_exception(PyObject *transport, PyObject *name)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (value == NULL) { /* never after a failed call; kept safe */
        Py_XDECREF(type);
        Py_XDECREF(traceback);
        PyErr_SetString(PyExc_SystemError, "an exception was expected");
        return NULL;
    }
    if (traceback != NULL)
        PyException_SetTraceback(value, traceback);
    PyObject *outer_type, *outer_value, *outer_traceback;
    PyErr_GetExcInfo(&outer_type, &outer_value, &outer_traceback);
    PyErr_SetExcInfo(type, Py_NewRef(value), traceback); /* steals type and traceback */
    PyObject *result = PyObject_CallMethodOneArg(transport, name, value);
    PyErr_SetExcInfo(outer_type, outer_value, outer_traceback);
    Py_DECREF(value);
    return result;
}

static PyObject *ReadPump_call(ReadPump *self, PyObject *args, PyObject *kwargs)
{
    if ((args != NULL && PyTuple_GET_SIZE(args) != 0) || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "a ReadPump takes no arguments");
        return NULL;
    }
    PyObject *transport = self->transport;
    if (transport == NULL) /* cleared by the collector: nothing to read for */
        Py_RETURN_NONE;
    Py_INCREF(transport); /* the calls below may finish the transport, which lets this pump go */
    PyObject *result = NULL;
    /* What _read_deferred checks, in its order. */
    AttrName *const flags[] = {&s_lost, &s_write_wants_read, &s_draining, &s_read_paused, &s_read_wants_write,
                               &s_eof};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        int set = get_true(transport, flags[i]);
        if (set < 0)
            goto done;
        if (set) {
            result = PyObject_CallMethodNoArgs(transport, m_read_ready);
            goto done;
        }
    }
    Records *records = (Records *)self->records;
    PyObject *read = Records_read(records, self->limit);
    if (read == NULL) {
        if (PyErr_ExceptionMatches(PyExc_OSError))
            result = hand_exception(transport, m_fail);
        goto done;
    }
    PyObject *data = Py_NewRef(PyTuple_GET_ITEM(read, 0)), *status = PyTuple_GET_ITEM(read, 1),
             *error = PyTuple_GET_ITEM(read, 2);
    if (data != Py_None) {
        PyObject *taken = PyObject_CallOneArg(self->feed, data);
        if (taken == NULL) {
            Py_DECREF(data);
            if (PyErr_ExceptionMatches(PyExc_Exception))
                result = hand_exception(transport, m_protocol_failed);
            Py_DECREF(read);
            goto done;
        }
        Py_ssize_t n = PyLong_AsSsize_t(taken);
        Py_DECREF(taken);
        Py_ssize_t length = PyBytes_GET_SIZE(data);
        int lost = n == -1 && PyErr_Occurred() ? -1 : get_true(transport, &s_lost);
        if (lost != 0 || n < 0 || n > length) {
            Py_DECREF(data);
            Py_DECREF(read);
            if (lost == 0)
                PyErr_Format(PyExc_ValueError, "the feed took %zd octets of %zd", n, length);
            else if (lost > 0)
                result = Py_NewRef(Py_None); /* the feed's sink ended the connection */
            goto done;
        }
        if (n == length) {
            Py_SETREF(data, Py_NewRef(Py_None));
        } else if (n > 0) {
            Py_SETREF(data, PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + n, length - n));
            if (data == NULL) {
                Py_DECREF(read);
                goto done;
            }
        }
    }
    if (data == Py_None && PyLong_AsLong(status) == READ_AGAIN) {
        /* The transport's flow control follows what the records hold (its backlog's held): unchanged, done. */
        Py_ssize_t told = -1;
        PyObject *backlog = attr_get(transport, &s_backlog);
        PyObject *held = backlog == NULL ? NULL : attr_get(backlog, &s_held);
        Py_XDECREF(backlog);
        if (held != NULL) {
            told = PyLong_AsSsize_t(held);
            Py_DECREF(held);
        }
        if (told == -1 && PyErr_Occurred()) {
            Py_DECREF(data);
            Py_DECREF(read);
            goto done;
        }
        if (told == records->held) {
            Py_DECREF(data);
            Py_DECREF(read);
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = PyObject_CallMethodObjArgs(transport, m_after_read, data, status, error, NULL);
    Py_DECREF(data);
    Py_DECREF(read);
done:
    Py_DECREF(transport);
    return result;
}

static PyTypeObject ReadPumpType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ambit.native._tls_records.ReadPump",
    .tp_basicsize = sizeof(ReadPump),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = PyDoc_STR("ReadPump(transport, records, feed, limit): a native transport's read callback while its "
                        "protocol has a feed (see tls_records.c)."),
    .tp_new = ReadPump_new,
    .tp_call = (ternaryfunc)ReadPump_call,
    .tp_traverse = (traverseproc)ReadPump_traverse,
    .tp_clear = (inquiry)ReadPump_clear,
    .tp_dealloc = (destructor)ReadPump_dealloc,
};

/* The SSL_CTX * of an ssl.SSLContext, checked as Records_new checks it: the type, and libssl reporting for that
 * pointer the options and verify mode Python reports for the context. NULL with an exception set otherwise. */
static SSL_CTX *checked_context(PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"context", "options", "verify_mode", NULL};
    PyObject *context;
    unsigned long long options;
    int verify_mode;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OKi", keywords, &context, &options, &verify_mode))
        return NULL;
    if (!type_is(Py_TYPE(context), "_ssl._SSLContext")) {
        PyErr_SetString(PyExc_TypeError, "an ssl.SSLContext is needed");
        return NULL;
    }
    SSL_CTX *ctx = *(SSL_CTX **)((char *)context + sizeof(PyObject));
    if (ctx == NULL || SSL_CTX_get_options(ctx) != options || SSL_CTX_get_verify_mode(ctx) != verify_mode) {
        PyErr_SetString(PyExc_ValueError, "the _ssl context's layout is not the one expected");
        return NULL;
    }
    return ctx;
}

PyDoc_STRVAR(cache_verification_doc,
             "cache_verification(context, options, verify_mode) -> None: verify each presented chain once per "
             "validity period on this context (see verify_cache.c).");

static PyObject *cache_verification(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwargs)
{
    SSL_CTX *ctx = checked_context(args, kwargs);
    if (ctx == NULL)
        return NULL;
    if (!verify_cache_install(ctx))
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(verification_counts_doc,
             "verification_counts(context, options, verify_mode) -> (hits, misses) | None: what the context's "
             "verification cache answered so far; None without one.");

static PyObject *verification_counts(PyObject *Py_UNUSED(module), PyObject *args, PyObject *kwargs)
{
    SSL_CTX *ctx = checked_context(args, kwargs);
    if (ctx == NULL)
        return NULL;
    unsigned long hits = 0, misses = 0;
    if (!verify_cache_counts(ctx, &hits, &misses))
        Py_RETURN_NONE;
    return Py_BuildValue("(kk)", hits, misses);
}

static PyMethodDef module_methods[] = {
    {"cache_verification", (PyCFunction)(void (*)(void))cache_verification, METH_VARARGS | METH_KEYWORDS,
     cache_verification_doc},
    {"verification_counts", (PyCFunction)(void (*)(void))verification_counts, METH_VARARGS | METH_KEYWORDS,
     verification_counts_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_tls_records",
    .m_doc = "TLS records read and written in C (see tls_records.c).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__tls_records(void)
{
    if (verify_cache_init() < 0) {
        PyErr_SetString(PyExc_ImportError, "cannot make the verification cache's ex_data index");
        return NULL;
    }
    if (record_sink_init() < 0) {
        PyErr_SetString(PyExc_ImportError, "cannot make the record sink's BIO method");
        return NULL;
    }
    PyObject *ssl_module = PyImport_ImportModule("_ssl");
    if (ssl_module == NULL)
        return NULL;
    SSLError = PyObject_GetAttrString(ssl_module, "SSLError");
    SSLWantReadError = PyObject_GetAttrString(ssl_module, "SSLWantReadError");
    SSLWantWriteError = PyObject_GetAttrString(ssl_module, "SSLWantWriteError");
    SSLZeroReturnError = PyObject_GetAttrString(ssl_module, "SSLZeroReturnError");
    SSLEOFError = PyObject_GetAttrString(ssl_module, "SSLEOFError");
    Py_DECREF(ssl_module);
    if (!SSLError || !SSLWantReadError || !SSLWantWriteError || !SSLZeroReturnError || !SSLEOFError)
        return NULL;
    static const AttrNameInit attrs[] = {
        {&s_lost, "_lost"},
        {&s_draining, "_draining"},
        {&s_read_paused, "_read_paused"},
        {&s_eof, "_eof"},
        {&s_write_wants_read, "_write_wants_read"},
        {&s_read_wants_write, "_read_wants_write"},
        {&s_backlog, "_backlog"},
        {&s_held, "held"},
    };
    struct {
        PyObject **slot;
        const char *name;
    } methods[] = {
        {&m_read_ready, "_read_ready"},
        {&m_after_read, "_after_read"},
        {&m_fail, "_fail"},
        {&m_protocol_failed, "_protocol_failed"},
    };
    if (attr_names_init(attrs, sizeof attrs / sizeof attrs[0]) < 0)
        return NULL;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (*methods[i].slot == NULL && (*methods[i].slot = PyUnicode_InternFromString(methods[i].name)) == NULL)
            return NULL;
    if (PyType_Ready(&RecordsType) < 0 || PyType_Ready(&ReadPumpType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Records", (PyObject *)&RecordsType) < 0 ||
        PyModule_AddObjectRef(m, "ReadPump", (PyObject *)&ReadPumpType) < 0 ||
        PyModule_AddIntConstant(m, "READ_AGAIN", READ_AGAIN) < 0 ||
        PyModule_AddIntConstant(m, "READ_MORE", READ_MORE) < 0 ||
        PyModule_AddIntConstant(m, "READ_WANTS_WRITE", READ_WANTS_WRITE) < 0 ||
        PyModule_AddIntConstant(m, "READ_EOF", READ_EOF) < 0 ||
        PyModule_AddIntConstant(m, "READ_FAILED", READ_FAILED) < 0 ||
        PyModule_AddIntConstant(m, "VERIFICATION_CACHE_ENTRIES", verify_cache_entries()) < 0 ||
        PyModule_AddObject(m, "OPENSSL_VERSION_NUMBER", PyLong_FromUnsignedLong(OpenSSL_version_num())) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
