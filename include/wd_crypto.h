/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wd_crypto.h - WrapDrive cipher, AEAD and digest libraries (libwd_crypto:
 * link -lwd_crypto -lwd, or pkg-config wd_crypto).
 *
 * Sessions hold a key on the sec device (sent once, never per request).
 * Each thread gets its own queues; requests are staged in shared memory
 * and computed by the device, or on the CPU (OpenSSL's default
 * implementation) when they are below the threshold, when no queue can be
 * had, or when the host goes away. Every CPU request is counted
 * (wd_crypto_get_stats): the library never falls back silently.
 *
 * Algorithms: aes-{128,192,256}-{ecb,cbc,ctr}, aes-{128,256}-xts,
 * aes-{128,256}-gcm (wd_aead_*), sha1, sha224, sha256, sha384, sha512 and
 * hmac-<sha> (wd_digest_*).
 *
 * ABI rules are those of wd.h: 0 or a count on success, a negative errno
 * on failure (wd_strerror, wd_last_error); out-parameters written only on
 * success; NULL where a pointer is required is -EINVAL. A session is used
 * by one thread at a time (different sessions: any threads); a message,
 * cipher stream or job with requests on the device belongs to the thread
 * that sent them: another thread's call on it is -EBADFD and leaves it
 * as it was (finish it on its own thread). Input and
 * output may be the same buffer, or overlap: overlapping input is copied
 * first (a per-thread copy, kept between calls up to 2 MiB), and when that
 * copy, or the library's copy of AEAD additional data, cannot be
 * allocated the call is -ENOMEM. Passing a freed session is undefined.
 * After fork, sessions keep working in the child (on the child's own
 * queues, or the CPU), except a digest message already streaming on the
 * device (over a slot's worth of input): its state is the parent's, so
 * the child's calls on it are -EBADFD until wd_digest_final (also
 * -EBADFD) starts it over; likewise a job or AEAD message with requests
 * on the parent's queue.
 */
#ifndef WD_CRYPTO_H
#define WD_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wd_cipher;  /* block cipher session (ECB, CBC, CTR, XTS) */
struct wd_aead;    /* AES-GCM session */
struct wd_digest;  /* digest or HMAC */
struct wd_job;     /* a request started without waiting */

/* ---- block ciphers --------------------------------------------------- */

/* A session; encrypt: 1 to encrypt, 0 to decrypt. alg: as OpenSSL names
 * it ("aes-128-cbc", or an alias such as "AES128"; any case). -EINVAL:
 * unknown algorithm or wrong key length (XTS: two different halves). */
int wd_cipher_new(struct wd_cipher **out, const char *alg, const void *key,
		  size_t key_len, int encrypt);
/* Start a message: CBC IV, CTR counter block, XTS tweak (16 bytes; ECB
 * takes none). XTS needs one before every data unit. */
int wd_cipher_set_iv(struct wd_cipher *c, const void *iv, size_t iv_len);
/* Change direction (a new IV is then needed, except ECB). */
int wd_cipher_set_encrypt(struct wd_cipher *c, int encrypt);
/* The current chaining value (next CBC IV / CTR counter): 16 bytes. */
int wd_cipher_get_iv(struct wd_cipher *c, void *iv, size_t iv_len);
/* Process len bytes, continuing the message (chained across calls). ECB
 * and CBC take whole 16-byte blocks. Returns 0. */
int wd_cipher_update(struct wd_cipher *c, const void *in, void *out, size_t len);
/* As wd_cipher_update, on the device whatever the policy (for callers that
 * route with wd_crypto_route themselves; no queue still means the CPU). */
int wd_cipher_offload(struct wd_cipher *c, const void *in, void *out, size_t len);
/* Start a request without waiting: *job is NULL when it was computed at
 * once, else finish it with wd_job_poll/wd_job_wait (in and out must stay
 * valid, and in unchanged, until then: the device may work in them in
 * place; requests of one session complete in order). */
int wd_cipher_start(struct wd_cipher *c, const void *in, void *out, size_t len,
		    struct wd_job **job);
/* As wd_cipher_start, on the device whatever the policy (see
 * wd_cipher_offload). */
int wd_cipher_start_offload(struct wd_cipher *c, const void *in, void *out, size_t len,
			    struct wd_job **job);
void wd_cipher_free(struct wd_cipher *c);

/* 0 and the job is freed: the output is written. -EAGAIN: not yet.
 * -EBADFD: called on another thread than the one that started it (the
 * job is kept: finish it there). Another negative errno: failed (the job
 * is freed). */
int wd_job_poll(struct wd_job *job);
/* Wait for the job; 0 or a negative errno; the job is freed (but for
 * -EBADFD, as wd_job_poll). */
int wd_job_wait(struct wd_job *job);

/* Event-loop support for wd_cipher_start (this thread's cipher queue):
 * a descriptor that becomes readable after wd_crypto_arm() when a
 * completion is posted or the host goes away. wd_crypto_arm returns 0 when
 * armed, 1 when a completion is already there (the descriptor is then made
 * readable, so waiting on it returns at once) or when this thread has no
 * queue (nothing to wait for). wd_crypto_disarm after waking. */
int wd_crypto_wait_fd(void);
int wd_crypto_arm(void);
void wd_crypto_disarm(void);
/* After computing a request on the CPU inside an event loop while other
 * requests of this thread are on the device: 1 when completions are
 * waiting (the wait descriptor is made readable: yield to their owners),
 * else 0 with the descriptor armed for them (nothing when none is out). */
int wd_crypto_after_inline(void);
/* Hold the wait descriptor readable (on 1), until as many calls with on 0
 * give the holds back: for a waiter with no request of its own on the
 * device (a job that yielded to others), which no completion would wake
 * and whose wake-up no other wait may take (a synchronous request, or
 * another waiter, drains the descriptor). Give every hold back on the
 * thread that took it (a hold never given back keeps the descriptor
 * readable, and an event loop waking for ever); after the last, the
 * descriptor is quiet from the next wd_crypto_disarm. 0, or a negative
 * errno (-ENOTCONN: no queue on this thread). */
int wd_crypto_hold_readable(int on);

/* ---- AES-GCM ---------------------------------------------------------- */

int wd_aead_new(struct wd_aead **out, const char *alg, const void *key, size_t key_len);
/* One-shot: tag_len 4..16. wd_aead_open returns -EBADMSG on a wrong tag and
 * then writes no plaintext (pt is zeroed). */
int wd_aead_seal(struct wd_aead *a, const void *iv, size_t iv_len, const void *aad,
		 size_t aad_len, const void *pt, void *ct, size_t len, void *tag, size_t tag_len);
int wd_aead_open(struct wd_aead *a, const void *iv, size_t iv_len, const void *aad,
		 size_t aad_len, const void *ct, void *pt, size_t len, const void *tag,
		 size_t tag_len);
/* Streaming: begin, AAD (before data), data, then finish: encrypting
 * writes the tag, decrypting checks it (-EBADMSG). A finish refused with
 * -EAGAIN (every staging slot of the thread in flight) or -EBADFD leaves
 * the message under way: finish it again. */
int wd_aead_begin(struct wd_aead *a, int encrypt, const void *iv, size_t iv_len);
int wd_aead_aad(struct wd_aead *a, const void *aad, size_t len);
int wd_aead_update(struct wd_aead *a, const void *in, void *out, size_t len);
int wd_aead_finish(struct wd_aead *a, void *tag, size_t tag_len);
void wd_aead_free(struct wd_aead *a);

/* ---- digests and HMAC -------------------------------------------------- */

/* key: NULL/0 for plain digests; the HMAC key otherwise (any length up to
 * 1024 bytes). */
int wd_digest_new(struct wd_digest **out, const char *alg, const void *key, size_t key_len);
int wd_digest_update(struct wd_digest *d, const void *data, size_t len);
/* Write the digest (out_len >= its size) and start over; returns its size.
 * A long message streaming on the device is finished on the thread that
 * fed it: elsewhere -EBADFD, and the message is kept. */
int wd_digest_final(struct wd_digest *d, void *out, size_t out_len);
/* Digest size in bytes of a session. */
int wd_digest_size(struct wd_digest *d);
/* A copy of the state. A long message streaming on the device is copied
 * there, on the thread that feeds it (elsewhere -EBADFD). */
int wd_digest_dup(struct wd_digest *d, struct wd_digest **out);
void wd_digest_free(struct wd_digest *d);

/* ---- policy and counters ---------------------------------------------- */

#define WD_CRYPTO_POLICY_AUTO    0 /* offload what pays (async; sync when faster) */
#define WD_CRYPTO_POLICY_OFFLOAD 1 /* offload everything at or above the threshold */
#define WD_CRYPTO_POLICY_CPU     2 /* compute everything here */

/* Requests smaller than this run on the CPU; 0 = none do for their size
 * (the policy then decides every request: auto may still choose the CPU). Also
 * $WD_CRYPTO_THRESHOLD. */
int wd_crypto_set_threshold(size_t bytes);
/* Also $WD_CRYPTO_POLICY (auto, offload, cpu). */
int wd_crypto_set_policy(int policy);
/* 0: without a queue (no host, no device, host gone) requests fail with
 * -ENODEV/-ENOTCONN instead of running on the CPU. Also
 * $WD_CRYPTO_FALLBACK=0. Default 1. */
int wd_crypto_set_fallback(int on);

/* The current threshold, policy and fallback (1 on, 0 off). */
size_t wd_crypto_get_threshold(void);
int wd_crypto_get_policy(void);
int wd_crypto_get_fallback(void);

/* For callers that compute on the CPU themselves (an OpenSSL provider's
 * inline path): where should a request of len bytes run? Returns
 * WD_ROUTE_DEVICE, or a WD_CPU_* reason, possibly with WD_ROUTE_TIMED: then
 * time the request and report it with wd_crypto_record (this is how the
 * auto policy learns which path is cheaper). Count CPU requests with
 * wd_crypto_count_cpu (batching is fine). kind: WD_KIND_*. */
#define WD_KIND_CIPHER 0
#define WD_KIND_DIGEST 1
#define WD_KIND_AEAD   2 /* a GCM message's data (costs apart from ciphers') */
#define WD_CPU_THRESHOLD 1
#define WD_CPU_NO_QUEUE  2
#define WD_CPU_HOST_GONE 3
#define WD_CPU_POLICY    4
#define WD_ROUTE_DEVICE  0x100
#define WD_ROUTE_TIMED   0x200
int wd_crypto_route(int kind, size_t len, int async);
void wd_crypto_record(int kind, size_t len, int on_cpu, uint64_t ns);
void wd_crypto_count_cpu(uint64_t requests, uint64_t bytes, int reason);

/* A routing memo, for such callers that route every request of a context
 * (an OpenSSL cipher context): the library's threshold, policy and router
 * behind one inline call, so that a small request pays no call into the
 * library. Fill it with wd_route_memo_init (the settings of the moment:
 * make it after setting them); its fields are written by these functions
 * only (a caller may read them, e.g. whether the answer kept was made for
 * an asynchronous request). */
struct wd_route_memo {
	size_t threshold; /* requests below it stay on the CPU */
	int policy;       /* WD_CRYPTO_POLICY_* */
	int route;        /* the router's last answer, reused */
	int left;         /* for this many more requests */
	int async;        /* made for an asynchronous request */
	/* ... of a length within [from, from + span): about the size of the
	 * request it was made for (the router's costs depend on the size).
	 * Written with `left` by the inline functions only and read only
	 * while `left` is positive (wd_route_memo_init, which is older than
	 * these fields, leaves them). */
	size_t from, span;
};
void wd_route_memo_init(struct wd_route_memo *m);

/* How many requests reuse one answer of the router: asking per request
 * would cost more than a small request, and the router measures the paths
 * on the requests it is asked about. At least WD_ROUTE_MEMO_REUSE; for
 * small requests more, up to WD_ROUTE_MEMO_REUSE_MAX, so that the
 * requests between two questions carry about WD_ROUTE_MEMO_SPAN bytes
 * (a question costs about what 100 bytes of AES-CBC do). */
#define WD_ROUTE_MEMO_REUSE 15
#define WD_ROUTE_MEMO_REUSE_MAX 255
#define WD_ROUTE_MEMO_SPAN 65536
static inline int wd_route_memo_reuses(size_t len)
{
	size_t n = WD_ROUTE_MEMO_SPAN / (len > 0 ? len : 1);
	if (n < WD_ROUTE_MEMO_REUSE)
		return WD_ROUTE_MEMO_REUSE;
	return n > WD_ROUTE_MEMO_REUSE_MAX ? WD_ROUTE_MEMO_REUSE_MAX : (int)n;
}

/* WD_CPU_POLICY or WD_CPU_THRESHOLD when the settings alone keep a request
 * of len bytes on the CPU, else 0 (in the router's order: the cpu policy
 * first, as wd_crypto_route answers and the library counts). */
static inline int wd_route_memo_fixed(const struct wd_route_memo *m, size_t len)
{
	if (m->policy == WD_CRYPTO_POLICY_CPU)
		return WD_CPU_POLICY;
	if (len < m->threshold)
		return WD_CPU_THRESHOLD;
	return 0;
}

/* Whether the answer kept may serve a request of len bytes. */
static inline int wd_route_memo_holds(const struct wd_route_memo *m, size_t len)
{
	return m->left > 0 && len - m->from < m->span;
}

/* The reason of a CPU answer being reused for a request of len bytes (one
 * reuse is spent), else 0. */
static inline int wd_route_memo_reuse_cpu(struct wd_route_memo *m, size_t len)
{
	if (wd_route_memo_holds(m, len) && !(m->route & WD_ROUTE_DEVICE)) {
		m->left--;
		return m->route & 0xff;
	}
	return 0;
}

/* Where a request of len bytes runs, as wd_crypto_route answers (never
 * negative: an error means the device, which then says what is wrong).
 * An answer is reused wd_route_memo_reuses(len) times without
 * WD_ROUTE_TIMED, for the same kind of request (asynchronous or not) of
 * about the same size (half to twice its length), except an asynchronous
 * offload, which the router decides again each time as the device's load
 * changes. */
static inline int wd_route_memo_route(struct wd_route_memo *m, int kind, size_t len, int async)
{
	int why = wd_route_memo_fixed(m, len);
	if (why != 0)
		return why;
	if (m->async == async && wd_route_memo_holds(m, len)) {
		m->left--;
		return m->route & ~WD_ROUTE_TIMED;
	}
	int route = wd_crypto_route(kind, len, async);
	if (route < 0)
		route = WD_ROUTE_DEVICE;
	m->route = route;
	m->async = async;
	m->left = async && (route & WD_ROUTE_DEVICE) ? 0 : wd_route_memo_reuses(len);
	m->from = len / 2;
	m->span = len <= (size_t)-1 / 2 ? 2 * len - m->from : (size_t)-1 - m->from;
	return route;
}

/* Move a CBC or CTR stream between a session and the caller: the chaining
 * value (16 bytes) and, for CTR, the bytes used of that counter block. */
int wd_cipher_get_chain(struct wd_cipher *c, void *iv, size_t *num);
int wd_cipher_set_chain(struct wd_cipher *c, const void *iv, size_t num);

/* The counters wd ls shows under queues/q<ID>/client/, in that order. */
struct wd_crypto_stats {
	uint64_t offload_requests, offload_bytes;
	uint64_t cpu_requests, cpu_bytes;
	uint64_t cpu_below_threshold; /* small requests */
	uint64_t cpu_no_queue;        /* no host, no device or all queues busy */
	uint64_t cpu_host_gone;       /* the host went away */
	uint64_t cpu_policy;          /* the policy found the CPU cheaper */
};
int wd_crypto_get_stats(struct wd_crypto_stats *out);

/* In place (since WD_CRYPTO_0.3). With wd_crypto_set_in_place(1) (or
 * WD_CRYPTO_IN_PLACE=1) cipher requests (wd_cipher_update, wd_cipher_start
 * and their _offload forms) whose input and output are separate buffers
 * from wd_alloc (libwd.so), not overlapping, and digest input from
 * wd_alloc streamed on the device (messages over 64 KiB) are worked where
 * the caller has them, without staging copies. Off (0) by default: a
 * caller that writes its input and reads its output around each request
 * was slower in place here (wd speed). -EINVAL for another value.
 * wd_crypto_get_in_place_bytes: of offload_bytes, those worked in place. */
int wd_crypto_set_in_place(int on);
int wd_crypto_get_in_place_bytes(uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif /* WD_CRYPTO_H */
