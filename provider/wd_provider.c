/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wd: an OpenSSL 3 provider that computes AES (ECB, CBC, CTR, XTS, GCM) and
 * SHA-1/SHA-2 through WrapDrive's sec device (libwd_crypto, wd_crypto.h).
 *
 * Unmodified programs use it through -provider wd (openssl speed, enc,
 * dgst) or an openssl.cnf that activates it (see provider/openssl-wd.cnf).
 *
 * Inside an OpenSSL ASYNC_JOB a request is submitted, the job paused with
 * the thread's WrapDrive wait descriptor, and resumed on completion, so
 * `openssl speed -async_jobs N` keeps N requests in flight from one thread.
 *
 * Parameters (environment, else the provider's config section):
 *   threshold  (WD_PROVIDER_THRESHOLD)  requests below it run on the CPU;
 *              0 = none (the policy decides); default: the library's (see wd_crypto.h)
 *   policy     (WD_PROVIDER_POLICY)     auto | offload | cpu
 *   fallback   (WD_PROVIDER_FALLBACK)   1 (default): no host means the CPU;
 *                                       0: requests above the threshold fail
 *   legacy     (WD_CRYPTO_LEGACY=1)     queues through the socket (baseline)
 * The host is $WD_CRYPTO_HOST or $WD_HOST (libwd). Without a host the
 * library computes on the CPU and counts it (wd_crypto_get_stats).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/async.h>
#include <openssl/core.h>
#include <openssl/core_dispatch.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/provider.h>
#include <openssl/proverr.h>

#include "wd.h"
#include "wd_crypto.h"

/* ---- provider context -------------------------------------------------- */

struct wd_prov {
	const OSSL_CORE_HANDLE *handle;
	OSSL_FUNC_core_get_params_fn *core_get_params;
};

/* The inline CPU path: OpenSSL's default provider, loaded into a private
 * library context (never this provider again), called directly through its
 * dispatch table, so a request that stays here pays no second EVP layer.
 * Made at the first lookup, freed by the last provider instance's teardown
 * (no context of any instance is left then), made again by a later one:
 * each load of this module would otherwise leave one behind. */
static OSSL_LIB_CTX *wd_cpu_libctx;
static OSSL_PROVIDER *wd_cpu_prov;
static void *wd_cpu_provctx;
static const OSSL_ALGORITHM *wd_cpu_ciphers;
static const OSSL_ALGORITHM *wd_cpu_digests;
static pthread_mutex_t wd_cpu_lock = PTHREAD_MUTEX_INITIALIZER;
static int wd_cpu_tried; /* read without the lock: acquire, pairs with wd_cpu_init's release */

/* Look the default provider up once per instance set (a failure too: the
 * inline path is then missing, and lookups find nothing). */
static void wd_cpu_init(void)
{
	if (__atomic_load_n(&wd_cpu_tried, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&wd_cpu_lock);
	if (!wd_cpu_tried) {
		OSSL_LIB_CTX *l = OSSL_LIB_CTX_new();
		OSSL_PROVIDER *p = l != NULL ? OSSL_PROVIDER_load(l, "default") : NULL;
		int no_cache = 0;
		if (p != NULL) {
			wd_cpu_ciphers = OSSL_PROVIDER_query_operation(p, OSSL_OP_CIPHER, &no_cache);
			wd_cpu_digests = OSSL_PROVIDER_query_operation(p, OSSL_OP_DIGEST, &no_cache);
			wd_cpu_provctx = OSSL_PROVIDER_get0_provider_ctx(p);
			wd_cpu_prov = p;
			wd_cpu_libctx = l;
		} else {
			OSSL_LIB_CTX_free(l);
		}
		/* Release: pairs with the acquire above, so the pointers are
		 * seen set by a thread that sees the flag. */
		__atomic_store_n(&wd_cpu_tried, 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&wd_cpu_lock);
}

/* The last instance's teardown: nothing of the inline path is in use. */
static void wd_cpu_fini(void)
{
	pthread_mutex_lock(&wd_cpu_lock);
	if (wd_cpu_prov != NULL)
		OSSL_PROVIDER_unload(wd_cpu_prov);
	OSSL_LIB_CTX_free(wd_cpu_libctx);
	wd_cpu_prov = NULL;
	wd_cpu_libctx = NULL;
	wd_cpu_provctx = NULL;
	wd_cpu_ciphers = NULL;
	wd_cpu_digests = NULL;
	__atomic_store_n(&wd_cpu_tried, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&wd_cpu_lock);
}

/* The default provider's functions for one cipher. */
struct wd_cpu_impl {
	OSSL_FUNC_cipher_newctx_fn *newctx;
	OSSL_FUNC_cipher_freectx_fn *freectx;
	OSSL_FUNC_cipher_dupctx_fn *dupctx;
	OSSL_FUNC_cipher_encrypt_init_fn *einit;
	OSSL_FUNC_cipher_decrypt_init_fn *dinit;
	OSSL_FUNC_cipher_cipher_fn *cipher;
	OSSL_FUNC_cipher_update_fn *update;
	OSSL_FUNC_cipher_final_fn *final;
	OSSL_FUNC_cipher_get_ctx_params_fn *get_ctx_params;
	OSSL_FUNC_cipher_set_ctx_params_fn *set_ctx_params;
};

/* Does `names` ("A:B:C") list `name` (case-insensitively)? */
static int wd_names_have(const char *names, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = names; p != NULL && *p != '\0';) {
		const char *end = strchr(p, ':');
		size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
		if (len == n && OPENSSL_strncasecmp(p, name, n) == 0)
			return 1;
		p = end != NULL ? end + 1 : NULL;
	}
	return 0;
}

static int wd_cpu_lookup(const char *name, struct wd_cpu_impl *impl)
{
	wd_cpu_init();
	memset(impl, 0, sizeof(*impl));
	for (const OSSL_ALGORITHM *a = wd_cpu_ciphers; a != NULL && a->algorithm_names != NULL; a++) {
		if (!wd_names_have(a->algorithm_names, name))
			continue;
		for (const OSSL_DISPATCH *f = a->implementation; f->function_id != 0; f++) {
			switch (f->function_id) {
			case OSSL_FUNC_CIPHER_NEWCTX: impl->newctx = OSSL_FUNC_cipher_newctx(f); break;
			case OSSL_FUNC_CIPHER_FREECTX: impl->freectx = OSSL_FUNC_cipher_freectx(f); break;
			case OSSL_FUNC_CIPHER_DUPCTX: impl->dupctx = OSSL_FUNC_cipher_dupctx(f); break;
			case OSSL_FUNC_CIPHER_ENCRYPT_INIT: impl->einit = OSSL_FUNC_cipher_encrypt_init(f); break;
			case OSSL_FUNC_CIPHER_DECRYPT_INIT: impl->dinit = OSSL_FUNC_cipher_decrypt_init(f); break;
			case OSSL_FUNC_CIPHER_CIPHER: impl->cipher = OSSL_FUNC_cipher_cipher(f); break;
			case OSSL_FUNC_CIPHER_UPDATE: impl->update = OSSL_FUNC_cipher_update(f); break;
			case OSSL_FUNC_CIPHER_FINAL: impl->final = OSSL_FUNC_cipher_final(f); break;
			case OSSL_FUNC_CIPHER_GET_CTX_PARAMS:
				impl->get_ctx_params = OSSL_FUNC_cipher_get_ctx_params(f);
				break;
			case OSSL_FUNC_CIPHER_SET_CTX_PARAMS:
				impl->set_ctx_params = OSSL_FUNC_cipher_set_ctx_params(f);
				break;
			}
		}
		return impl->newctx && impl->freectx && impl->einit && impl->dinit && impl->cipher &&
		       impl->update && impl->final && impl->get_ctx_params && impl->set_ctx_params;
	}
	return 0;
}

/* Requests computed inline are counted in their context (one thread at a
 * time uses it) and handed to libwd's counters in batches, so
 * wd_crypto_get_stats shows them. */
struct wd_counts {
	uint64_t req[5], bytes[5];
};

/* Cold and out of line: the fast paths that count stay free of the saves
 * a call needs. */
static __attribute__((noinline, cold)) void wd_flush_counts(struct wd_counts *c)
{
	for (int r = 1; r <= 4; r++) {
		/* (Bytes alone too: an inline GCM message's come with its
		 * updates, after its request was counted and maybe handed
		 * over.) */
		if (c->req[r] != 0 || c->bytes[r] != 0) {
			wd_crypto_count_cpu(c->req[r], c->bytes[r], r);
			c->req[r] = c->bytes[r] = 0;
		}
	}
}

/* Count a request, handing the counts over every 4096. */
static inline void wd_count(struct wd_counts *c, size_t bytes, int reason)
{
	c->req[reason]++;
	c->bytes[reason] += bytes;
	if (c->req[reason] >= 4096)
		wd_flush_counts(c);
}

static uint64_t wd_now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int wd_async_key; /* address used as the ASYNC_WAIT_CTX key */

/* The library's CPU fallback setting, read once the provider set it (at
 * init): asked on every async job otherwise. */
static int wd_fallback_on = 1;

/* Report a libwd failure through OpenSSL's error queue (what `openssl`
 * prints), with libwd's own message; returns 0 (failure) for the caller. */
static int wd_fail(int rc)
{
	char msg[256];
	wd_last_error(msg, sizeof msg);
	ERR_raise_data(ERR_LIB_PROV, ERR_R_OPERATION_FAIL, "WrapDrive: %s (%s)", msg, wd_strerror(rc));
	return 0;
}

/* Give the current async job's wait context this thread's WrapDrive wait
 * descriptor (once; again if the queue behind it changed). */
static int wd_register_wait_fd(void)
{
	ASYNC_JOB *aj = ASYNC_get_current_job();
	if (aj == NULL)
		return 0;
	ASYNC_WAIT_CTX *wctx = ASYNC_get_wait_ctx(aj);
	int fd = wd_crypto_wait_fd();
	if (fd < 0)
		return 0;
	OSSL_ASYNC_FD cur;
	void *custom;
	if (!ASYNC_WAIT_CTX_get_fd(wctx, &wd_async_key, &cur, &custom) || cur != fd) {
		ASYNC_WAIT_CTX_clear_fd(wctx, &wd_async_key);
		if (!ASYNC_WAIT_CTX_set_wait_fd(wctx, &wd_async_key, fd, NULL, NULL))
			return 0;
	}
	return 1;
}

/* This thread's async jobs paused on the device: while there are none, a
 * request computed inline has no one to keep woken (see wd_blocks). */
static __thread unsigned wd_jobs_waiting;

/* Inside an async job whose request finished without pausing (computed
 * here: this thread's paused jobs held the staging) while other jobs
 * wait on the device: when their completions are in, pause so that the
 * application resumes them. They give the staging back and send more;
 * going on here instead would leave the device idle until this job's
 * loop ends (openssl speed's jobs then ran on the CPU alone). */
static void wd_yield(void)
{
	if (wd_jobs_waiting == 0 || wd_crypto_after_inline() != 1 || !wd_register_wait_fd())
		return;
	/* No completion of its own wakes it, and another wait may drain the
	 * descriptor first: held readable until it is resumed. */
	if (wd_crypto_hold_readable(1) != 0)
		return;
	ASYNC_pause_job();
	wd_crypto_hold_readable(0);
	wd_crypto_disarm();
	/* Left armed for the others, or readable if their results are in. */
	wd_crypto_arm();
}

static int wd_finish_job_in(struct wd_job *job, int *paused);

/* Wait, inside an async job, for `job` to finish; outside one, block. */
static int wd_finish_job(struct wd_job *job)
{
	if (ASYNC_get_current_job() == NULL)
		return wd_job_wait(job);
	wd_jobs_waiting++;
	int paused = 0;
	int r = wd_finish_job_in(job, &paused);
	wd_jobs_waiting--;
	/* Finished at once (a long one the library computed here, finding
	 * the staging held): the others' turn, if their results are in. */
	if (!paused)
		wd_yield();
	return r;
}

static int wd_finish_job_in(struct wd_job *job, int *paused)
{
	for (;;) {
		int r = wd_job_poll(job);
		if (r != -EAGAIN) {
			/* Other jobs of this thread may wait on the same descriptor:
			 * leave it armed, or readable if their completions were
			 * reaped meanwhile, so none of them sleeps through its own. */
			wd_crypto_arm();
			return r;
		}
		if (!wd_register_wait_fd())
			return wd_job_wait(job);
		/* Armed, or already ready (then the fd was made readable). */
		if (wd_crypto_arm() < 0)
			return wd_job_wait(job);
		*paused = 1;
		ASYNC_pause_job();
		wd_crypto_disarm();
	}
}

/* ---- ciphers ------------------------------------------------------------ */

struct wd_cipher_desc {
	const char *name;   /* wd algorithm name */
	unsigned int mode;  /* EVP_CIPH_*_MODE */
	size_t keylen, ivlen, blocksize;
};

struct wd_cctx {
	struct wd_prov *prov;
	const struct wd_cipher_desc *d;
	struct wd_cipher *c;  /* ECB, CBC, CTR, XTS */
	/* The fast path's gate and counts (wd_cipher_update_fn), beside the
	 * inline context it calls: requests below fast_below whose length has
	 * none of fast_mask's bits run inline at once. wd_fast_refresh sets
	 * the gate on the way out of every other entry point, from everything
	 * it stands for (0 closes it). fast_left counts down the requests the
	 * fast path may run before its counts are handed over. whole_here:
	 * whether a request of any size would run inline whole. */
	size_t fast_below, fast_mask, fast_left, fast_bytes;
	int whole_here;
	/* The second gate, wd_cipher_update_reused's: a synchronous
	 * CPU answer of the router being reused (memo.left) for requests of
	 * lengths in [reuse_from, reuse_from + reuse_span) that would run
	 * inline whole, so that they skip the rest of the way there too.
	 * wd_fast_refresh sets it with the fast path's gate (span 0 closes). */
	size_t reuse_from, reuse_span;
	/* The inline CPU path (ECB, CBC, CTR, XTS): a default-provider context
	 * of the same key, and whether it holds the stream's chain now (else
	 * the session c does). */
	void *inner;                 /* the default provider's context */
	struct wd_cpu_impl impl;
	int chain_here;
	struct wd_counts counts;
	/* The library's threshold, policy and router, inline (wd_crypto.h). */
	struct wd_route_memo memo;
	struct wd_aead *a;    /* GCM */
	int enc, pad, key_set, iv_set;
	unsigned char key[64];
	unsigned char iv[16];
	unsigned char oiv[16]; /* the IV the caller gave (OSSL_CIPHER_PARAM_IV) */
	size_t ivlen;
	unsigned char updated_iv[16]; /* what "updated-iv" last answered */
	/* ECB/CBC: partial block kept between updates */
	unsigned char buf[16];
	size_t buflen;
	/* GCM */
	unsigned char tag[16];
	size_t taglen;
	int gcm_started;
	/* The IV has served a message to its end: the next one needs a new
	 * IV (the same IV again is the same keystream), as OpenSSL's own GCM
	 * refuses (IV_STATE_FINISHED). */
	int gcm_iv_spent;
	int gcm_inline;          /* the message under way runs in `inner` */
	int gcm_timed;           /* ... and its data is timed for the router */
	int gcm_why;             /* ... and counted under this WD_CPU_* reason */
	int tag_ready;           /* `tag` holds an encryption's computed tag */
	/* A decryption has its expected tag in `tag`: given by SET_TAG, or
	 * left by an encryption, as the default provider keeps it. */
	int tag_given;
	int gcm_inner_keyed;     /* `inner` holds the current key */
	unsigned char gaad[256]; /* AAD held until the path is decided */
	size_t gaad_len;
	/* TLS 1.2 record protection (libssl sets the record-layer parameters:
	 * GCM's fixed IV and explicit nonce, the CBC record's MAC size and
	 * version for constant-time padding and MAC removal): the whole
	 * context is handed to the default provider's implementation, which
	 * does exactly that, and every later call goes there. */
	void *tls;
	struct wd_cpu_impl tls_impl;
};

/* Requests the fast path runs between two hand-overs of its counts. */
#define WD_FAST_BATCH 4096

/* Open the fast path's gate exactly when a request below the threshold
 * would run inline whole, in one call of OpenSSL's own update: nothing
 * buffered, the chain here, whole blocks where the mode needs them (and
 * no final block held back for padding). */
static void wd_fast_refresh(struct wd_cctx *x)
{
	int mode = x->d->mode;
	int blocks = mode == EVP_CIPH_CBC_MODE || mode == EVP_CIPH_ECB_MODE;
	x->whole_here = x->tls == NULL && x->buflen == 0 && x->inner != NULL && x->chain_here &&
			(mode == EVP_CIPH_CTR_MODE || (blocks && (x->enc || !x->pad)));
	/* Below the bits the gate sets for a partial block or a spent budget. */
	size_t cap = (size_t)1 << 59;
	x->fast_below = !x->whole_here ? 0 : x->memo.threshold < cap ? x->memo.threshold : cap;
	x->fast_mask = blocks ? 15 : 0;
	/* Not an asynchronous answer: computing here while this thread's
	 * jobs wait on the device needs wd_crypto_after_inline. */
	int reuse = x->whole_here && x->memo.left > 0 && !x->memo.async &&
		    !(x->memo.route & WD_ROUTE_DEVICE);
	x->reuse_from = x->memo.from;
	x->reuse_span = reuse ? x->memo.span : 0;
}

/* Hand the fast path's counts (all below the threshold) to libwd. */
static void wd_fast_flush(struct wd_cctx *x)
{
	x->counts.req[WD_CPU_THRESHOLD] += WD_FAST_BATCH - x->fast_left;
	x->counts.bytes[WD_CPU_THRESHOLD] += x->fast_bytes;
	x->fast_left = WD_FAST_BATCH;
	x->fast_bytes = 0;
	wd_flush_counts(&x->counts);
}

static void *wd_cipher_newctx(void *provctx, const struct wd_cipher_desc *d)
{
	struct wd_cctx *x = OPENSSL_zalloc(sizeof(*x));
	if (x == NULL)
		return NULL;
	x->prov = provctx;
	x->d = d;
	x->pad = 1;
	x->ivlen = d->ivlen;
	x->taglen = 16;
	x->fast_left = WD_FAST_BATCH;
	wd_route_memo_init(&x->memo);
	return x;
}

static void wd_cipher_freectx(void *vctx)
{
	struct wd_cctx *x = vctx;
	if (x == NULL)
		return;
	if (x->c)
		wd_cipher_free(x->c);
	if (x->a)
		wd_aead_free(x->a);
	if (x->inner != NULL)
		x->impl.freectx(x->inner);
	if (x->tls != NULL)
		x->tls_impl.freectx(x->tls);
	wd_fast_flush(x);
	OPENSSL_clear_free(x, sizeof(*x));
}

static void *wd_cipher_dupctx(void *vctx)
{
	struct wd_cctx *x = vctx, *n;
	if (x->gcm_started && !x->gcm_inline && x->tls == NULL)
		return NULL; /* this GCM message's state lives in the device */
	n = OPENSSL_memdup(x, sizeof(*x));
	if (n == NULL)
		return NULL;
	n->c = NULL;
	n->a = NULL;
	n->inner = NULL;
	n->tls = NULL;
	memset(&n->counts, 0, sizeof n->counts);
	n->fast_below = 0;
	n->reuse_span = 0;
	n->whole_here = 0;
	n->fast_left = WD_FAST_BATCH;
	n->fast_bytes = 0;
	if (x->tls != NULL) {
		/* Everything is in the default provider's context. */
		if (x->tls_impl.dupctx == NULL || (n->tls = x->tls_impl.dupctx(x->tls)) == NULL)
			goto fail;
		return n;
	}
	if (x->inner != NULL) {
		if (x->impl.dupctx == NULL || (n->inner = x->impl.dupctx(x->inner)) == NULL)
			goto fail;
	}
	if (x->key_set) {
		if (x->d->mode == EVP_CIPH_GCM_MODE) {
			if (wd_aead_new(&n->a, x->d->name, x->key, x->d->keylen) != 0)
				goto fail;
		} else {
			if (wd_cipher_new(&n->c, x->d->name, x->key, x->d->keylen, x->enc) != 0)
				goto fail;
			/* The whole chain, CTR's place in its block too: the IV
			 * alone starts the copy's next request at a block's start. */
			int chained = x->d->mode == EVP_CIPH_CBC_MODE || x->d->mode == EVP_CIPH_CTR_MODE;
			unsigned char iv[16];
			size_t num = 0;
			if (x->iv_set && chained && !x->chain_here &&
			    (wd_cipher_get_chain(x->c, iv, &num) != 0 || wd_cipher_set_chain(n->c, iv, num) != 0))
				goto fail;
			if (x->iv_set && x->d->mode == EVP_CIPH_XTS_MODE &&
			    wd_cipher_set_iv(n->c, x->iv, x->d->ivlen) != 0)
				goto fail;
		}
	}
	wd_fast_refresh(n);
	return n;
fail:
	wd_cipher_freectx(n);
	return NULL;
}

static int wd_cipher_set_params(struct wd_cctx *x, const OSSL_PARAM params[]);
static int wd_tls_begin(struct wd_cctx *x);
static void wd_chain_now(struct wd_cctx *x, unsigned char iv[16], unsigned int *num);
static void wd_params_find(const OSSL_PARAM *params, const char *const names[], size_t n,
			   const OSSL_PARAM *found[]);

/* The TLS record-layer parameters: any of them hands the context over to
 * the default provider (wd_tls_begin). */
static const char *const wd_tls_param_names[] = {
	OSSL_CIPHER_PARAM_AEAD_TLS1_AAD,	OSSL_CIPHER_PARAM_AEAD_TLS1_IV_FIXED,
	OSSL_CIPHER_PARAM_AEAD_TLS1_GET_IV_GEN, OSSL_CIPHER_PARAM_AEAD_TLS1_SET_IV_INV,
	OSSL_CIPHER_PARAM_TLS_VERSION,		OSSL_CIPHER_PARAM_TLS_MAC_SIZE,
	OSSL_CIPHER_PARAM_TLS1_MULTIBLOCK_MAX_SEND_FRAGMENT,
};
#define WD_TLS_PARAMS (sizeof wd_tls_param_names / sizeof *wd_tls_param_names)

/* Start the inline context on `iv` (key when given), padding off. */
static int wd_inner_iv(struct wd_cctx *x, const unsigned char *key, size_t keylen,
		       const unsigned char *iv)
{
	unsigned int pad = 0;
	OSSL_PARAM params[] = {OSSL_PARAM_construct_uint(OSSL_CIPHER_PARAM_PADDING, &pad),
			       OSSL_PARAM_construct_end()};
	size_t ivlen = iv != NULL ? x->d->ivlen : 0;
	return x->enc ? x->impl.einit(x->inner, key, keylen, iv, ivlen, params)
		      : x->impl.dinit(x->inner, key, keylen, iv, ivlen, params);
}

static int wd_inner_start(struct wd_cctx *x, const unsigned char *key, size_t keylen)
{
	const unsigned char *iv = x->iv_set && x->d->ivlen > 0 ? x->iv : NULL;
	return wd_inner_iv(x, key, keylen, iv);
}

/* Run the inline context: the default provider's own cipher function. */
static int wd_inner_run(struct wd_cctx *x, unsigned char *out, const unsigned char *in, size_t len)
{
	size_t outl = 0;
	return x->impl.cipher(x->inner, out, &outl, len, in, len) && outl == len;
}

/* (Re)start the inline context from the key, IV and direction; the chain is
 * then here. Without the default provider's functions, everything goes
 * through libwd (which has its own CPU path). */
static int wd_inner_init(struct wd_cctx *x)
{
	if (x->d->mode == EVP_CIPH_GCM_MODE || !x->key_set)
		return 1;
	if (x->inner == NULL) {
		if (!wd_cpu_lookup(x->d->name, &x->impl))
			return 1; /* no inline path: libwd computes */
		x->inner = x->impl.newctx(wd_cpu_provctx);
		if (x->inner == NULL)
			return 0;
	}
	if (!wd_inner_start(x, x->key, x->d->keylen))
		return 0;
	x->chain_here = 1;
	return 1;
}

/* Hand the chain from the inline context to the session (before a request
 * goes to the device). */
static int wd_chain_to_session(struct wd_cctx *x)
{
	if (!x->chain_here)
		return 1;
	x->chain_here = 0;
	if (x->d->mode != EVP_CIPH_CBC_MODE && x->d->mode != EVP_CIPH_CTR_MODE)
		return 1;
	unsigned char iv[16];
	unsigned int unum = 0;
	OSSL_PARAM params[] = {
		OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_UPDATED_IV, iv, sizeof iv),
		OSSL_PARAM_construct_uint(OSSL_CIPHER_PARAM_NUM, &unum), OSSL_PARAM_construct_end()};
	if (!x->impl.get_ctx_params(x->inner, params))
		return 0;
	int num = (int)unum;
	if (x->d->mode == EVP_CIPH_CTR_MODE && num > 0) {
		/* libcrypto's counter already names the next block. */
		for (int i = 15; i >= 0 && iv[i]-- == 0; i--)
			;
	} else {
		num = 0;
	}
	return wd_cipher_set_chain(x->c, iv, (size_t)num) == 0;
}

/* Take the chain back from the session into the inline context. */
static int wd_chain_from_session(struct wd_cctx *x)
{
	if (x->chain_here)
		return 1;
	x->chain_here = 1;
	if (x->d->mode != EVP_CIPH_CBC_MODE && x->d->mode != EVP_CIPH_CTR_MODE)
		return 1;
	unsigned char iv[16];
	size_t num = 0;
	if (wd_cipher_get_chain(x->c, iv, &num) != 0 || !wd_inner_iv(x, NULL, 0, iv))
		return 0;
	if (num > 0) {
		unsigned char burn[16] = {0};
		if (!wd_inner_run(x, burn, burn, num))
			return 0;
	}
	return 1;
}

static int wd_cipher_init(struct wd_cctx *x, const unsigned char *key, size_t keylen,
			  const unsigned char *iv, size_t ivlen, const OSSL_PARAM params[], int enc)
{
	x->enc = enc;
	/* An init that brings TLS record-layer parameters is handed over
	 * before anything of it applies, and then goes there whole: taking
	 * them first handed over the previous key and IV (or none) and applied
	 * this init's key here, where it no longer counts. */
	if (x->tls == NULL && params != NULL) {
		const OSSL_PARAM *tls[WD_TLS_PARAMS];
		wd_params_find(params, wd_tls_param_names, WD_TLS_PARAMS, tls);
		for (size_t i = 0; i < WD_TLS_PARAMS; i++)
			if (tls[i] != NULL) {
				if (!wd_tls_begin(x))
					return 0;
				break;
			}
	}
	if (x->tls != NULL)
		return enc ? x->tls_impl.einit(x->tls, key, keylen, iv, ivlen, params)
			   : x->tls_impl.dinit(x->tls, key, keylen, iv, ivlen, params);
	x->buflen = 0;
	/* CTR without a new IV goes on from where its stream is, at the next
	 * block, with the same key or a new one, as the default provider's
	 * running counter does: restarting from the IV reused its keystream. */
	unsigned char ctr_next[16];
	if (iv == NULL && x->d->mode == EVP_CIPH_CTR_MODE && x->iv_set && x->key_set) {
		unsigned int num;
		wd_chain_now(x, ctr_next, &num);
		iv = ctr_next;
		ivlen = sizeof ctr_next;
	}
	/* The same key again (openssl speed and record layers re-key each
	 * message): keep the session and the schedules. */
	if (key != NULL && x->key_set && keylen == x->d->keylen && CRYPTO_memcmp(key, x->key, keylen) == 0)
		key = NULL;
	if (key != NULL) {
		if (keylen != x->d->keylen) {
			ERR_raise_data(ERR_LIB_PROV, 105, "key length %zu, expected %zu", keylen, x->d->keylen);
			return 0;
		}
		memcpy(x->key, key, keylen);
		x->gcm_inner_keyed = 0;
		if (x->c) {
			wd_cipher_free(x->c);
			x->c = NULL;
		}
		if (x->a) {
			wd_aead_free(x->a);
			x->a = NULL;
		}
		int r = x->d->mode == EVP_CIPH_GCM_MODE
				? wd_aead_new(&x->a, x->d->name, key, keylen)
				: wd_cipher_new(&x->c, x->d->name, key, keylen, enc);
		if (r != 0) {
			ERR_raise_data(ERR_LIB_PROV, 105, "wd: %s", wd_strerror(r));
			return 0;
		}
		x->key_set = 1;
	} else if (x->c != NULL && wd_cipher_set_encrypt(x->c, enc) != 0) {
		return 0;
	}
	if (iv != NULL) {
		if (x->d->mode == EVP_CIPH_GCM_MODE) {
			if (ivlen == 0 || ivlen > 16) {
				/* Not the old IV either, for a caller that goes on. */
				x->gcm_iv_spent = 1;
				return 0;
			}
			x->ivlen = ivlen;
		} else if (ivlen < x->d->ivlen) {
			return 0;
		}
		memcpy(x->iv, iv, x->d->mode == EVP_CIPH_GCM_MODE ? ivlen : x->d->ivlen);
		/* CTR going on from its counter keeps the original IV. */
		if (iv != ctr_next)
			memcpy(x->oiv, x->iv, sizeof x->oiv);
		x->iv_set = 1;
		x->gcm_iv_spent = 0;
		x->gcm_started = 0;
		x->gaad_len = 0;
	}
	if (x->c != NULL && x->iv_set && x->d->ivlen > 0 && x->d->mode != EVP_CIPH_XTS_MODE &&
	    (iv != NULL || key != NULL)) {
		if (wd_cipher_set_iv(x->c, x->iv, x->d->ivlen) != 0)
			return 0;
	}
	if (!wd_inner_init(x))
		return 0;
	/* Parameters after the key and IV, as OpenSSL's own ciphers take them
	 * (an IV length given here applies to the IV already given). */
	return wd_cipher_set_params(x, params);
}

static int wd_encrypt_init(void *vctx, const unsigned char *key, size_t keylen,
			   const unsigned char *iv, size_t ivlen, const OSSL_PARAM params[])
{
	int r = wd_cipher_init(vctx, key, keylen, iv, ivlen, params, 1);
	wd_fast_refresh(vctx);
	return r;
}

static int wd_decrypt_init(void *vctx, const unsigned char *key, size_t keylen,
			   const unsigned char *iv, size_t ivlen, const OSSL_PARAM params[])
{
	int r = wd_cipher_init(vctx, key, keylen, iv, ivlen, params, 0);
	wd_fast_refresh(vctx);
	return r;
}

/* Whole blocks (or any length for CTR, one data unit for XTS) through the
 * library: asynchronously inside an async job, else synchronously. */
static int wd_blocks(struct wd_cctx *x, unsigned char *out, const unsigned char *in, size_t len)
{
	if (len == 0)
		return 1;
	int in_job = ASYNC_get_current_job() != NULL;
	/* Without an inline path the library routes (and counts) itself. */
	int route = x->inner != NULL ? wd_route_memo_route(&x->memo, WD_KIND_CIPHER, len, in_job)
				     : WD_ROUTE_DEVICE;
	if (!(route & WD_ROUTE_DEVICE) && x->inner != NULL) {
		/* Inline: straight to OpenSSL's default implementation. */
		uint64_t t0 = route & WD_ROUTE_TIMED ? wd_now_ns() : 0;
		if (!wd_chain_from_session(x))
			return 0;
		if (x->d->mode == EVP_CIPH_XTS_MODE && !wd_inner_iv(x, NULL, 0, x->iv))
			return 0;
		if (!wd_inner_run(x, out, in, len))
			return 0;
		wd_count(&x->counts, len, route & 0xff);
		if (t0 != 0)
			wd_crypto_record(WD_KIND_CIPHER, len, 1, wd_now_ns() - t0);
		/* Computed here while other jobs of this thread may wait on the
		 * device: leave the wait descriptor armed for them, or readable
		 * if their results came in (this job may finish without pausing). */
		if (wd_jobs_waiting > 0)
			wd_crypto_after_inline();
		return 1;
	}
	if (x->inner != NULL && !wd_chain_to_session(x))
		return 0;
	if (x->d->mode == EVP_CIPH_XTS_MODE && wd_cipher_set_iv(x->c, x->iv, 16) != 0)
		return 0;
	if (in_job) {
		/* The chain before the request: a job lost with its host is
		 * redone here from it, as the library redoes a synchronous
		 * request (the input is intact: the job's was staged). */
		unsigned char saved[16];
		size_t saved_num = 0;
		int chained = x->d->mode == EVP_CIPH_CBC_MODE || x->d->mode == EVP_CIPH_CTR_MODE;
		int can_redo = x->inner != NULL && in != out && wd_fallback_on &&
			       (!chained || wd_cipher_get_chain(x->c, saved, &saved_num) == 0);
		struct wd_job *job = NULL;
		int r = x->inner != NULL ? wd_cipher_start_offload(x->c, in, out, len, &job)
					 : wd_cipher_start(x->c, in, out, len, &job);
		if (r == -EAGAIN) {
			/* Every staging slot is held by this thread's paused
			 * jobs (nothing was sent): as a synchronous request
			 * would be, computed here by the library. */
			r = x->inner != NULL ? wd_cipher_offload(x->c, in, out, len)
					     : wd_cipher_update(x->c, in, out, len);
			job = NULL;
		}
		if (r == 0 && job != NULL) {
			r = wd_finish_job(job);
			if (r == -ENOTCONN && can_redo) {
				x->chain_here = 1;
				int ok = chained ? wd_inner_iv(x, NULL, 0, saved)
						 : x->d->mode != EVP_CIPH_XTS_MODE ||
							   wd_inner_iv(x, NULL, 0, x->iv);
				unsigned char burn[16] = {0};
				if (ok && saved_num > 0)
					ok = wd_inner_run(x, burn, burn, saved_num);
				if (ok && wd_inner_run(x, out, in, len)) {
					wd_count(&x->counts, len, WD_CPU_HOST_GONE);
					r = 0;
				}
			}
		} else if (r == 0) {
			wd_yield(); /* computed at once: the others' turn */
		} else if (wd_jobs_waiting > 0) {
			wd_crypto_after_inline(); /* keep the others woken */
		}
		return r == 0 || wd_fail(r);
	}
	/* Routed already (or no inline path): the session's own routing
	 * decides only when this provider could not. */
	uint64_t t0 = route & WD_ROUTE_TIMED ? wd_now_ns() : 0;
	int r = x->inner != NULL ? wd_cipher_offload(x->c, in, out, len)
				  : wd_cipher_update(x->c, in, out, len);
	if (r != 0)
		return wd_fail(r);
	if (t0 != 0)
		wd_crypto_record(WD_KIND_CIPHER, len, 0, wd_now_ns() - t0);
	return 1;
}

/* Begin a GCM message whose first data (or large AAD) is `len` bytes:
 * below the threshold or with the cpu policy inline, in the default
 * provider's GCM context, else through libwd; the AAD held so far goes
 * first. A message keeps its path (GCM's state cannot move). */
static int wd_gcm_begin(struct wd_cctx *x, size_t len)
{
	if (!x->iv_set || x->gcm_iv_spent)
		return 0;
	/* A GCM message on the device is waited for (never paused), so it is
	 * routed as a synchronous request. */
	int route = wd_route_memo_route(&x->memo, WD_KIND_AEAD, len, 0);
	int why = route & WD_ROUTE_DEVICE ? 0 : route & 0xff;
	int here = why != 0;
	if (here && x->inner == NULL && wd_cpu_lookup(x->d->name, &x->impl))
		x->inner = x->impl.newctx(wd_cpu_provctx);
	x->gcm_inline = here && x->inner != NULL;
	/* The device path times itself (libwd routes the message again). */
	x->gcm_timed = x->gcm_inline && (route & WD_ROUTE_TIMED);
	int ok;
	if (x->gcm_inline) {
		/* The key once (its schedule and GHASH tables stay), the IV per
		 * message. */
		const unsigned char *key = x->gcm_inner_keyed ? NULL : x->key;
		ok = (x->enc ? x->impl.einit : x->impl.dinit)(x->inner, key, x->d->keylen, x->iv,
							     x->ivlen, NULL);
		x->gcm_inner_keyed = ok;
		size_t o = 0;
		if (ok && x->gaad_len > 0)
			ok = x->impl.update(x->inner, NULL, &o, x->gaad_len, x->gaad, x->gaad_len);
		/* One request per message; its bytes as its data comes
		 * (wd_gcm_update): all of them, not the first update's. */
		x->gcm_why = why;
		if (ok)
			wd_count(&x->counts, 0, why);
	} else {
		ok = wd_aead_begin(x->a, x->enc, x->iv, x->ivlen) == 0 &&
		     (x->gaad_len == 0 || wd_aead_aad(x->a, x->gaad, x->gaad_len) == 0);
	}
	x->gaad_len = 0;
	x->gcm_started = ok;
	x->tag_ready = 0;
	return ok;
}

static int wd_gcm_update(struct wd_cctx *x, unsigned char *out, size_t *outl,
			 const unsigned char *in, size_t inl)
{
	if (x->gcm_iv_spent)
		return 0;
	if (!x->gcm_started) {
		/* AAD comes before the data that decides the path: hold it
		 * while it is small. */
		if (out == NULL && x->gaad_len + inl <= sizeof x->gaad) {
			memcpy(x->gaad + x->gaad_len, in, inl);
			x->gaad_len += inl;
			*outl = inl;
			return 1;
		}
		if (!wd_gcm_begin(x, out == NULL ? x->gaad_len + inl : inl))
			return 0;
	}
	if (x->gcm_inline) {
		if (out != NULL)
			x->counts.bytes[x->gcm_why] += inl;
		if (!x->gcm_timed || out == NULL)
			return x->impl.update(x->inner, out, outl, inl, in, inl);
		uint64_t t0 = wd_now_ns();
		int ok = x->impl.update(x->inner, out, outl, inl, in, inl);
		if (ok && inl > 0) {
			/* One sample per decision: a long message is not timed
			 * on every update. */
			wd_crypto_record(WD_KIND_AEAD, inl, 1, wd_now_ns() - t0);
			x->gcm_timed = 0;
		}
		return ok;
	}
	if (out == NULL) { /* AAD */
		*outl = inl;
		return wd_aead_aad(x->a, in, inl) == 0;
	}
	*outl = inl;
	return wd_aead_update(x->a, in, out, inl) == 0;
}

/* Finish an inline GCM message: the expected tag in first (decryption),
 * the computed one out (encryption). */
static int wd_gcm_finish_inline(struct wd_cctx *x)
{
	unsigned char none[16];
	size_t o = 0;
	if (!x->enc) {
		if (x->taglen < 4)
			return 0;
		OSSL_PARAM set[] = {OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG,
								      x->tag, x->taglen),
				    OSSL_PARAM_construct_end()};
		if (!x->impl.set_ctx_params(x->inner, set))
			return 0;
		return x->impl.final(x->inner, none, &o, sizeof none);
	}
	if (!x->impl.final(x->inner, none, &o, sizeof none))
		return 0;
	OSSL_PARAM get[] = {OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, x->tag,
							      sizeof x->tag),
			    OSSL_PARAM_construct_end()};
	return x->impl.get_ctx_params(x->inner, get);
}

/* End the GCM message: compute the tag (encryption) or check it
 * (decryption: a wrong tag fails). */
static int wd_gcm_final(struct wd_cctx *x)
{
	if (x->gcm_iv_spent)
		return 0;
	/* Nothing to check against yet: the message stays under way, and
	 * the caller may set the tag and finish again (as with the default
	 * provider). */
	if (!x->enc && !x->tag_given) {
		ERR_raise_data(ERR_LIB_PROV, ERR_R_PASSED_INVALID_ARGUMENT,
			       "WrapDrive: no tag set for this GCM decryption");
		return 0;
	}
	if (!x->gcm_started && !wd_gcm_begin(x, 0))
		return 0;
	int ok;
	if (x->gcm_inline) {
		ok = wd_gcm_finish_inline(x);
	} else {
		/* An encryption's whole tag, as the default provider makes it:
		 * a tag length left by an earlier decryption must not leave
		 * stale bytes for GET_TAG. */
		int r = x->taglen < 4 && !x->enc
				? -EINVAL
				: wd_aead_finish(x->a, x->tag, x->enc ? sizeof x->tag : x->taglen);
		/* Refused before it was sent (every staging slot of this
		 * thread held by its paused jobs; a message of another
		 * thread): still under way, to be finished again. */
		if (r == -EAGAIN || r == -EBADFD)
			return wd_fail(r);
		ok = r == 0;
	}
	/* Spent whether or not a tag checks: the message is over either way
	 * (its state is gone from the device session). */
	x->gcm_started = 0;
	x->gcm_iv_spent = 1;
	x->tag_ready = ok && x->enc;
	x->tag_given |= x->tag_ready;
	/* An encryption's tag is whole (16 bytes), as the default provider
	 * then reports it and checks a later decryption without SET_TAG
	 * against it: not a length an earlier decryption left. */
	if (x->tag_ready)
		x->taglen = sizeof x->tag;
	return ok;
}

/* Whether a request of len bytes can go to the inline context whole (see
 * wd_fast_refresh), whatever its size. */
static inline int wd_whole_here(const struct wd_cctx *x, size_t len)
{
	return x->whole_here && (len & x->fast_mask) == 0;
}

/* The reason a request of len bytes runs inline without asking libwd (a
 * WD_CPU_* code), else 0: below the threshold, or with the cpu policy,
 * always; above it while a CPU answer of the router is being reused
 * (inside an async job only while none of this thread's jobs waits on the
 * device: they would need wd_crypto_after_inline). */
static inline int wd_stays_here(struct wd_cctx *x, size_t len)
{
	if (x->inner == NULL || !x->chain_here)
		return 0;
	int why = wd_route_memo_fixed(&x->memo, len);
	if (why != 0 || (x->memo.async && wd_jobs_waiting > 0))
		return why;
	return wd_route_memo_reuse_cpu(&x->memo, len);
}

static int wd_cipher_update_rest(struct wd_cctx *x, unsigned char *out, size_t *outl,
				 size_t outsize, const unsigned char *in, size_t inl);
static int wd_cipher_update_reused(struct wd_cctx *x, unsigned char *out, size_t *outl,
				   size_t outsize, const unsigned char *in, size_t inl);

static int wd_cipher_update_fn(void *vctx, unsigned char *out, size_t *outl, size_t outsize,
			       const unsigned char *in, size_t inl)
{
	struct wd_cctx *x = vctx;
	/* Fast path: below the threshold, the request runs inline. One
	 * compare decides, on the length with bit 60 up for a partial block
	 * (where the mode needs whole ones) and every bit up once the budget
	 * of uncounted requests is spent: at 16 bytes each further branch
	 * cost about 4% (openssl speed), and a stack frame a tenth of the request. */
	size_t left = x->fast_left;
	size_t gate = inl | (inl & x->fast_mask) << 60 | -(size_t)(left == 0);
	if (gate < x->fast_below) {
		x->fast_left = left - 1;
		x->fast_bytes += inl;
		return x->impl.update(x->inner, out, outl, outsize, in, inl);
	}
	return wd_cipher_update_reused(x, out, outl, outsize, in, inl);
}

/* The second gate: a reused CPU answer, as the body would find it
 * (wd_stays_here), in a frame of its own that both ways leave by a tail
 * call (in wd_cipher_update_rest's, setting it up cost more than the
 * counting). The request changes nothing wd_fast_refresh reads but
 * memo.left, which the gate reads itself; its counts are handed over by
 * the next request counted the rest of the way, at most
 * WD_ROUTE_MEMO_REUSE_MAX requests later. */
static __attribute__((noinline)) int wd_cipher_update_reused(struct wd_cctx *x, unsigned char *out,
							     size_t *outl, size_t outsize,
							     const unsigned char *in, size_t inl)
{
	if (inl - x->reuse_from < x->reuse_span && (inl & x->fast_mask) == 0 &&
	    x->memo.left > 0 && x->fast_left != 0) {
		int why = x->memo.route & 0xff;
		x->memo.left--;
		x->counts.req[why]++;
		x->counts.bytes[why] += inl;
		return x->impl.update(x->inner, out, outl, outsize, in, inl);
	}
	return wd_cipher_update_rest(x, out, outl, outsize, in, inl);
}

static int wd_cipher_update_body(struct wd_cctx *x, unsigned char *out, size_t *outl,
				 size_t outsize, const unsigned char *in, size_t inl);

static __attribute__((noinline)) int wd_cipher_update_rest(struct wd_cctx *x, unsigned char *out,
							   size_t *outl, size_t outsize,
							   const unsigned char *in, size_t inl)
{
	if (x->fast_left == 0)
		wd_fast_flush(x);
	int r = wd_cipher_update_body(x, out, outl, outsize, in, inl);
	wd_fast_refresh(x);
	return r;
}

static int wd_cipher_update_body(struct wd_cctx *x, unsigned char *out, size_t *outl,
				 size_t outsize, const unsigned char *in, size_t inl)
{
	/* A CPU answer of the router reused. */
	int why;
	if (wd_whole_here(x, inl) && (why = wd_stays_here(x, inl)) != 0) {
		wd_count(&x->counts, inl, why);
		return x->impl.update(x->inner, out, outl, outsize, in, inl);
	}
	if (x->tls != NULL)
		return x->tls_impl.update(x->tls, out, outl, outsize, in, inl);
	if (!x->key_set)
		return 0;
	if (x->d->mode == EVP_CIPH_GCM_MODE) {
		/* Nothing to do, whatever the IV's state, as the default
		 * provider answers an empty update. */
		if (inl == 0) {
			*outl = 0;
			return 1;
		}
		return (out == NULL || outsize >= inl) && wd_gcm_update(x, out, outl, in, inl);
	}
	if (x->d->mode == EVP_CIPH_CTR_MODE || x->d->mode == EVP_CIPH_XTS_MODE) {
		/* XTS: a data unit of a block or more, under a tweak the
		 * caller gave (never a zero or stale one), as the default
		 * provider refuses. */
		if (outsize < inl || (x->d->mode == EVP_CIPH_XTS_MODE && (inl < 16 || !x->iv_set)))
			return 0;
		*outl = inl;
		return wd_blocks(x, out, in, inl);
	}
	/* ECB/CBC: keep partial blocks; when decrypting with padding, keep the
	 * last full block for final(). */
	size_t total = x->buflen + inl;
	size_t keep = total % 16;
	if (!x->enc && x->pad && keep == 0 && total > 0)
		keep = 16;
	size_t n = total - keep;
	if (outsize < n)
		return 0;
	size_t done = 0;
	if (x->buflen > 0 && n > 0) {
		size_t take = 16 - x->buflen;
		memcpy(x->buf + x->buflen, in, take);
		if (!wd_blocks(x, out, x->buf, 16))
			return 0;
		in += take;
		inl -= take;
		x->buflen = 0;
		done = 16;
	}
	if (n > done) {
		if (!wd_blocks(x, out + done, in, n - done))
			return 0;
		in += n - done;
		inl -= n - done;
	}
	memcpy(x->buf + x->buflen, in, inl);
	x->buflen += inl;
	*outl = n;
	return 1;
}

static int wd_cipher_final_body(struct wd_cctx *x, unsigned char *out, size_t *outl,
				size_t outsize);

static int wd_cipher_final_fn(void *vctx, unsigned char *out, size_t *outl, size_t outsize)
{
	int r = wd_cipher_final_body(vctx, out, outl, outsize);
	wd_fast_refresh(vctx);
	return r;
}

static int wd_cipher_final_body(struct wd_cctx *x, unsigned char *out, size_t *outl,
				size_t outsize)
{
	if (x->tls != NULL)
		return x->tls_impl.final(x->tls, out, outl, outsize);
	*outl = 0;
	if (!x->key_set)
		return 0;
	switch (x->d->mode) {
	case EVP_CIPH_GCM_MODE:
		return wd_gcm_final(x);
	case EVP_CIPH_CTR_MODE:
	case EVP_CIPH_XTS_MODE:
		return 1;
	}
	if (!x->pad) {
		if (x->buflen == 0)
			return 1;
		ERR_raise(ERR_LIB_PROV, PROV_R_WRONG_FINAL_BLOCK_LENGTH);
		return 0;
	}
	if (x->enc) {
		unsigned char p = (unsigned char)(16 - x->buflen);
		memset(x->buf + x->buflen, p, p);
		if (outsize < 16 || !wd_blocks(x, out, x->buf, 16))
			return 0;
		x->buflen = 0;
		*outl = 16;
		return 1;
	}
	if (x->buflen != 16) {
		ERR_raise(ERR_LIB_PROV, PROV_R_WRONG_FINAL_BLOCK_LENGTH);
		return 0;
	}
	unsigned char blk[16];
	if (!wd_blocks(x, blk, x->buf, 16))
		return 0;
	x->buflen = 0;
	unsigned char p = blk[15];
	int bad = p == 0 || p > 16;
	for (int i = 16 - p; !bad && i < 16; i++)
		bad = blk[i] != p;
	if (bad) {
		OPENSSL_cleanse(blk, sizeof blk);
		ERR_raise(ERR_LIB_PROV, PROV_R_BAD_DECRYPT);
		return 0;
	}
	if (outsize < (size_t)(16 - p))
		return 0;
	memcpy(out, blk, 16 - p);
	*outl = 16 - p;
	OPENSSL_cleanse(blk, sizeof blk);
	return 1;
}

static int wd_cipher_body(struct wd_cctx *x, unsigned char *out, size_t *outl, size_t outsize,
			  const unsigned char *in, size_t inl);

/* EVP_Cipher(): the raw call, no padding logic. */
static int wd_cipher_fn(void *vctx, unsigned char *out, size_t *outl, size_t outsize,
			const unsigned char *in, size_t inl)
{
	int r = wd_cipher_body(vctx, out, outl, outsize, in, inl);
	wd_fast_refresh(vctx);
	return r;
}

static int wd_cipher_body(struct wd_cctx *x, unsigned char *out, size_t *outl, size_t outsize,
			  const unsigned char *in, size_t inl)
{
	if (x->tls != NULL)
		return x->tls_impl.cipher(x->tls, out, outl, outsize, in, inl);
	int why;
	if (x->d->mode != EVP_CIPH_XTS_MODE && (why = wd_stays_here(x, inl)) != 0) {
		wd_count(&x->counts, inl, why);
		return x->impl.cipher(x->inner, out, outl, outsize, in, inl);
	}
	if (!x->key_set || outsize < inl)
		return 0;
	if (x->d->mode == EVP_CIPH_GCM_MODE) {
		/* OpenSSL calls this for every EVP_Cipher of a provided cipher
		 * that has it, the message's end included: EVP_Cipher(ctx, NULL,
		 * NULL, 0) must check the tag (decryption) or make it
		 * (encryption), never pass as empty AAD. */
		if (in == NULL) {
			*outl = 0;
			return wd_gcm_final(x);
		}
		return wd_gcm_update(x, out, outl, in, inl);
	}
	if ((x->d->mode == EVP_CIPH_ECB_MODE || x->d->mode == EVP_CIPH_CBC_MODE) && inl % 16 != 0)
		return 0;
	if (x->d->mode == EVP_CIPH_XTS_MODE && (inl < 16 || !x->iv_set))
		return 0; /* as the update (wd_cipher_update_body) */
	*outl = inl;
	return wd_blocks(x, out, in, inl);
}

/* Find the parameters named in names (n of them) in one pass over the
 * caller's array: found[i] is the first one named names[i], or NULL.
 * OSSL_PARAM_locate walks the array with strcmp once per name, and
 * EVP_CipherInit_ex asks three questions of a context per message: for
 * 16-byte AES-GCM messages, strcmp took a third of the time. */
static void wd_params_find(const OSSL_PARAM *params, const char *const names[], size_t n,
			   const OSSL_PARAM *found[])
{
	for (size_t i = 0; i < n; i++)
		found[i] = NULL;
	for (const OSSL_PARAM *p = params; p != NULL && p->key != NULL; p++)
		for (size_t i = 0; i < n; i++)
			if (found[i] == NULL && p->key[0] == names[i][0] &&
			    strcmp(p->key, names[i]) == 0) {
				found[i] = p;
				break;
			}
}

/* The stream's chaining value and CTR's bytes used of its block, from
 * wherever the stream is now, in the default provider's terms (its counter
 * names the next block once one is begun); the IV itself for the modes
 * without a chain. */
static void wd_chain_now(struct wd_cctx *x, unsigned char iv[16], unsigned int *num)
{
	memcpy(iv, x->iv, 16);
	*num = 0;
	if (x->d->mode != EVP_CIPH_CBC_MODE && x->d->mode != EVP_CIPH_CTR_MODE)
		return;
	if (x->chain_here && x->inner != NULL) {
		unsigned char v[16];
		unsigned int n = 0;
		OSSL_PARAM params[] = {
			OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_UPDATED_IV, v, sizeof v),
			OSSL_PARAM_construct_uint(OSSL_CIPHER_PARAM_NUM, &n), OSSL_PARAM_construct_end()};
		if (x->impl.get_ctx_params(x->inner, params)) {
			memcpy(iv, v, 16);
			*num = n;
		}
		return;
	}
	size_t n = 0;
	if (x->c == NULL || wd_cipher_get_chain(x->c, iv, &n) != 0) {
		memcpy(iv, x->iv, 16);
		return;
	}
	if (x->d->mode == EVP_CIPH_CTR_MODE && n > 0)
		for (int i = 15; i >= 0 && ++iv[i] == 0; i--)
			;
	*num = (unsigned int)n;
}

static int wd_cipher_get_ctx_params(void *vctx, OSSL_PARAM params[])
{
	struct wd_cctx *x = vctx;
	if (x->tls != NULL)
		return x->tls_impl.get_ctx_params(x->tls, params);
	enum { KEYLEN, IVLEN, PADDING, NUM, IV, UPDATED_IV, TAGLEN, TAG, IV_GEN, N };
	static const char *const names[N] = {
		[KEYLEN] = OSSL_CIPHER_PARAM_KEYLEN,	   [IVLEN] = OSSL_CIPHER_PARAM_IVLEN,
		[PADDING] = OSSL_CIPHER_PARAM_PADDING,	   [NUM] = OSSL_CIPHER_PARAM_NUM,
		[IV] = OSSL_CIPHER_PARAM_IV,		   [UPDATED_IV] = OSSL_CIPHER_PARAM_UPDATED_IV,
		[TAGLEN] = OSSL_CIPHER_PARAM_AEAD_TAGLEN, [TAG] = OSSL_CIPHER_PARAM_AEAD_TAG,
		[IV_GEN] = OSSL_CIPHER_PARAM_AEAD_TLS1_GET_IV_GEN,
	};
	const OSSL_PARAM *found[N];
	wd_params_find(params, names, N, found);
	/* An IV generated from a fixed IV nobody set (a fixed IV hands the
	 * context over): refused, as the default provider does, never success
	 * with nothing written (the caller would use its buffer as a nonce). */
	if (found[IV_GEN] != NULL)
		return 0;
	/* found[] points into the caller's array, which is writable. */
#define WD_FOUND(i) ((OSSL_PARAM *)found[i])
	OSSL_PARAM *p;
	if ((p = WD_FOUND(KEYLEN)) != NULL &&
	    !OSSL_PARAM_set_size_t(p, x->d->keylen))
		return 0;
	if ((p = WD_FOUND(IVLEN)) != NULL &&
	    !OSSL_PARAM_set_size_t(p, x->ivlen))
		return 0;
	if ((p = WD_FOUND(PADDING)) != NULL &&
	    !OSSL_PARAM_set_uint(p, (unsigned int)x->pad))
		return 0;
	/* GCM has no IV to give before one is set (the default provider
	 * refuses too, rather than hand out zeros). */
	if (x->d->mode == EVP_CIPH_GCM_MODE && !x->iv_set &&
	    (WD_FOUND(IV) != NULL || WD_FOUND(UPDATED_IV) != NULL))
		return 0;
	unsigned int num = 0;
	if (WD_FOUND(NUM) != NULL || WD_FOUND(UPDATED_IV) != NULL)
		wd_chain_now(x, x->updated_iv, &num);
	if ((p = WD_FOUND(NUM)) != NULL &&
	    !OSSL_PARAM_set_uint(p, num))
		return 0;
	const unsigned char *oiv = x->d->mode == EVP_CIPH_GCM_MODE ? x->iv : x->oiv;
	if ((p = WD_FOUND(IV)) != NULL &&
	    !OSSL_PARAM_set_octet_string(p, oiv, x->ivlen) &&
	    !OSSL_PARAM_set_octet_ptr(p, oiv, x->ivlen))
		return 0;
	if ((p = WD_FOUND(UPDATED_IV)) != NULL &&
	    !OSSL_PARAM_set_octet_string(p, x->updated_iv, x->ivlen) &&
	    !OSSL_PARAM_set_octet_ptr(p, x->updated_iv, x->ivlen))
		return 0;
	if ((p = WD_FOUND(TAGLEN)) != NULL &&
	    !OSSL_PARAM_set_size_t(p, x->taglen))
		return 0;
	if ((p = WD_FOUND(TAG)) != NULL) {
		/* Only once an encryption made it (the default provider refuses
		 * as well: a stale or zero tag is no tag). */
		if (x->d->mode != EVP_CIPH_GCM_MODE || !x->enc || !x->tag_ready || p->data_size == 0 ||
		    p->data_size > 16)
			return 0;
		if (!OSSL_PARAM_set_octet_string(p, x->tag, p->data_size))
			return 0;
	}
#undef WD_FOUND
	return 1;
}

/* Hand the context to the default provider's implementation for TLS
 * record protection: same key, IV and direction, then every call goes
 * there (see `tls` in struct wd_cctx). */
static int wd_tls_begin(struct wd_cctx *x)
{
	if (!wd_cpu_lookup(x->d->name, &x->tls_impl)) {
		ERR_raise_data(ERR_LIB_PROV, ERR_R_UNSUPPORTED,
			       "WrapDrive: TLS record protection needs the default provider's %s",
			       x->d->name);
		return 0;
	}
	void *t = x->tls_impl.newctx(wd_cpu_provctx);
	if (t == NULL)
		return 0;
	const unsigned char *key = x->key_set ? x->key : NULL;
	size_t ivlen = x->d->mode == EVP_CIPH_GCM_MODE ? x->ivlen : x->d->ivlen;
	const unsigned char *iv = x->iv_set && !x->gcm_iv_spent && ivlen > 0 ? x->iv : NULL;
	unsigned int pad = (unsigned int)x->pad;
	OSSL_PARAM params[] = {OSSL_PARAM_construct_uint(OSSL_CIPHER_PARAM_PADDING, &pad),
			       OSSL_PARAM_construct_end()};
	int ok = x->enc ? x->tls_impl.einit(t, key, x->d->keylen, iv, iv ? ivlen : 0, params)
			: x->tls_impl.dinit(t, key, x->d->keylen, iv, iv ? ivlen : 0, params);
	if (!ok) {
		x->tls_impl.freectx(t);
		return 0;
	}
	x->tls = t;
	/* The device session and the inline context are not used again. */
	if (x->c != NULL) {
		wd_cipher_free(x->c);
		x->c = NULL;
	}
	if (x->a != NULL) {
		wd_aead_free(x->a);
		x->a = NULL;
	}
	if (x->inner != NULL) {
		x->impl.freectx(x->inner);
		x->inner = NULL;
	}
	return 1;
}

static int wd_cipher_set_params(struct wd_cctx *x, const OSSL_PARAM params[])
{
	if (params == NULL)
		return 1;
	if (x->tls != NULL)
		return x->tls_impl.set_ctx_params(x->tls, params);
	/* The TLS record-layer parameters first (wd_tls_param_names). */
	const OSSL_PARAM *tls[WD_TLS_PARAMS];
	wd_params_find(params, wd_tls_param_names, WD_TLS_PARAMS, tls);
	for (size_t i = 0; i < WD_TLS_PARAMS; i++)
		if (tls[i] != NULL)
			return wd_tls_begin(x) && x->tls_impl.set_ctx_params(x->tls, params);
	enum { PADDING, KEYLEN, IVLEN, TAG, NUM, N };
	static const char *const names[N] = {
		[PADDING] = OSSL_CIPHER_PARAM_PADDING,
		[KEYLEN] = OSSL_CIPHER_PARAM_KEYLEN,
		[IVLEN] = OSSL_CIPHER_PARAM_AEAD_IVLEN,
		[TAG] = OSSL_CIPHER_PARAM_AEAD_TAG,
		[NUM] = OSSL_CIPHER_PARAM_NUM,
	};
	const OSSL_PARAM *found[N], *p;
	wd_params_find(params, names, N, found);
	if ((p = found[NUM]) != NULL) {
		/* Moving a stream inside its block is not supported: refused
		 * (it was ignored with success), unless it moves nowhere. */
		unsigned int want, now;
		unsigned char iv[16];
		if (!OSSL_PARAM_get_uint(p, &want))
			return 0;
		wd_chain_now(x, iv, &now);
		if (want != now) {
			ERR_raise_data(ERR_LIB_PROV, 105, "wd: setting num (%u, at %u) is not supported",
				       want, now);
			return 0;
		}
	}
	if ((p = found[PADDING]) != NULL) {
		unsigned int pad;
		if (!OSSL_PARAM_get_uint(p, &pad))
			return 0;
		x->pad = pad != 0;
	}
	if ((p = found[KEYLEN]) != NULL) {
		size_t k;
		if (!OSSL_PARAM_get_size_t(p, &k) || k != x->d->keylen)
			return 0;
	}
	if (x->d->mode == EVP_CIPH_GCM_MODE) {
		if ((p = found[IVLEN]) != NULL) {
			size_t n;
			if (!OSSL_PARAM_get_size_t(p, &n))
				return 0;
			/* An IV given for the old length is no IV for the new one
			 * (the default provider marks it finished). A length past
			 * what the device takes fails, and must not leave the old
			 * IV to a caller that goes on regardless. */
			if (n != x->ivlen && x->iv_set)
				x->gcm_iv_spent = 1;
			if (n == 0 || n > 16)
				return 0;
			x->ivlen = n;
		}
		if ((p = found[TAG]) != NULL) {
			void *v = x->tag;
			size_t n;
			/* The expected tag of a decryption only: neither a tag
			 * length alone (no data) nor an encryption's, as the
			 * default provider refuses them. */
			if (x->enc || p->data == NULL || p->data_size == 0 || p->data_size > 16 ||
			    !OSSL_PARAM_get_octet_string(p, &v, sizeof x->tag, &n))
				return 0;
			x->taglen = n;
			x->tag_given = 1;
		}
	}
	return 1;
}

static int wd_cipher_set_ctx_params(void *vctx, const OSSL_PARAM params[])
{
	int r = wd_cipher_set_params(vctx, params);
	wd_fast_refresh(vctx);
	return r;
}

static const OSSL_PARAM wd_cipher_known_gettable[] = {
	OSSL_PARAM_uint(OSSL_CIPHER_PARAM_MODE, NULL),
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_KEYLEN, NULL),
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_IVLEN, NULL),
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_BLOCK_SIZE, NULL),
	OSSL_PARAM_int(OSSL_CIPHER_PARAM_AEAD, NULL),
	OSSL_PARAM_int(OSSL_CIPHER_PARAM_CUSTOM_IV, NULL),
	OSSL_PARAM_int(OSSL_CIPHER_PARAM_CTS, NULL),
	OSSL_PARAM_int(OSSL_CIPHER_PARAM_TLS1_MULTIBLOCK, NULL),
	OSSL_PARAM_int(OSSL_CIPHER_PARAM_HAS_RAND_KEY, NULL),
	OSSL_PARAM_END,
};

static const OSSL_PARAM wd_cipher_known_ctx_gettable[] = {
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_KEYLEN, NULL),
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_IVLEN, NULL),
	OSSL_PARAM_uint(OSSL_CIPHER_PARAM_PADDING, NULL),
	OSSL_PARAM_uint(OSSL_CIPHER_PARAM_NUM, NULL),
	OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_IV, NULL, 0),
	OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_UPDATED_IV, NULL, 0),
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_AEAD_TAGLEN, NULL),
	OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, NULL, 0),
	/* TLS record protection (handed to the default provider) */
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_AEAD_TLS1_AAD_PAD, NULL),
	OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_AEAD_TLS1_GET_IV_GEN, NULL, 0),
	OSSL_PARAM_octet_ptr(OSSL_CIPHER_PARAM_TLS_MAC, NULL, 0),
	OSSL_PARAM_END,
};

static const OSSL_PARAM wd_cipher_known_ctx_settable[] = {
	OSSL_PARAM_uint(OSSL_CIPHER_PARAM_PADDING, NULL),
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_KEYLEN, NULL),
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_AEAD_IVLEN, NULL),
	OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, NULL, 0),
	/* TLS record protection (handed to the default provider) */
	OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_AEAD_TLS1_AAD, NULL, 0),
	OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_AEAD_TLS1_IV_FIXED, NULL, 0),
	OSSL_PARAM_octet_string(OSSL_CIPHER_PARAM_AEAD_TLS1_SET_IV_INV, NULL, 0),
	OSSL_PARAM_uint(OSSL_CIPHER_PARAM_TLS_VERSION, NULL),
	OSSL_PARAM_size_t(OSSL_CIPHER_PARAM_TLS_MAC_SIZE, NULL),
	OSSL_PARAM_END,
};

static const OSSL_PARAM *wd_cipher_gettable_params(void *provctx)
{
	(void)provctx;
	return wd_cipher_known_gettable;
}

static const OSSL_PARAM *wd_cipher_gettable_ctx_params(void *cctx, void *provctx)
{
	(void)cctx;
	(void)provctx;
	return wd_cipher_known_ctx_gettable;
}

static const OSSL_PARAM *wd_cipher_settable_ctx_params(void *cctx, void *provctx)
{
	(void)cctx;
	(void)provctx;
	return wd_cipher_known_ctx_settable;
}

static int wd_cipher_get_params(const struct wd_cipher_desc *d, OSSL_PARAM params[])
{
	OSSL_PARAM *p;
	int aead = d->mode == EVP_CIPH_GCM_MODE;
	if ((p = OSSL_PARAM_locate(params, OSSL_CIPHER_PARAM_MODE)) != NULL &&
	    !OSSL_PARAM_set_uint(p, d->mode))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_CIPHER_PARAM_KEYLEN)) != NULL &&
	    !OSSL_PARAM_set_size_t(p, d->keylen))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_CIPHER_PARAM_IVLEN)) != NULL &&
	    !OSSL_PARAM_set_size_t(p, d->ivlen))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_CIPHER_PARAM_BLOCK_SIZE)) != NULL &&
	    !OSSL_PARAM_set_size_t(p, d->blocksize))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_CIPHER_PARAM_AEAD)) != NULL &&
	    !OSSL_PARAM_set_int(p, aead))
		return 0;
	/* As the default provider: GCM and XTS take their IV their own way. */
	if ((p = OSSL_PARAM_locate(params, OSSL_CIPHER_PARAM_CUSTOM_IV)) != NULL &&
	    !OSSL_PARAM_set_int(p, aead || d->mode == EVP_CIPH_XTS_MODE))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_CIPHER_PARAM_CTS)) != NULL &&
	    !OSSL_PARAM_set_int(p, 0))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_CIPHER_PARAM_TLS1_MULTIBLOCK)) != NULL &&
	    !OSSL_PARAM_set_int(p, 0))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_CIPHER_PARAM_HAS_RAND_KEY)) != NULL &&
	    !OSSL_PARAM_set_int(p, 0))
		return 0;
	return 1;
}

#define WD_CIPHER(id, nm, md, kl, il, bs)                                                     \
	static const struct wd_cipher_desc wd_desc_##id = {nm, md, kl, il, bs};               \
	static void *wd_newctx_##id(void *provctx)                                            \
	{                                                                                     \
		return wd_cipher_newctx(provctx, &wd_desc_##id);                              \
	}                                                                                     \
	static int wd_get_params_##id(OSSL_PARAM params[])                                    \
	{                                                                                     \
		return wd_cipher_get_params(&wd_desc_##id, params);                           \
	}                                                                                     \
	static const OSSL_DISPATCH wd_fns_##id[] = {                                          \
		{OSSL_FUNC_CIPHER_NEWCTX, (void (*)(void))wd_newctx_##id},                    \
		{OSSL_FUNC_CIPHER_FREECTX, (void (*)(void))wd_cipher_freectx},                \
		{OSSL_FUNC_CIPHER_DUPCTX, (void (*)(void))wd_cipher_dupctx},                  \
		{OSSL_FUNC_CIPHER_ENCRYPT_INIT, (void (*)(void))wd_encrypt_init},             \
		{OSSL_FUNC_CIPHER_DECRYPT_INIT, (void (*)(void))wd_decrypt_init},             \
		{OSSL_FUNC_CIPHER_UPDATE, (void (*)(void))wd_cipher_update_fn},               \
		{OSSL_FUNC_CIPHER_FINAL, (void (*)(void))wd_cipher_final_fn},                 \
		{OSSL_FUNC_CIPHER_CIPHER, (void (*)(void))wd_cipher_fn},                      \
		{OSSL_FUNC_CIPHER_GET_PARAMS, (void (*)(void))wd_get_params_##id},            \
		{OSSL_FUNC_CIPHER_GET_CTX_PARAMS, (void (*)(void))wd_cipher_get_ctx_params},  \
		{OSSL_FUNC_CIPHER_SET_CTX_PARAMS, (void (*)(void))wd_cipher_set_ctx_params},  \
		{OSSL_FUNC_CIPHER_GETTABLE_PARAMS, (void (*)(void))wd_cipher_gettable_params}, \
		{OSSL_FUNC_CIPHER_GETTABLE_CTX_PARAMS,                                        \
		 (void (*)(void))wd_cipher_gettable_ctx_params},                              \
		{OSSL_FUNC_CIPHER_SETTABLE_CTX_PARAMS,                                        \
		 (void (*)(void))wd_cipher_settable_ctx_params},                              \
		{0, NULL}}

WD_CIPHER(aes128ecb, "aes-128-ecb", EVP_CIPH_ECB_MODE, 16, 0, 16);
WD_CIPHER(aes192ecb, "aes-192-ecb", EVP_CIPH_ECB_MODE, 24, 0, 16);
WD_CIPHER(aes256ecb, "aes-256-ecb", EVP_CIPH_ECB_MODE, 32, 0, 16);
WD_CIPHER(aes128cbc, "aes-128-cbc", EVP_CIPH_CBC_MODE, 16, 16, 16);
WD_CIPHER(aes192cbc, "aes-192-cbc", EVP_CIPH_CBC_MODE, 24, 16, 16);
WD_CIPHER(aes256cbc, "aes-256-cbc", EVP_CIPH_CBC_MODE, 32, 16, 16);
WD_CIPHER(aes128ctr, "aes-128-ctr", EVP_CIPH_CTR_MODE, 16, 16, 1);
WD_CIPHER(aes192ctr, "aes-192-ctr", EVP_CIPH_CTR_MODE, 24, 16, 1);
WD_CIPHER(aes256ctr, "aes-256-ctr", EVP_CIPH_CTR_MODE, 32, 16, 1);
WD_CIPHER(aes128xts, "aes-128-xts", EVP_CIPH_XTS_MODE, 32, 16, 1);
WD_CIPHER(aes256xts, "aes-256-xts", EVP_CIPH_XTS_MODE, 64, 16, 1);
WD_CIPHER(aes128gcm, "aes-128-gcm", EVP_CIPH_GCM_MODE, 16, 12, 1);
WD_CIPHER(aes256gcm, "aes-256-gcm", EVP_CIPH_GCM_MODE, 32, 12, 1);

#define WD_PROPS "provider=wd"

static const OSSL_ALGORITHM wd_ciphers[] = {
	{"AES-128-ECB:2.16.840.1.101.3.4.1.1", WD_PROPS, wd_fns_aes128ecb, "AES-128-ECB (WrapDrive)"},
	{"AES-192-ECB:2.16.840.1.101.3.4.1.21", WD_PROPS, wd_fns_aes192ecb, "AES-192-ECB (WrapDrive)"},
	{"AES-256-ECB:2.16.840.1.101.3.4.1.41", WD_PROPS, wd_fns_aes256ecb, "AES-256-ECB (WrapDrive)"},
	{"AES-128-CBC:AES128:2.16.840.1.101.3.4.1.2", WD_PROPS, wd_fns_aes128cbc, "AES-128-CBC (WrapDrive)"},
	{"AES-192-CBC:AES192:2.16.840.1.101.3.4.1.22", WD_PROPS, wd_fns_aes192cbc, "AES-192-CBC (WrapDrive)"},
	{"AES-256-CBC:AES256:2.16.840.1.101.3.4.1.42", WD_PROPS, wd_fns_aes256cbc, "AES-256-CBC (WrapDrive)"},
	{"AES-128-CTR", WD_PROPS, wd_fns_aes128ctr, "AES-128-CTR (WrapDrive)"},
	{"AES-192-CTR", WD_PROPS, wd_fns_aes192ctr, "AES-192-CTR (WrapDrive)"},
	{"AES-256-CTR", WD_PROPS, wd_fns_aes256ctr, "AES-256-CTR (WrapDrive)"},
	{"AES-128-XTS:1.3.111.2.1619.0.1.1", WD_PROPS, wd_fns_aes128xts, "AES-128-XTS (WrapDrive)"},
	{"AES-256-XTS:1.3.111.2.1619.0.1.2", WD_PROPS, wd_fns_aes256xts, "AES-256-XTS (WrapDrive)"},
	{"AES-128-GCM:id-aes128-GCM:2.16.840.1.101.3.4.1.6", WD_PROPS, wd_fns_aes128gcm, "AES-128-GCM (WrapDrive)"},
	{"AES-256-GCM:id-aes256-GCM:2.16.840.1.101.3.4.1.46", WD_PROPS, wd_fns_aes256gcm, "AES-256-GCM (WrapDrive)"},
	{NULL, NULL, NULL, NULL},
};

/* ---- digests ------------------------------------------------------------ */

/* The default provider's functions for one digest. */
struct wd_cpu_dimpl {
	OSSL_FUNC_digest_newctx_fn *newctx;
	OSSL_FUNC_digest_freectx_fn *freectx;
	OSSL_FUNC_digest_dupctx_fn *dupctx;
	OSSL_FUNC_digest_init_fn *init;
	OSSL_FUNC_digest_update_fn *update;
	OSSL_FUNC_digest_final_fn *final;
};

struct wd_digest_desc {
	const char *name;
	size_t size, blocksize;
	int index; /* into wd_digest_names */
};

/* Each thread's digest state, in one thread-local object (each access to
 * a thread-local of a loaded module is a call): the inline counts, handed
 * to libwd in batches and when the thread ends, and one spare context per
 * digest. EVP_Digest makes and frees a provider context per call; a
 * context freed after an inline message is kept here, with its default-
 * provider context inside, and the next newctx of that digest takes it:
 * a small digest then allocates nothing in this provider. */
#define WD_DIGESTS 5
struct wd_dctx;
struct wd_dthread {
	struct wd_counts counts;
	/* The key generation this thread registered with (0: none): a key
	 * deleted by the last teardown and made again by a later instance
	 * needs the thread registered again. */
	unsigned registered;
	struct wd_dctx *spare[WD_DIGESTS];
	/* The registered threads (wd_dthreads, under wd_dcount_lock): the
	 * last teardown hands over every live thread's counts, whose exit
	 * destructor it deletes. */
	struct wd_dthread *next;
	int listed;
};
static __thread struct wd_dthread wd_this_thread;
static pthread_key_t wd_dcount_key;

static void wd_dctx_destroy(struct wd_dctx *x);

static pthread_mutex_t wd_dcount_lock = PTHREAD_MUTEX_INITIALIZER;
static struct wd_dthread *wd_dthreads;

/* Take t off the list of registered threads (under wd_dcount_lock). */
static void wd_dthread_unlist(struct wd_dthread *t)
{
	if (!t->listed)
		return;
	for (struct wd_dthread **p = &wd_dthreads; *p != NULL; p = &(*p)->next)
		if (*p == t) {
			*p = t->next;
			break;
		}
	t->next = NULL;
	t->listed = 0;
}

/* The thread's end (the key's destructor), or this thread's part of the
 * last teardown (`locked`: wd_dcount_lock held). */
static void wd_dthread_end(int locked)
{
	struct wd_dthread *t = &wd_this_thread;
	if (!locked)
		pthread_mutex_lock(&wd_dcount_lock);
	wd_dthread_unlist(t);
	if (!locked)
		pthread_mutex_unlock(&wd_dcount_lock);
	wd_flush_counts(&t->counts);
	for (int i = 0; i < WD_DIGESTS; i++) {
		if (t->spare[i] != NULL)
			wd_dctx_destroy(t->spare[i]);
		t->spare[i] = NULL;
	}
}

/* A forked child has only the thread that forked: the others' storage
 * on the list is the parent's (their counts are the parent's to hand
 * over), and the locks may have been held by threads not here. (Handlers
 * of a module go with it when it is unloaded.) */
static void wd_dthreads_after_fork(void)
{
	pthread_mutex_init(&wd_dcount_lock, NULL);
	pthread_mutex_init(&wd_cpu_lock, NULL);
	struct wd_dthread *t = &wd_this_thread;
	wd_dthreads = t->listed ? t : NULL;
	t->next = NULL;
}

static pthread_once_t wd_fork_once = PTHREAD_ONCE_INIT;
static void wd_fork_handlers(void)
{
	(void)pthread_atfork(NULL, NULL, wd_dthreads_after_fork);
}

static void wd_dthread_at_exit(void *unused)
{
	(void)unused;
	wd_dthread_end(0);
}

/* The key lives while a provider instance does: the last teardown hands
 * over every thread's counts and deletes it. A destructor that had
 * already started finishes in the module, which stays mapped after
 * OpenSSL closes it (linked -z nodelete, scripts/build-provider.sh). */
static int wd_instances, wd_dcount_key_live;
/* Moves on each time the key is deleted, so that a thread sees its
 * registration was with a key since deleted (read without the lock: a
 * stale read only registers again). Never 0. */
static unsigned wd_dcount_key_gen = 1;

static int wd_dthread_registered(const struct wd_dthread *t)
{
	return t->registered == __atomic_load_n(&wd_dcount_key_gen, __ATOMIC_RELAXED);
}

/* Make sure this thread's counts and spare contexts are handed back when
 * it ends. */
static __attribute__((noinline, cold)) void wd_dthread_register(struct wd_dthread *t)
{
	pthread_mutex_lock(&wd_dcount_lock);
	if (!wd_dcount_key_live && wd_instances > 0)
		wd_dcount_key_live =
			pthread_key_create(&wd_dcount_key, wd_dthread_at_exit) == 0;
	/* Any non-NULL value makes the destructor run at thread exit. */
	if (wd_dcount_key_live && pthread_setspecific(wd_dcount_key, t) == 0) {
		t->registered = wd_dcount_key_gen;
		if (!t->listed) {
			t->next = wd_dthreads;
			wd_dthreads = t;
			t->listed = 1;
		}
	}
	pthread_mutex_unlock(&wd_dcount_lock);
}



static int wd_cpu_dlookup(const char *name, struct wd_cpu_dimpl *impl)
{
	wd_cpu_init();
	memset(impl, 0, sizeof(*impl));
	for (const OSSL_ALGORITHM *a = wd_cpu_digests; a != NULL && a->algorithm_names != NULL; a++) {
		if (!wd_names_have(a->algorithm_names, name))
			continue;
		for (const OSSL_DISPATCH *f = a->implementation; f->function_id != 0; f++) {
			switch (f->function_id) {
			case OSSL_FUNC_DIGEST_NEWCTX: impl->newctx = OSSL_FUNC_digest_newctx(f); break;
			case OSSL_FUNC_DIGEST_FREECTX: impl->freectx = OSSL_FUNC_digest_freectx(f); break;
			case OSSL_FUNC_DIGEST_DUPCTX: impl->dupctx = OSSL_FUNC_digest_dupctx(f); break;
			case OSSL_FUNC_DIGEST_INIT: impl->init = OSSL_FUNC_digest_init(f); break;
			case OSSL_FUNC_DIGEST_UPDATE: impl->update = OSSL_FUNC_digest_update(f); break;
			case OSSL_FUNC_DIGEST_FINAL: impl->final = OSSL_FUNC_digest_final(f); break;
			}
		}
		return impl->newctx && impl->freectx && impl->dupctx && impl->init && impl->update &&
		       impl->final;
	}
	return 0;
}

/* The default provider's digest implementations, resolved once. */
static const char *const wd_digest_names[WD_DIGESTS] = {"sha1", "sha224", "sha256", "sha384",
							 "sha512"};
static struct wd_cpu_dimpl wd_cpu_dimpls[WD_DIGESTS];
static int wd_cpu_dimpl_ok[WD_DIGESTS];
static pthread_once_t wd_cpu_donce = PTHREAD_ONCE_INIT;

static void wd_cpu_dinit(void)
{
	for (int i = 0; i < WD_DIGESTS; i++)
		wd_cpu_dimpl_ok[i] = wd_cpu_dlookup(wd_digest_names[i], &wd_cpu_dimpls[i]);
}

/* The default provider's implementation of digest `index`, or NULL. Its
 * functions are libcrypto's own and stay; the provider context they are
 * given (wd_cpu_provctx) is made again for a later instance, by
 * wd_cpu_init. */
static const struct wd_cpu_dimpl *wd_cpu_digest(int index)
{
	wd_cpu_init();
	pthread_once(&wd_cpu_donce, wd_cpu_dinit);
	return wd_cpu_dimpl_ok[index] ? &wd_cpu_dimpls[index] : NULL;
}

/* Where a message is hashed: decided by its first update (a message cannot
 * move between paths: the device session's state is not libcrypto's). */
enum { WD_MSG_UNDECIDED, WD_MSG_INLINE, WD_MSG_LIBRARY };

struct wd_dctx {
	struct wd_prov *prov;
	const struct wd_digest_desc *d;
	struct wd_digest *s;
	/* The inline CPU path: the default provider's context, kept across
	 * messages (made on first use). */
	void *inner;
	const struct wd_cpu_dimpl *impl;
	int path;
	int route; /* the WD_CPU_* reason of an inline message */
	struct wd_route_memo memo;
	/* The router asked to time this message (WD_ROUTE_TIMED). */
	uint64_t t0;
	size_t total;
};

static void *wd_digest_newctx(void *provctx, const struct wd_digest_desc *d)
{
	struct wd_dctx **spare = &wd_this_thread.spare[d->index];
	struct wd_dctx *x = *spare;
	if (x != NULL) {
		/* Its inline context and implementation stay, and so does the
		 * router's answer for the messages it still covers (under the
		 * same settings): a message per context would otherwise ask
		 * the router every time. The rest is as new. */
		*spare = NULL;
		x->path = WD_MSG_UNDECIDED;
		x->t0 = 0;
		x->total = 0;
		struct wd_route_memo kept = x->memo;
		wd_route_memo_init(&x->memo);
		if (x->memo.threshold == kept.threshold && x->memo.policy == kept.policy)
			x->memo = kept;
	} else if ((x = OPENSSL_zalloc(sizeof(*x))) == NULL) {
		return NULL;
	} else {
		wd_route_memo_init(&x->memo);
	}
	x->prov = provctx;
	x->d = d;
	return x;
}

static void wd_dctx_destroy(struct wd_dctx *x)
{
	if (x->s)
		wd_digest_free(x->s);
	if (x->inner != NULL)
		x->impl->freectx(x->inner);
	OPENSSL_free(x);
}

static void wd_digest_freectx(void *vctx)
{
	struct wd_dctx *x = vctx;
	if (x == NULL)
		return;
	struct wd_dthread *t = &wd_this_thread;
	struct wd_dctx **spare = &t->spare[x->d->index];
	if (x->inner == NULL || x->s != NULL || *spare != NULL) {
		wd_dctx_destroy(x);
		return;
	}
	if (!wd_dthread_registered(t))
		wd_dthread_register(t);
	*spare = x;
}

static void *wd_digest_dupctx(void *vctx)
{
	struct wd_dctx *x = vctx;
	struct wd_dctx *n = OPENSSL_zalloc(sizeof(*n));
	if (n == NULL)
		return NULL;
	n->prov = x->prov;
	n->d = x->d;
	n->impl = x->impl;
	n->path = x->path;
	/* The message's reason and the settings go along: without them a
	 * copy's inline message was counted under no reason (never handed
	 * to libwd) and its next ones saw a threshold of 0. */
	n->route = x->route;
	n->memo = x->memo;
	n->t0 = x->t0;
	n->total = x->total;
	if (x->s != NULL && wd_digest_dup(x->s, &n->s) != 0)
		goto fail;
	if (x->inner != NULL && (n->inner = x->impl->dupctx(x->inner)) == NULL)
		goto fail;
	return n;
fail:
	wd_digest_freectx(n);
	return NULL;
}

static int wd_digest_init_fn(void *vctx, const OSSL_PARAM params[])
{
	struct wd_dctx *x = vctx;
	(void)params;
	if (x->s)
		wd_digest_free(x->s);
	x->s = NULL;
	x->path = WD_MSG_UNDECIDED;
	return 1;
}

/* Decide where the message goes from its first update of `len` bytes:
 * below the threshold, with the cpu policy, or where libwd's router says
 * the CPU is cheaper, inline, straight to the default provider's
 * implementation (a small message pays nothing for the provider);
 * otherwise through libwd. */
static int wd_digest_start(struct wd_dctx *x, size_t len)
{
	int route = wd_route_memo_fixed(&x->memo, len);
	if (route == 0)
		route = wd_route_memo_route(&x->memo, WD_KIND_DIGEST, len,
					    ASYNC_get_current_job() != NULL);
	x->t0 = route & WD_ROUTE_TIMED ? wd_now_ns() : 0;
	x->total = 0;
	if (x->impl == NULL)
		x->impl = wd_cpu_digest(x->d->index);
	if (!(route & WD_ROUTE_DEVICE) && x->impl != NULL) {
		if (x->inner == NULL && (x->inner = x->impl->newctx(wd_cpu_provctx)) == NULL)
			return 0;
		if (!x->impl->init(x->inner, NULL))
			return 0;
		x->path = WD_MSG_INLINE;
		x->route = route & 0xff;
		return 1;
	}
	/* A message after a final without an init: the last one's session
	 * is still here. */
	if (x->s != NULL) {
		wd_digest_free(x->s);
		x->s = NULL;
	}
	int r = wd_digest_new(&x->s, x->d->name, NULL, 0);
	if (r != 0)
		return wd_fail(r);
	x->path = WD_MSG_LIBRARY;
	return 1;
}

static int wd_digest_update_fn(void *vctx, const unsigned char *in, size_t inl)
{
	struct wd_dctx *x = vctx;
	if (x->path == WD_MSG_UNDECIDED && !wd_digest_start(x, inl))
		return 0;
	x->total += inl;
	if (x->path == WD_MSG_INLINE)
		return x->impl->update(x->inner, in, inl);
	if (x->s == NULL)
		return 0;
	int r = wd_digest_update(x->s, in, inl);
	return r == 0 || wd_fail(r);
}

static int wd_digest_final_fn(void *vctx, unsigned char *out, size_t *outl, size_t outsz)
{
	struct wd_dctx *x = vctx;
	if (outsz < x->d->size)
		return 0;
	if (x->path == WD_MSG_UNDECIDED && !wd_digest_start(x, 0))
		return 0;
	int inline_ = x->path == WD_MSG_INLINE, ok;
	if (inline_) {
		ok = x->impl->final(x->inner, out, outl, outsz);
		struct wd_dthread *t = &wd_this_thread;
		if (!wd_dthread_registered(t))
			wd_dthread_register(t);
		wd_count(&t->counts, x->total, x->route);
	} else {
		int n = x->s != NULL ? wd_digest_final(x->s, out, outsz) : -1;
		ok = n >= 0;
		if (ok)
			*outl = (size_t)n;
		else if (x->s != NULL)
			wd_fail(n);
	}
	if (ok && x->t0 != 0)
		wd_crypto_record(WD_KIND_DIGEST, x->total, inline_, wd_now_ns() - x->t0);
	x->path = WD_MSG_UNDECIDED;
	return ok;
}

static const OSSL_PARAM wd_digest_known_gettable[] = {
	OSSL_PARAM_size_t(OSSL_DIGEST_PARAM_BLOCK_SIZE, NULL),
	OSSL_PARAM_size_t(OSSL_DIGEST_PARAM_SIZE, NULL),
	OSSL_PARAM_int(OSSL_DIGEST_PARAM_XOF, NULL),
	OSSL_PARAM_int(OSSL_DIGEST_PARAM_ALGID_ABSENT, NULL),
	OSSL_PARAM_END,
};

static const OSSL_PARAM *wd_digest_gettable_params(void *provctx)
{
	(void)provctx;
	return wd_digest_known_gettable;
}

static int wd_digest_get_params(const struct wd_digest_desc *d, OSSL_PARAM params[])
{
	OSSL_PARAM *p;
	if ((p = OSSL_PARAM_locate(params, OSSL_DIGEST_PARAM_BLOCK_SIZE)) != NULL &&
	    !OSSL_PARAM_set_size_t(p, d->blocksize))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_DIGEST_PARAM_SIZE)) != NULL &&
	    !OSSL_PARAM_set_size_t(p, d->size))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_DIGEST_PARAM_XOF)) != NULL && !OSSL_PARAM_set_int(p, 0))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_DIGEST_PARAM_ALGID_ABSENT)) != NULL &&
	    !OSSL_PARAM_set_int(p, 1))
		return 0;
	return 1;
}

#define WD_DIGEST(id, nm, sz, bs, ix)                                                           \
	static const struct wd_digest_desc wd_ddesc_##id = {nm, sz, bs, ix};                \
	static void *wd_dnewctx_##id(void *provctx)                                         \
	{                                                                                   \
		return wd_digest_newctx(provctx, &wd_ddesc_##id);                           \
	}                                                                                   \
	static int wd_dget_params_##id(OSSL_PARAM params[])                                 \
	{                                                                                   \
		return wd_digest_get_params(&wd_ddesc_##id, params);                        \
	}                                                                                   \
	static const OSSL_DISPATCH wd_dfns_##id[] = {                                       \
		{OSSL_FUNC_DIGEST_NEWCTX, (void (*)(void))wd_dnewctx_##id},                 \
		{OSSL_FUNC_DIGEST_FREECTX, (void (*)(void))wd_digest_freectx},              \
		{OSSL_FUNC_DIGEST_DUPCTX, (void (*)(void))wd_digest_dupctx},                \
		{OSSL_FUNC_DIGEST_INIT, (void (*)(void))wd_digest_init_fn},                 \
		{OSSL_FUNC_DIGEST_UPDATE, (void (*)(void))wd_digest_update_fn},             \
		{OSSL_FUNC_DIGEST_FINAL, (void (*)(void))wd_digest_final_fn},               \
		{OSSL_FUNC_DIGEST_GET_PARAMS, (void (*)(void))wd_dget_params_##id},         \
		{OSSL_FUNC_DIGEST_GETTABLE_PARAMS, (void (*)(void))wd_digest_gettable_params}, \
		{0, NULL}}

WD_DIGEST(sha1, "sha1", 20, 64, 0);
WD_DIGEST(sha224, "sha224", 28, 64, 1);
WD_DIGEST(sha256, "sha256", 32, 64, 2);
WD_DIGEST(sha384, "sha384", 48, 128, 3);
WD_DIGEST(sha512, "sha512", 64, 128, 4);

static const OSSL_ALGORITHM wd_digests[] = {
	{"SHA1:SHA-1:SSL3-SHA1:1.3.14.3.2.26", WD_PROPS, wd_dfns_sha1, "SHA-1 (WrapDrive)"},
	{"SHA2-224:SHA-224:SHA224:2.16.840.1.101.3.4.2.4", WD_PROPS, wd_dfns_sha224, "SHA-224 (WrapDrive)"},
	{"SHA2-256:SHA-256:SHA256:2.16.840.1.101.3.4.2.1", WD_PROPS, wd_dfns_sha256, "SHA-256 (WrapDrive)"},
	{"SHA2-384:SHA-384:SHA384:2.16.840.1.101.3.4.2.2", WD_PROPS, wd_dfns_sha384, "SHA-384 (WrapDrive)"},
	{"SHA2-512:SHA-512:SHA512:2.16.840.1.101.3.4.2.3", WD_PROPS, wd_dfns_sha512, "SHA-512 (WrapDrive)"},
	{NULL, NULL, NULL, NULL},
};

/* ---- provider ----------------------------------------------------------- */

static const OSSL_ALGORITHM *wd_query(void *provctx, int operation_id, int *no_cache)
{
	(void)provctx;
	*no_cache = 0;
	switch (operation_id) {
	case OSSL_OP_CIPHER:
		return wd_ciphers;
	case OSSL_OP_DIGEST:
		return wd_digests;
	}
	return NULL;
}

static const OSSL_PARAM wd_prov_gettable[] = {
	OSSL_PARAM_utf8_ptr(OSSL_PROV_PARAM_NAME, NULL, 0),
	OSSL_PARAM_utf8_ptr(OSSL_PROV_PARAM_VERSION, NULL, 0),
	OSSL_PARAM_utf8_ptr(OSSL_PROV_PARAM_BUILDINFO, NULL, 0),
	OSSL_PARAM_int(OSSL_PROV_PARAM_STATUS, NULL),
	OSSL_PARAM_END,
};

static const OSSL_PARAM *wd_prov_gettable_params(void *provctx)
{
	(void)provctx;
	return wd_prov_gettable;
}

static int wd_prov_get_params(void *provctx, OSSL_PARAM params[])
{
	OSSL_PARAM *p;
	(void)provctx;
	if ((p = OSSL_PARAM_locate(params, OSSL_PROV_PARAM_NAME)) != NULL &&
	    !OSSL_PARAM_set_utf8_ptr(p, "WrapDrive provider"))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_PROV_PARAM_VERSION)) != NULL &&
	    !OSSL_PARAM_set_utf8_ptr(p, "0.1.0"))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_PROV_PARAM_BUILDINFO)) != NULL &&
	    !OSSL_PARAM_set_utf8_ptr(p, "wd-sec device_api 1"))
		return 0;
	if ((p = OSSL_PARAM_locate(params, OSSL_PROV_PARAM_STATUS)) != NULL && !OSSL_PARAM_set_int(p, 1))
		return 0;
	return 1;
}

static void wd_teardown(void *provctx)
{
	pthread_mutex_lock(&wd_dcount_lock);
	int last = --wd_instances == 0;
	if (last && wd_dcount_key_live) {
		/* This thread's counts now; other threads' spare digest contexts
		 * are left to the process's end, but not their counts: their
		 * exit destructor goes with the key (no call of this provider
		 * is under way in them: this is the last instance). */
		wd_dthread_end(1);
		while (wd_dthreads != NULL) {
			struct wd_dthread *o = wd_dthreads;
			wd_dthread_unlist(o);
			wd_flush_counts(&o->counts);
		}
		(void)pthread_key_delete(wd_dcount_key);
		wd_dcount_key_live = 0;
		unsigned gen = wd_dcount_key_gen + 1;
		__atomic_store_n(&wd_dcount_key_gen, gen != 0 ? gen : 1, __ATOMIC_RELAXED);
	}
	/* Under the lock: an instance made meanwhile must find it made
	 * again, not freed under its first context. Other threads' spare
	 * digest contexts (plain digest state: no library context in them)
	 * may serve a later instance. */
	if (last)
		wd_cpu_fini();
	pthread_mutex_unlock(&wd_dcount_lock);
	OPENSSL_free(provctx);
}

static const OSSL_DISPATCH wd_prov_fns[] = {
	{OSSL_FUNC_PROVIDER_TEARDOWN, (void (*)(void))wd_teardown},
	{OSSL_FUNC_PROVIDER_QUERY_OPERATION, (void (*)(void))wd_query},
	{OSSL_FUNC_PROVIDER_GETTABLE_PARAMS, (void (*)(void))wd_prov_gettable_params},
	{OSSL_FUNC_PROVIDER_GET_PARAMS, (void (*)(void))wd_prov_get_params},
	{0, NULL},
};

/* A setting from the environment, else the provider's config section. */
static const char *wd_setting(struct wd_prov *p, const char *key, const char *env, char *buf,
			      size_t n)
{
	const char *v = getenv(env);
	if (v == NULL && p->core_get_params != NULL) {
		char *val = NULL;
		OSSL_PARAM req[] = {OSSL_PARAM_utf8_ptr(key, &val, 0), OSSL_PARAM_END};
		if (p->core_get_params(p->handle, req))
			v = val;
	}
	if (v == NULL)
		return NULL;
	/* Surrounding blanks are dropped, as the library's WD_CRYPTO_* are
	 * (before the length is judged: blanks do not make a value too long).
	 * A value too long for `buf` is cut and marked "...", so it cannot
	 * parse (cut alone, "000...0065536" read as 0). */
	while (*v == ' ' || *v == '\t' || *v == '\n')
		v++;
	size_t len = strlen(v);
	while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t' || v[len - 1] == '\n'))
		len--;
	if (len >= n) {
		memcpy(buf, v, n - 4);
		memcpy(buf + n - 4, "...", 4);
		return buf;
	}
	memcpy(buf, v, len);
	buf[len] = '\0';
	return buf;
}

/* The provider's settings as given (-1, or threshold_given 0, where not). */
struct wd_settings {
	int threshold_given;
	size_t threshold;
	int policy, fallback;
};

/* Index of `v` in `words` (n of them, compared without case), else -1. */
static int wd_word(const char *v, const char *const *words, int n)
{
	for (int i = 0; i < n; i++)
		if (OPENSSL_strcasecmp(v, words[i]) == 0)
			return i;
	return -1;
}

/* Refuse a setting: the error raised, and said on stderr too, since a
 * provider that a configuration file activates is left out with nothing
 * printed (everything then quietly runs on the default provider). */
static int wd_refuse_setting(const char *name, const char *value, const char *expected)
{
	ERR_raise_data(ERR_LIB_PROV, ERR_R_PASSED_INVALID_ARGUMENT,
		       "wd provider: %s '%s' is not %s", name, value, expected);
	fprintf(stderr, "wd provider: %s '%s' is not %s: the provider is not loaded\n", name,
		value, expected);
	return 0;
}

/* Parse the settings (wd_setting). A setting that does not parse refuses
 * the load, naming it (as OpenSSL's own configuration errors do), rather
 * than running with something the user did not ask for: 0, and the error
 * raised. */
static int wd_parse_settings(struct wd_prov *p, struct wd_settings *s)
{
	*s = (struct wd_settings){0, 0, -1, -1};
	char tb[64], pb[64], fbb[64];
	const char *t = wd_setting(p, "threshold", "WD_PROVIDER_THRESHOLD", tb, sizeof(tb));
	if (t != NULL) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(t, &end, 10);
		if (*t < '0' || *t > '9' || *end != '\0' || errno != 0)
			return wd_refuse_setting("threshold", t, "a byte count");
		s->threshold = (size_t)v;
		s->threshold_given = 1;
	}
	/* In WD_CRYPTO_POLICY_* order. */
	static const char *const policies[] = {"auto", "offload", "cpu"};
	const char *pol = wd_setting(p, "policy", "WD_PROVIDER_POLICY", pb, sizeof(pb));
	if (pol != NULL && (s->policy = wd_word(pol, policies, 3)) < 0)
		return wd_refuse_setting("policy", pol, "auto, offload or cpu");
	/* Off, then on: a word's index / 4. */
	static const char *const onoff[] = {"0", "no", "off", "false", "1", "yes", "on", "true"};
	const char *fb = wd_setting(p, "fallback", "WD_PROVIDER_FALLBACK", fbb, sizeof(fbb));
	if (fb != NULL) {
		int i = wd_word(fb, onoff, 8);
		if (i < 0)
			return wd_refuse_setting("fallback", fb, "1/yes/on/true or 0/no/off/false");
		s->fallback = i / 4;
	}
	return 1;
}

int OSSL_provider_init(const OSSL_CORE_HANDLE *handle, const OSSL_DISPATCH *in,
		       const OSSL_DISPATCH **out, void **provctx)
{
	struct wd_prov *p = OPENSSL_zalloc(sizeof(*p));
	if (p == NULL)
		return 0;
	p->handle = handle;
	for (; in->function_id != 0; in++)
		if (in->function_id == OSSL_FUNC_CORE_GET_PARAMS)
			p->core_get_params = OSSL_FUNC_core_get_params(in);
	/* Nothing is applied before every setting parsed: a refused load
	 * leaves the library's settings (which other instances and users
	 * share) as they were. */
	struct wd_settings set;
	if (!wd_parse_settings(p, &set)) {
		OPENSSL_free(p);
		return 0;
	}
	if (set.threshold_given)
		wd_crypto_set_threshold(set.threshold);
	if (set.policy >= 0)
		wd_crypto_set_policy(set.policy);
	if (set.fallback >= 0)
		wd_crypto_set_fallback(set.fallback);
	wd_fallback_on = wd_crypto_get_fallback();
	pthread_once(&wd_fork_once, wd_fork_handlers);
	pthread_mutex_lock(&wd_dcount_lock);
	wd_instances++;
	pthread_mutex_unlock(&wd_dcount_lock);
	*out = wd_prov_fns;
	*provctx = p;
	return 1;
}
