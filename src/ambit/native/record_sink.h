/* The output sink of the TLS record path: a BIO that appends OpenSSL's ciphertext to one growing buffer (see
 * record_sink.c). Shared by the C files of the _tls_records extension. */
#ifndef AMBIT_RECORD_SINK_H
#define AMBIT_RECORD_SINK_H

#include <stddef.h>

#include <openssl/bio.h>

#define OUT_KEEP (20 * 1024)      /* an emptied output buffer up to this size is kept for the next write */
#define OUT_MAX ((size_t)1 << 30) /* the most ciphertext held for one connection: past it, writes fail */

/* Ciphertext not sent yet: bytes [start, end) of data, which has room for cap bytes. */
typedef struct {
    char *data;
    size_t start; /* the first byte not yet sent */
    size_t end;   /* one past the last byte */
    size_t cap;
} OutBuf;

/* The sink's BIO_METHOD, made by record_sink_init; BIO_get_data of a sink BIO is its OutBuf. */
extern BIO_METHOD *record_sink_method;

/* Make record_sink_method once per process: 0, or -1 when OpenSSL cannot. */
int record_sink_init(void);

/* Room for len more bytes after what is held: 1, or 0 past OUT_MAX or without memory. */
int out_reserve(OutBuf *out, size_t len);

/* Drop the buffer (kept as a spare for the next large write when small enough); the OutBuf is empty after. */
void out_release(OutBuf *out);

#endif
