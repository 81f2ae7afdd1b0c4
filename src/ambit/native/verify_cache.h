/* A cache of certificate chain verifications for HBONE contexts (verify_cache.c). */
#ifndef AMBIT_VERIFY_CACHE_H
#define AMBIT_VERIFY_CACHE_H

#include <openssl/ssl.h>

/* Once, at module start: the SSL_CTX ex_data index; -1 on failure. */
int verify_cache_init(void);
/* Put the cache on ctx (idempotent); 0 when out of memory. */
int verify_cache_install(SSL_CTX *ctx);
/* The cache's hits and misses so far; 0 when ctx has none. */
int verify_cache_counts(SSL_CTX *ctx, unsigned long *hits, unsigned long *misses);
/* How many chains the process's cache holds at most. */
int verify_cache_entries(void);

#endif
