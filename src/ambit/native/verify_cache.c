/* A cache of certificate chain verifications for the HBONE contexts (issue 23: the cold handshake).
 *
 * Theory of operation. A node proxy opens new HBONE connections to the same few peers, each presenting the same
 * chain until it rotates its certificate; OpenSSL verifies that chain against the trust store on every handshake
 * (path building, two ECDSA verifications per side, time and purpose checks: about a sixth of a mutual-TLS
 * handshake pair on OpenSSL 3.0). install() puts a verification callback (SSL_CTX_set_cert_verify_callback) on one
 * SSL_CTX: it keys the presented chain by the SSL's role and the SHA-256 of each presented certificate's DER; a chain
 * OpenSSL verified before under the same key is accepted again without X509_verify_cert while every certificate of
 * the chain it was verified into is still within its validity period now, and that verified chain is handed back
 * (X509_STORE_CTX_set0_verified_chain) so SSL_get0_verified_chain and the revocation check that reads it see what a
 * full verification gives. Anything else (a new chain, a cached chain out of its validity period, a chain of more
 * than MAX_CERTS certificates, verification parameters naming a host, an e-mail address or an IP address, a fixed
 * check time or CRL checks) is verified by X509_verify_cert as without the cache, and only a success is kept.
 *
 * Why it proves what a full verification proves: the result of X509_verify_cert for one SSL_CTX is a function of
 * the presented chain, the trust store and the verification parameters (fixed when the context was made: Ambit
 * never changes an HBONE context afterwards, a new root means a new context and so a new cache), the SSL's role
 * (purpose) and the time, which is checked again on every hit. The peer's proof of possession of the leaf's key
 * (CertificateVerify over the handshake) is not part of it: OpenSSL checks it on every handshake, cache or not, so a
 * replayed chain is worth nothing without its key. The cache holds only chains that verified, at most ENTRIES in the
 * process (about 5 KiB each), replaced in turn; a peer cannot make it grow or hold unverified data.
 *
 * Threads: the callback runs inside SSL_do_handshake, with the GIL released by _ssl; the cache has its own lock and
 * touches no Python object. Each context has a number of its own (ex_data, freed with it) that starts its keys.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include "verify_cache.h"

#define ENTRIES 256
#define MAX_CERTS 4
#define KEY_MAX (8 + 1 + MAX_CERTS * 32)

typedef struct {
    unsigned char key[KEY_MAX];
    size_t key_len;
    STACK_OF(X509) *chain; /* as X509_verify_cert built it, leaf first; owned; NULL: a free entry */
} Entry;

/* One per SSL_CTX (ex_data, freed with it): the context's number in the keys, and what it was answered. */
typedef struct {
    uint64_t id;
    unsigned long hits, misses;
} Context;

/* The process's cache, shared by every context: its size bounds the memory whatever the number of contexts (a
 * cached chain holds about 5 KiB: the peer's parsed leaf). Keys start with the context's number, never reused, so
 * an entry of a context that was freed can only age out. */
static struct {
    pthread_mutex_t lock;
    Entry entries[ENTRIES];
    unsigned next; /* the entry the next insertion replaces */
    uint64_t contexts; /* numbers given so far */
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int ex_index = -1;

static void context_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
    (void)parent, (void)ad, (void)idx, (void)argl, (void)argp;
    OPENSSL_free(ptr); /* NULL: nothing */
}

/* Whether this verification may be answered from the cache: parameters that make the result depend on more than
 * the chain, the store and the time (a host, e-mail or IP to match, a fixed time, CRLs in the store) never are. */
static int cacheable(X509_STORE_CTX *store)
{
    X509_VERIFY_PARAM *param = X509_STORE_CTX_get0_param(store);
    if (param == NULL || X509_VERIFY_PARAM_get0_host(param, 0) != NULL || X509_VERIFY_PARAM_get0_email(param) != NULL)
        return 0;
    char *ip = X509_VERIFY_PARAM_get1_ip_asc(param);
    if (ip != NULL) {
        OPENSSL_free(ip);
        return 0;
    }
    unsigned long flags = X509_VERIFY_PARAM_get_flags(param);
    return (flags & (X509_V_FLAG_USE_CHECK_TIME | X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL)) == 0;
}

/* The key of the presented chain: the context's number, the SSL's role, then the SHA-256 of each certificate's DER (the leaf, then the
 * rest the peer sent). 0 when it cannot be made (too many certificates, no SSL, a digest failure). */
static int chain_key(const Context *context, X509_STORE_CTX *store, unsigned char *key, size_t *key_len)
{
    SSL *ssl = X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx());
    X509 *leaf = X509_STORE_CTX_get0_cert(store);
    STACK_OF(X509) *untrusted = X509_STORE_CTX_get0_untrusted(store);
    if (ssl == NULL || leaf == NULL)
        return 0;
    int n = untrusted == NULL ? 0 : sk_X509_num(untrusted);
    if (n < 0 || n > MAX_CERTS)
        return 0;
    size_t at = 0;
    for (int shift = 56; shift >= 0; shift -= 8)
        key[at++] = (unsigned char)(context->id >> shift);
    key[at++] = SSL_is_server(ssl) ? 's' : 'c';
    for (int i = -1; i < n; i++) {
        X509 *cert = i < 0 ? leaf : sk_X509_value(untrusted, i);
        if (i == 0 && cert == leaf)
            continue; /* libssl's untrusted list starts with the leaf itself */
        unsigned int len = 0;
        if (cert == NULL || at + 32 > KEY_MAX || !X509_digest(cert, EVP_sha256(), key + at, &len) || len != 32)
            return 0;
        at += len;
    }
    *key_len = at;
    return 1;
}

/* Whether every certificate of a verified chain is within its validity period now, as X509_verify_cert checks. */
static int still_valid(STACK_OF(X509) *chain)
{
    time_t now = time(NULL);
    int n = sk_X509_num(chain);
    if (n <= 0)
        return 0;
    for (int i = 0; i < n; i++) {
        X509 *cert = sk_X509_value(chain, i);
        if (X509_cmp_time(X509_get0_notBefore(cert), &now) >= 0 || X509_cmp_time(X509_get0_notAfter(cert), &now) <= 0)
            return 0; /* not yet valid, expired, or a time OpenSSL cannot read (0) */
    }
    return 1;
}

/* A copy of a cached chain for one X509_STORE_CTX (the certificates shared, each reference counted). */
static STACK_OF(X509) *share(STACK_OF(X509) *chain)
{
    STACK_OF(X509) *copy = sk_X509_dup(chain);
    if (copy == NULL)
        return NULL;
    for (int i = 0; i < sk_X509_num(copy); i++) {
        if (!X509_up_ref(sk_X509_value(copy, i))) {
            while (--i >= 0)
                X509_free(sk_X509_value(copy, i));
            sk_X509_free(copy);
            return NULL;
        }
    }
    return copy;
}

static int verify(X509_STORE_CTX *store, void *arg)
{
    Context *context = arg;
    unsigned char key[KEY_MAX];
    size_t key_len = 0;
    /* What the probes below push on this thread's error queue (get1_ip_asc says "passed a null parameter" when
     * there is no IP) must not outlive them: libssl would report it on the connection's next read. */
    ERR_set_mark();
    int usable = context != NULL && cacheable(store) && chain_key(context, store, key, &key_len);
    ERR_pop_to_mark();
    if (!usable)
        return X509_verify_cert(store);
    STACK_OF(X509) *found = NULL;
    pthread_mutex_lock(&cache.lock);
    for (unsigned i = 0; i < ENTRIES; i++) {
        Entry *entry = &cache.entries[i];
        if (entry->chain != NULL && entry->key_len == key_len && memcmp(entry->key, key, key_len) == 0) {
            if (still_valid(entry->chain))
                found = share(entry->chain);
            break;
        }
    }
    if (found != NULL)
        context->hits++;
    else
        context->misses++;
    pthread_mutex_unlock(&cache.lock);
    if (found != NULL) {
        X509_STORE_CTX_set0_verified_chain(store, found); /* the store owns it now; libssl copies it for the SSL */
        X509_STORE_CTX_set_error(store, X509_V_OK);
        return 1;
    }
    int ok = X509_verify_cert(store);
    if (ok != 1)
        return ok;
    STACK_OF(X509) *verified = X509_STORE_CTX_get1_chain(store);
    if (verified == NULL)
        return ok; /* out of memory: not cached, the verification stands */
    pthread_mutex_lock(&cache.lock);
    Entry *slot = NULL;
    for (unsigned i = 0; i < ENTRIES && slot == NULL; i++)
        if (cache.entries[i].chain != NULL && cache.entries[i].key_len == key_len &&
            memcmp(cache.entries[i].key, key, key_len) == 0)
            slot = &cache.entries[i]; /* the same chain again (it had expired, or two handshakes raced) */
    if (slot == NULL) {
        slot = &cache.entries[cache.next];
        cache.next = (cache.next + 1) % ENTRIES;
    }
    STACK_OF(X509) *old = slot->chain;
    memcpy(slot->key, key, key_len);
    slot->key_len = key_len;
    slot->chain = verified;
    pthread_mutex_unlock(&cache.lock);
    sk_X509_pop_free(old, X509_free); /* NULL: nothing */
    return ok;
}

int verify_cache_init(void)
{
    if (ex_index < 0)
        ex_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, context_free);
    return ex_index < 0 ? -1 : 0;
}

int verify_cache_install(SSL_CTX *ctx)
{
    if (SSL_CTX_get_ex_data(ctx, ex_index) != NULL)
        return 1; /* already there */
    Context *context = OPENSSL_zalloc(sizeof *context);
    if (context == NULL)
        return 0;
    pthread_mutex_lock(&cache.lock);
    context->id = ++cache.contexts;
    pthread_mutex_unlock(&cache.lock);
    if (!SSL_CTX_set_ex_data(ctx, ex_index, context)) {
        OPENSSL_free(context);
        return 0;
    }
    SSL_CTX_set_cert_verify_callback(ctx, verify, context);
    return 1;
}

int verify_cache_counts(SSL_CTX *ctx, unsigned long *hits, unsigned long *misses)
{
    Context *context = SSL_CTX_get_ex_data(ctx, ex_index);
    if (context == NULL)
        return 0;
    pthread_mutex_lock(&cache.lock);
    *hits = context->hits;
    *misses = context->misses;
    pthread_mutex_unlock(&cache.lock);
    return 1;
}

int verify_cache_entries(void)
{
    return ENTRIES;
}
