/* The output sink of the TLS record path (tls_records.c): a BIO whose writes append to one buffer.
 *
 * Theory of operation. tls_records.c replaces an SSL's write BIO with a sink BIO (SSL_set0_wbio): OpenSSL's records
 * are appended to the sink's OutBuf, and the record path sends them from there with one send(), with no copy out of
 * a memory BIO. The buffer grows by doubling with overflow checks, up to OUT_MAX bytes held per connection (past it
 * a write fails, and the connection with it). Emptied large buffers are kept in a few process-wide spares for the
 * next large write of any connection, so an idle connection holds at most OUT_KEEP bytes.
 *
 * Threads: the spares are touched only with the GIL held (PyGILState_Check): Python's _ssl releases the GIL around
 * its own OpenSSL calls, which could reach a sink; without the GIL the sink only allocates and frees its own buffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdlib.h>
#include <string.h>

#include "record_sink.h"

BIO_METHOD *record_sink_method;

/* Emptied large buffers, kept for the next large write of any connection (the GIL serialises every use): a bulk
 * connection reuses one buffer instead of allocating and growing one per write, and an idle connection holds none. */
#define SPARE_SLOTS 4
#define SPARE_MAX ((size_t)4 << 20) /* larger buffers are freed, not kept */
static struct {
    char *data;
    size_t cap;
} spares[SPARE_SLOTS];

void out_release(OutBuf *out)
{
    /* Only with the GIL: _ssl releases it around its own OpenSSL calls, which could reach the sink. */
    if (out->data != NULL && out->cap <= SPARE_MAX && PyGILState_Check()) {
        int slot = 0; /* an empty slot, else the one with the smallest buffer */
        for (int i = 0; i < SPARE_SLOTS && spares[slot].data != NULL; i++)
            if (spares[i].data == NULL || spares[i].cap < spares[slot].cap)
                slot = i;
        if (spares[slot].data == NULL || spares[slot].cap < out->cap) {
            free(spares[slot].data);
            spares[slot].data = out->data;
            spares[slot].cap = out->cap;
            out->data = NULL;
        }
    }
    free(out->data);
    out->data = NULL;
    out->cap = out->start = out->end = 0;
}

int out_reserve(OutBuf *out, size_t len)
{
    size_t used = out->end - out->start;
    if (len > OUT_MAX - used)
        return 0; /* past the bound: the SSL_write fails, the connection with it */
    if (len <= out->cap - out->end)
        return 1;
    if (out->start > 0 && len <= out->cap - used) { /* room enough once the sent bytes are dropped */
        memmove(out->data, out->data + out->start, used);
        out->start = 0;
        out->end = used;
        return 1;
    }
    size_t need = used + len, cap = out->cap ? out->cap : 4096;
    while (cap < need)
        cap = cap > OUT_MAX / 2 ? OUT_MAX : cap * 2;
    char *data = NULL;
    for (int i = 0; i < SPARE_SLOTS && data == NULL && PyGILState_Check(); i++)
        if (spares[i].data != NULL && spares[i].cap >= need) {
            data = spares[i].data;
            cap = spares[i].cap;
            spares[i].data = NULL;
        }
    if (data == NULL && (data = malloc(cap)) == NULL)
        return 0;
    if (used)
        memcpy(data, out->data + out->start, used);
    free(out->data);
    out->data = data;
    out->cap = cap;
    out->start = 0;
    out->end = used;
    return 1;
}

static int sink_write_ex(BIO *bio, const char *in, size_t len, size_t *written)
{
    OutBuf *out = BIO_get_data(bio);
    *written = 0;
    BIO_clear_retry_flags(bio);
    if (out == NULL || (len > 0 && in == NULL) || !out_reserve(out, len))
        return 0;
    if (len)
        memcpy(out->data + out->end, in, len);
    out->end += len;
    *written = len;
    return 1;
}

static long sink_ctrl(BIO *bio, int cmd, long num, void *ptr)
{
    (void)num;
    (void)ptr;
    OutBuf *out = BIO_get_data(bio);
    switch (cmd) {
    case BIO_CTRL_FLUSH: /* sent by Records after each call, not here */
    case BIO_C_SET_NBIO: /* Python's _ssl sets it on every call; a memory sink never blocks */
        return 1;
    case BIO_CTRL_WPENDING:
        return out ? (long)(out->end - out->start) : 0;
    default:
        return 0;
    }
}

static int sink_create(BIO *bio)
{
    OutBuf *out = calloc(1, sizeof(OutBuf));
    if (out == NULL)
        return 0;
    BIO_set_data(bio, out);
    BIO_set_init(bio, 1);
    return 1;
}

static int sink_destroy(BIO *bio)
{
    OutBuf *out = BIO_get_data(bio);
    if (out != NULL) {
        out_release(out);
        free(out);
        BIO_set_data(bio, NULL);
    }
    return 1;
}

int record_sink_init(void)
{
    if (record_sink_method != NULL)
        return 0;
    int index = BIO_get_new_index();
    BIO_METHOD *method = index < 0 ? NULL : BIO_meth_new(index | BIO_TYPE_SOURCE_SINK, "ambit record sink");
    if (method == NULL || !BIO_meth_set_write_ex(method, sink_write_ex) || !BIO_meth_set_ctrl(method, sink_ctrl) ||
        !BIO_meth_set_create(method, sink_create) || !BIO_meth_set_destroy(method, sink_destroy)) {
        BIO_meth_free(method);
        return -1;
    }
    record_sink_method = method;
    return 0;
}
