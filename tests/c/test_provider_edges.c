/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The WrapDrive OpenSSL provider at its edges, against the default
 * provider (or the header's word): async jobs beyond the staging slots,
 * beside synchronous and GCM requests, through the death of their host;
 * GCM tags after a short one; copies after a direction change; CTR's
 * original IV; the errors of a bad final block.
 *
 * Usage: test_provider_edges <dir of wd.so> [test-name ...]. The host is
 * $WD_HOST (WD_HOST=embedded works); run with
 * WD_PROVIDER_POLICY=offload WD_PROVIDER_THRESHOLD=0 for the device path.
 * async_jobs_survive_host_death runs only when named, with
 * WD_TEST_KILL_PID the pid of the host to kill.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include <openssl/async.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/provider.h>

#include "wd_crypto.h"

#include "provider_check.h"

/* ---- async jobs holding every staging slot ------------------------------- */

/* 40 jobs on one thread each encrypt 1 MiB (16 staging slots of 64 KiB)
 * with AES-128-CBC, all started before any is resumed. The thread has 64
 * slots: once 4 jobs are paused on the device, the next job's request
 * finds no free slot, and the library answers -EAGAIN (Busy: "try
 * again"). A synchronous request in that state is computed on the CPU
 * (Cipher::after_device); the provider's async path instead fails
 * EVP_EncryptUpdate (wd_blocks -> wd_fail), so `openssl speed -async_jobs
 * 8 -bytes 1048576` or any async application with large records loses
 * requests. Expected: every job succeeds with the default provider's
 * result. */
#define BIG (1u << 20)
struct big_job {
	EVP_CIPHER *c;
	unsigned char key[16], iv[16];
	unsigned char *in, *out;
	int requests; /* of BIG bytes each, one message */
	int ok;
};

static int big_job_fn(void *varg)
{
	struct big_job *a = *(struct big_job **)varg;
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int l = 0;
	a->ok = EVP_EncryptInit_ex2(ctx, a->c, a->key, a->iv, NULL) &&
		EVP_CIPHER_CTX_set_padding(ctx, 0);
	for (int k = 0; a->ok && k < a->requests; k++)
		a->ok = EVP_EncryptUpdate(ctx, a->out + (size_t)k * BIG, &l, a->in + (size_t)k * BIG,
					  BIG) &&
			l == (int)BIG;
	EVP_CIPHER_CTX_free(ctx);
	return a->ok;
}

/* Job `a` of `requests` requests through cipher `c`, with its own data. */
static void big_job_init(struct big_job *a, EVP_CIPHER *c, int requests)
{
	fill(a->key, 16);
	fill(a->iv, 16);
	a->in = malloc((size_t)requests * BIG);
	a->out = malloc((size_t)requests * BIG);
	fill(a->in, (size_t)requests * BIG);
	a->c = c;
	a->requests = requests;
	a->ok = 0;
}

/* Async jobs work here, and AES-128-CBC is fetched from both providers
 * (this one's in cs[0], the default's in cs[1]). */
static int big_jobs_ready(EVP_CIPHER *cs[2])
{
	CHECK(ASYNC_is_capable(), "async jobs work here");
	if (!ASYNC_is_capable())
		return 0;
	fetch_both("AES-128-CBC", cs);
	return cs[0] && cs[1];
}

/* Start or resume job `a`: 1 once it is over, 0 while it is paused. */
static int big_job_step(struct big_job *a, ASYNC_JOB **job, ASYNC_WAIT_CTX *w)
{
	int ret;
	return ASYNC_start_job(job, w, &ret, big_job_fn, &a, sizeof a) != ASYNC_PAUSE;
}

/* Each of the n jobs succeeded with the default provider's (`ref`)
 * result; their memory and wait contexts freed. */
static void big_jobs_check(struct big_job *args, ASYNC_WAIT_CTX **wctx, int n, EVP_CIPHER *ref)
{
	for (int i = 0; i < n; i++) {
		size_t len = (size_t)args[i].requests * BIG;
		unsigned char *want = malloc(len);
		EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
		int l = 0;
		EVP_EncryptInit_ex2(ctx, ref, args[i].key, args[i].iv, NULL);
		EVP_CIPHER_CTX_set_padding(ctx, 0);
		EVP_EncryptUpdate(ctx, want, &l, args[i].in, (int)len);
		EVP_CIPHER_CTX_free(ctx);
		CHECK(args[i].ok && !memcmp(want, args[i].out, len),
		      "async job %d of %d (%d x 1 MiB) has the default provider's result (ok %d)", i, n,
		      args[i].requests, args[i].ok);
		free(want);
		ASYNC_WAIT_CTX_free(wctx[i]);
		free(args[i].in);
		free(args[i].out);
	}
}

static void async_jobs_more_than_the_slots(void)
{
	enum { N = 40 };
	EVP_CIPHER *cs[2];
	if (!big_jobs_ready(cs))
		return;
	static struct big_job args[N];
	ASYNC_JOB *jobs[N] = {0};
	ASYNC_WAIT_CTX *wctx[N];
	int done[N] = {0}, left = N;
	for (int i = 0; i < N; i++) {
		big_job_init(&args[i], cs[0], 1);
		wctx[i] = ASYNC_WAIT_CTX_new();
		if (big_job_step(&args[i], &jobs[i], wctx[i])) {
			done[i] = 1;
			left--;
		}
	}
	for (int rounds = 0; left > 0 && rounds < 100000; rounds++) {
		fd_set set;
		FD_ZERO(&set);
		int maxfd = -1;
		for (int i = 0; i < N; i++) {
			size_t nfd = 0;
			OSSL_ASYNC_FD fd;
			if (done[i] || !ASYNC_WAIT_CTX_get_all_fds(wctx[i], NULL, &nfd) || nfd != 1)
				continue;
			ASYNC_WAIT_CTX_get_all_fds(wctx[i], &fd, &nfd);
			FD_SET(fd, &set);
			if (fd > maxfd)
				maxfd = fd;
		}
		struct timeval tv = {1, 0};
		if (maxfd >= 0)
			select(maxfd + 1, &set, NULL, NULL, &tv);
		for (int i = 0; i < N; i++) {
			if (!done[i] && big_job_step(&args[i], &jobs[i], wctx[i])) {
				done[i] = 1;
				left--;
			}
		}
	}
	CHECK(left == 0, "all jobs finished");
	big_jobs_check(args, wctx, N, cs[1]);
	free_both(cs);
}

/* ---- GCM: the tag of an encryption after a decryption with a short tag --- */

/* A context decrypts a message whose tag is 12 bytes (SET_TAG 12), then is
 * initialised again to encrypt with a new IV. The default provider makes
 * the whole 16-byte tag of the encryption (ossl_gcm_cipher_final always
 * computes GCM_TAG_MAX_SIZE); the wd provider computes only the last
 * taglen (12) on the device and hands out 4 stale bytes for GET_TAG 16. */
static void gcm_tag_after_short_tag_decrypt(void)
{
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-GCM", cs);
	if (!cs[0] || !cs[1])
		return;
	unsigned char key[16], iv1[12], iv2[12], pt[1024], ct[1024], ct2[2][1024], back[1024];
	unsigned char tag1[16], tag2[2][16];
	fill(key, sizeof key);
	fill(iv1, sizeof iv1);
	fill(iv2, sizeof iv2);
	fill(pt, sizeof pt);
	/* The message to decrypt, and its tag, by the default provider. */
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	int l = 0;
	EVP_EncryptInit_ex2(c, cs[1], key, iv1, NULL);
	EVP_EncryptUpdate(c, ct, &l, pt, sizeof pt);
	EVP_EncryptFinal_ex(c, ct + l, &l);
	EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag1);
	EVP_CIPHER_CTX_free(c);
	int ok[2];
	for (int k = 0; k < 2; k++) {
		c = EVP_CIPHER_CTX_new();
		memset(tag2[k], 0xee, 16);
		ok[k] = EVP_DecryptInit_ex2(c, cs[k], key, iv1, NULL) &&
			EVP_DecryptUpdate(c, back, &l, ct, sizeof ct) &&
			EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 12, tag1) > 0 &&
			EVP_DecryptFinal_ex(c, back + l, &l) && !memcmp(back, pt, sizeof pt);
		ok[k] = ok[k] && EVP_EncryptInit_ex2(c, NULL, NULL, iv2, NULL) &&
			EVP_EncryptUpdate(c, ct2[k], &l, pt, sizeof pt) &&
			EVP_EncryptFinal_ex(c, ct2[k] + l, &l) &&
			EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag2[k]) > 0;
		EVP_CIPHER_CTX_free(c);
	}
	CHECK(ok[0] && ok[1], "decrypt (12-byte tag) then encrypt on one context: wd %d default %d", ok[0],
	      ok[1]);
	CHECK(!memcmp(ct2[0], ct2[1], sizeof pt), "the same ciphertext");
	CHECK(!memcmp(tag2[0], tag2[1], 16),
	      "the same 16-byte tag: wd ..%02x%02x%02x%02x, default ..%02x%02x%02x%02x", tag2[0][12],
	      tag2[0][13], tag2[0][14], tag2[0][15], tag2[1][12], tag2[1][13], tag2[1][14], tag2[1][15]);
	free_both(cs);
}

/* ---- GCM: a final that can be made again ---------------------------------- */

/* A decryption finished before its tag was set fails and leaves the
 * message under way: set the tag, finish again, as the default provider
 * lets a caller do (the wd provider checked against a tag of zeros and
 * ended the message). A tag set without its bytes (only a length) is
 * refused in both directions. */
static void gcm_final_before_the_tag(void)
{
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-GCM", cs);
	if (!cs[0] || !cs[1])
		return;
	unsigned char key[16], iv[12], pt[4096], ct[4096], back[4096], tag[16];
	fill(key, sizeof key);
	fill(iv, sizeof iv);
	fill(pt, sizeof pt);
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	int l = 0;
	EVP_EncryptInit_ex2(c, cs[1], key, iv, NULL);
	EVP_EncryptUpdate(c, ct, &l, pt, sizeof pt);
	EVP_EncryptFinal_ex(c, ct + l, &l);
	EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag);
	EVP_CIPHER_CTX_free(c);
	for (int k = 0; k < 2; k++) {
		const char *who = k == 0 ? "wd" : "default";
		c = EVP_CIPHER_CTX_new();
		memset(back, 0, sizeof back);
		int ok = EVP_DecryptInit_ex2(c, cs[k], key, iv, NULL) &&
			 EVP_DecryptUpdate(c, back, &l, ct, sizeof ct);
		int early = EVP_DecryptFinal_ex(c, back + l, &l);
		ERR_clear_error();
		int set = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 16, tag) > 0;
		int again = EVP_DecryptFinal_ex(c, back + l, &l);
		CHECK(ok && !early && set && again && !memcmp(back, pt, sizeof pt),
		      "%s: a final before the tag fails (%d), with the tag set it succeeds (%d)", who,
		      early, again);
		EVP_CIPHER_CTX_free(c);
		for (int enc = 0; enc <= 1; enc++) {
			c = EVP_CIPHER_CTX_new();
			int init = EVP_CipherInit_ex2(c, cs[k], key, iv, enc, NULL);
			int r = EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 12, NULL);
			ERR_clear_error();
			CHECK(init && r <= 0, "%s: SET_TAG(12, NULL) refused when %s (%d)", who,
			      enc ? "encrypting" : "decrypting", r);
			EVP_CIPHER_CTX_free(c);
		}
	}
	free_both(cs);
}

/* A GCM message on the device finished on another thread than the one
 * that began it: the library refuses the finish (-EBADFD: the message's
 * requests go through its thread's queue) before sending anything, and
 * the message stays under way, to be finished on its own thread with the
 * default provider's tag (the wd provider had ended the message first,
 * so that final failed too; a final refused with -EAGAIN, every staging
 * slot of the thread held by its paused jobs, took the same way). Only
 * meaningful with WD_PROVIDER_POLICY=offload (elsewhere the message may
 * run inline, where any thread may finish it). */
static void *gcm_final_fn(void *arg)
{
	unsigned char rest[16];
	int l = 0;
	return (void *)(intptr_t)EVP_EncryptFinal_ex(arg, rest, &l);
}

static void gcm_final_on_another_thread(void)
{
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-GCM", cs);
	if (!cs[0] || !cs[1])
		return;
	unsigned char key[16], iv[12], pt[65536], ct[2][65536], tag[2][16];
	fill(key, sizeof key);
	fill(iv, sizeof iv);
	fill(pt, sizeof pt);
	int l = 0, l2 = 0, ok[2], done_there = 0;
	for (int k = 0; k < 2; k++) {
		EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
		ok[k] = EVP_EncryptInit_ex2(c, cs[k], key, iv, NULL) &&
			EVP_EncryptUpdate(c, ct[k], &l, pt, sizeof pt) && l == (int)sizeof pt;
		if (k == 0) {
			pthread_t t;
			void *r = NULL;
			pthread_create(&t, NULL, gcm_final_fn, c);
			pthread_join(t, &r);
			done_there = r != NULL;
			ERR_clear_error();
		}
		ok[k] = ok[k] && ((k == 0 && done_there) || EVP_EncryptFinal_ex(c, ct[k] + l, &l2)) &&
			EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_GET_TAG, 16, tag[k]) > 0;
		EVP_CIPHER_CTX_free(c);
	}
	CHECK(ok[0] && ok[1] && !memcmp(ct[0], ct[1], sizeof pt) && !memcmp(tag[0], tag[1], 16),
	      "a GCM final refused on another thread (%s) is made again on its own: the default "
	      "provider's tag",
	      done_there ? "it was not" : "it was");
	free_both(cs);
}

/* ---- CBC copied after a change of direction without an IV ---------------- */

/* EVP_CipherInit_ex(ctx, NULL, NULL, NULL, NULL, 0) turns an encrypting CBC
 * context into a decrypting one on the same key and IV (the wd provider
 * starts its inline context again from the key and the original IV).
 * EVP_CIPHER_CTX_copy of such a context works with the default provider;
 * the wd provider refuses it: dupctx asks the device session for its chain
 * (wd_cipher_get_chain), which the change of direction reset
 * (wd_cipher_set_encrypt), although the chain is in the inline context
 * (chain_here). Expected: the copy succeeds and decrypts as the original
 * does. */
static void cbc_copy_after_direction_change(void)
{
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-CBC", cs);
	if (!cs[0] || !cs[1])
		return;
	unsigned char key[16], iv[16], pt[64], ct[64], a[64], b[64];
	fill(key, sizeof key);
	fill(iv, sizeof iv);
	fill(pt, sizeof pt);
	int l = 0;
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	EVP_EncryptInit_ex2(c, cs[1], key, iv, NULL);
	EVP_CIPHER_CTX_set_padding(c, 0);
	EVP_EncryptUpdate(c, ct, &l, pt, sizeof pt);
	EVP_CIPHER_CTX_free(c);
	int copied[2];
	for (int k = 0; k < 2; k++) {
		c = EVP_CIPHER_CTX_new();
		EVP_CIPHER_CTX *d = EVP_CIPHER_CTX_new();
		int ok = EVP_EncryptInit_ex2(c, cs[k], key, iv, NULL) &&
			 EVP_CipherInit_ex(c, NULL, NULL, NULL, NULL, 0) &&
			 EVP_CIPHER_CTX_set_padding(c, 0);
		CHECK(ok, "init, then a decrypt init with no key or IV (%s)", k ? "default" : "wd");
		copied[k] = ok && EVP_CIPHER_CTX_copy(d, c);
		if (k == 0 && copied[0]) {
			memset(a, 0, sizeof a);
			memset(b, 1, sizeof b);
			CHECK(EVP_DecryptUpdate(c, a, &l, ct, sizeof ct) && EVP_DecryptUpdate(d, b, &l, ct, sizeof ct),
			      "both decrypt");
			CHECK(!memcmp(a, b, sizeof a) && !memcmp(a, pt, sizeof a),
			      "the copy decrypts as the original does (the plaintext)");
		}
		EVP_CIPHER_CTX_free(c);
		EVP_CIPHER_CTX_free(d);
	}
	CHECK(copied[0] && copied[1], "EVP_CIPHER_CTX_copy: wd %d, default %d", copied[0], copied[1]);
	free_both(cs);
}

/* ---- CTR: the original IV after an init without an IV ------------------- */

/* A CTR stream initialised again without an IV goes on from its running
 * counter (docs/provider.md), as the default provider's does. The
 * default provider keeps the original IV (oiv) for
 * EVP_CIPHER_CTX_get_original_iv / OSSL_CIPHER_PARAM_IV; the wd provider
 * overwrites x->iv with the running counter (wd_cipher_init: iv =
 * ctr_next; memcpy(x->iv, iv, ...)), so the "original" IV it reports is
 * the counter. Expected: the IV given at the first init. */
static void ctr_original_iv_after_reinit(void)
{
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-CTR", cs);
	if (!cs[0] || !cs[1])
		return;
	unsigned char key[16], iv[16], pt[100], out[2][100], oiv[2][16];
	fill(key, sizeof key);
	fill(iv, sizeof iv);
	fill(pt, sizeof pt);
	int ok[2];
	for (int k = 0; k < 2; k++) {
		EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
		int l = 0;
		memset(oiv[k], 0, 16);
		ok[k] = EVP_EncryptInit_ex2(c, cs[k], key, iv, NULL) &&
			EVP_EncryptUpdate(c, out[k], &l, pt, 40) &&
			EVP_EncryptInit_ex2(c, NULL, NULL, NULL, NULL) &&
			EVP_EncryptUpdate(c, out[k] + 40, &l, pt + 40, 60) &&
			EVP_CIPHER_CTX_get_original_iv(c, oiv[k], 16);
		EVP_CIPHER_CTX_free(c);
	}
	CHECK(ok[0] && ok[1], "CTR init, update, init without IV, update: wd %d default %d", ok[0], ok[1]);
	CHECK(!memcmp(out[0], out[1], sizeof pt), "the same keystream (goes on at the next block)");
	CHECK(!memcmp(oiv[1], iv, 16), "the default provider reports the IV given");
	CHECK(!memcmp(oiv[0], iv, 16), "the wd provider reports the IV given as the original IV");
	free_both(cs);
}

/* ---- async: a synchronous GCM request while another job waits ---------- */

/* Two ASYNC jobs on one thread. Job A encrypts 1 MiB with AES-128-CBC and
 * pauses on the device, its wait descriptor armed. Job B then seals a
 * 64 KiB AES-GCM message: GCM is never paused, its device requests wait
 * synchronously on the same cipher queue (Queue::wait), reaping A's
 * completions into the stash and draining the completion eventfd. B
 * finishes; nothing makes the descriptor readable again for A (the cipher
 * path calls wd_crypto_after_inline in that case, the GCM path does not),
 * so an event loop waiting on A's descriptor (openssl speed waits with no
 * timeout) sleeps forever with A's result already received: a lost
 * wake-up. Expected: A's descriptor becomes readable. */
struct mix_job {
	EVP_CIPHER *c;
	int gcm;
	unsigned char key[16], iv[16];
	unsigned char *in, *out;
	size_t len;
	int ok;
};

static int mix_job_fn(void *varg)
{
	struct mix_job *a = *(struct mix_job **)varg;
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int l = 0, l2 = 0;
	a->ok = EVP_EncryptInit_ex2(ctx, a->c, a->key, a->iv, NULL) &&
		(a->gcm || EVP_CIPHER_CTX_set_padding(ctx, 0)) &&
		EVP_EncryptUpdate(ctx, a->out, &l, a->in, (int)a->len) &&
		EVP_EncryptFinal_ex(ctx, a->out + l, &l2);
	EVP_CIPHER_CTX_free(ctx);
	return a->ok;
}

static void async_beside_a_paused_job(int b_outside)
{
	CHECK(ASYNC_is_capable(), "async jobs work here");
	if (!ASYNC_is_capable())
		return;
	EVP_CIPHER *cbc = EVP_CIPHER_fetch(NULL, "AES-128-CBC", "provider=wd");
	EVP_CIPHER *gcm = EVP_CIPHER_fetch(NULL, "AES-128-GCM", "provider=wd");
	CHECK(cbc && gcm, "fetch");
	if (!cbc || !gcm)
		return;
	int stuck_rounds = 0;
	for (int round = 0; round < 20; round++) {
		static struct mix_job a, b;
		a.c = cbc;
		a.gcm = 0;
		a.len = 1u << 20;
		b.c = gcm;
		b.gcm = 1;
		b.len = 64u << 10;
		struct mix_job *jobs_arg[2] = {&a, &b};
		for (int i = 0; i < 2; i++) {
			struct mix_job *m = jobs_arg[i];
			fill(m->key, 16);
			fill(m->iv, 16);
			m->in = malloc(m->len);
			m->out = malloc(m->len + 16);
			fill(m->in, m->len);
			m->ok = 0;
		}
		ASYNC_JOB *ja = NULL, *jb = NULL;
		ASYNC_WAIT_CTX *wa = ASYNC_WAIT_CTX_new(), *wb = ASYNC_WAIT_CTX_new();
		int ret, ra, rb = 0;
		struct mix_job *pa = &a, *pb = &b;
		ra = ASYNC_start_job(&ja, wa, &ret, mix_job_fn, &pa, sizeof pa);
		if (b_outside) {
			/* B: a synchronous CBC request of the thread itself,
			 * outside any job (an event loop's own work). */
			b.c = cbc;
			b.gcm = 0;
			mix_job_fn(&pb);
		} else {
			rb = ASYNC_start_job(&jb, wb, &ret, mix_job_fn, &pb, sizeof pb);
			while (rb == ASYNC_PAUSE) /* B never pauses here */
				rb = ASYNC_start_job(&jb, wb, &ret, mix_job_fn, &pb, sizeof pb);
		}
		int woke = 1;
		while (ra == ASYNC_PAUSE) {
			size_t nfd = 0;
			OSSL_ASYNC_FD fd = -1;
			if (ASYNC_WAIT_CTX_get_all_fds(wa, NULL, &nfd) && nfd == 1)
				ASYNC_WAIT_CTX_get_all_fds(wa, &fd, &nfd);
			if (fd >= 0) {
				fd_set set;
				FD_ZERO(&set);
				FD_SET(fd, &set);
				struct timeval tv = {3, 0};
				if (select(fd + 1, &set, NULL, NULL, &tv) <= 0 && woke) {
					woke = 0; /* lost: resume it anyway to end the test */
				}
			}
			ra = ASYNC_start_job(&ja, wa, &ret, mix_job_fn, &pa, sizeof pa);
		}
		if (!woke)
			stuck_rounds++;
		CHECK(a.ok && b.ok, "both jobs succeed (round %d: cbc %d gcm %d)", round, a.ok, b.ok);
		ASYNC_WAIT_CTX_free(wa);
		ASYNC_WAIT_CTX_free(wb);
		for (int i = 0; i < 2; i++) {
			free(jobs_arg[i]->in);
			free(jobs_arg[i]->out);
		}
		if (stuck_rounds > 0)
			break;
	}
	CHECK(stuck_rounds == 0,
	      "the paused CBC job's wait descriptor became readable (no wake-up within 3 s)");
	EVP_CIPHER_free(cbc);
	EVP_CIPHER_free(gcm);
}

static void async_gcm_beside_a_paused_job(void)
{
	async_beside_a_paused_job(0);
}

/* The same lost wake-up when the thread itself (outside any job) makes a
 * synchronous device request while its job A is paused: wd_blocks'
 * synchronous path (wd_cipher_offload) waits on the cipher queue and
 * drains the signal, with no wd_crypto_after_inline after it. */
static void sync_request_beside_a_paused_job(void)
{
	async_beside_a_paused_job(1);
}

/* More async jobs of 1 MiB than this thread's staging holds (64 in the
 * two large areas, 4 in the slots): a job that finds none is computed here and
 * then yields to the paused jobs whose results are in (else it went on
 * computing here while the device idled). An event loop that resumes a
 * job only when that job's own descriptor is readable (checked just
 * before, one job at a time, as an epoll loop would) must see every
 * paused job woken, the yielded ones included, whose wake-up another
 * job may consume first. Each job sends one request, then three in
 * another round (a job that yielded is then the last one waiting, or
 * goes on beside others). */
static void yielded_jobs_get_their_wake_up(int requests)
{
	enum { N = 80, HOLD = 68 };
	EVP_CIPHER *cs[2];
	if (!big_jobs_ready(cs))
		return;
	static struct big_job args[N];
	ASYNC_JOB *jobs[N] = {0};
	ASYNC_WAIT_CTX *wctx[N];
	int done[N] = {0}, left = N, lost = 0;
	for (int i = 0; i < N; i++) {
		/* The first HOLD hold the staging; once their results are in,
		 * each later one is computed here and yields to them. */
		if (i == HOLD)
			usleep(100 * 1000);
		big_job_init(&args[i], cs[0], requests);
		wctx[i] = ASYNC_WAIT_CTX_new();
		if (big_job_step(&args[i], &jobs[i], wctx[i])) {
			done[i] = 1;
			left--;
		}
	}
	for (int rounds = 0; left > 0 && rounds < 100000; rounds++) {
		for (int i = 0; i < N; i++) {
			if (done[i])
				continue;
			size_t nfd = 0;
			OSSL_ASYNC_FD fd = -1;
			if (ASYNC_WAIT_CTX_get_all_fds(wctx[i], NULL, &nfd) && nfd == 1)
				ASYNC_WAIT_CTX_get_all_fds(wctx[i], &fd, &nfd);
			if (fd >= 0) {
				fd_set set;
				FD_ZERO(&set);
				FD_SET(fd, &set);
				struct timeval tv = {3, 0};
				if (select(fd + 1, &set, NULL, NULL, &tv) <= 0)
					lost++; /* resumed anyway, to end the test */
			}
			if (big_job_step(&args[i], &jobs[i], wctx[i])) {
				done[i] = 1;
				left--;
			}
		}
		if (lost > 0)
			break;
	}
	CHECK(lost == 0,
	      "every paused job's descriptor became readable (%d requests per job: %d waits of 3 s ran out)",
	      requests, lost);
	/* Resumed whatever their descriptors say, so the jobs end. */
	for (int rounds = 0; left > 0 && rounds < 100000; rounds++)
		for (int i = 0; i < N; i++) {
			if (!done[i] && big_job_step(&args[i], &jobs[i], wctx[i])) {
				done[i] = 1;
				left--;
			}
		}
	CHECK(left == 0, "all jobs finished");
	big_jobs_check(args, wctx, N, cs[1]);
	free_both(cs);
}

static void yielded_jobs_each_get_their_wake_up(void)
{
	yielded_jobs_get_their_wake_up(1);
	yielded_jobs_get_their_wake_up(3);
}

/* ---- async jobs when the host dies ---------------------------------------- */

/* Needs WD_TEST_KILL_PID: the pid of the host ($WD_HOST) to kill. 3 jobs
 * encrypt 1 MiB each with AES-128-CBC and pause on the device; the host
 * is killed (SIGKILL); the jobs are resumed. A synchronous request whose
 * host dies is redone on the CPU from the saved chain (docs/provider.md:
 * "no host: everything runs on the CPU"; test_provider's host-killed
 * stream must "still come out right"), and the job's input is intact (it
 * was staged): expected every job to succeed with the default provider's
 * result. The provider fails EVP_EncryptUpdate instead (wd_job_poll's
 * HostGone goes to wd_fail). */
static void async_jobs_survive_host_death(void)
{
	enum { N = 3, LEN = 1 << 20 };
	const char *pid = getenv("WD_TEST_KILL_PID");
	CHECK(pid != NULL && ASYNC_is_capable(), "WD_TEST_KILL_PID names the host, async jobs work");
	if (pid == NULL || !ASYNC_is_capable())
		return;
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-CBC", cs);
	if (!cs[0] || !cs[1])
		return;
	static struct mix_job args[N];
	ASYNC_JOB *jobs[N] = {0};
	ASYNC_WAIT_CTX *w[N];
	int r[N], ret, paused = 0;
	for (int i = 0; i < N; i++) {
		args[i].c = cs[0];
		args[i].gcm = 0;
		args[i].len = LEN;
		fill(args[i].key, 16);
		fill(args[i].iv, 16);
		args[i].in = malloc(LEN);
		args[i].out = malloc(LEN + 16);
		fill(args[i].in, LEN);
		w[i] = ASYNC_WAIT_CTX_new();
		struct mix_job *p = &args[i];
		r[i] = ASYNC_start_job(&jobs[i], w[i], &ret, mix_job_fn, &p, sizeof p);
		paused += r[i] == ASYNC_PAUSE;
	}
	kill((pid_t)atoi(pid), SIGKILL);
	usleep(200 * 1000);
	for (int i = 0; i < N; i++) {
		struct mix_job *p = &args[i];
		for (int k = 0; r[i] == ASYNC_PAUSE && k < 1000; k++)
			r[i] = ASYNC_start_job(&jobs[i], w[i], &ret, mix_job_fn, &p, sizeof p);
	}
	fprintf(stderr, "(%d of %d jobs were paused on the device when the host died)\n", paused, N);
	static unsigned char want[LEN + 16];
	for (int i = 0; i < N; i++) {
		EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
		int l = 0;
		EVP_EncryptInit_ex2(c, cs[1], args[i].key, args[i].iv, NULL);
		EVP_CIPHER_CTX_set_padding(c, 0);
		EVP_EncryptUpdate(c, want, &l, args[i].in, LEN);
		EVP_CIPHER_CTX_free(c);
		CHECK(r[i] == ASYNC_FINISH && args[i].ok && !memcmp(want, args[i].out, LEN),
		      "job %d survives the host's death (ok %d)", i, args[i].ok);
		ASYNC_WAIT_CTX_free(w[i]);
		free(args[i].in);
		free(args[i].out);
	}
	free_both(cs);
}

/* ---- CBC decryption with a bad final block: the error reported ---------- */

/* A padded CBC decryption whose last block does not unpad (a wrong key,
 * corrupted data) fails EVP_DecryptFinal_ex with the default provider's
 * "bad decrypt" (ERR_LIB_PROV, PROV_R_BAD_DECRYPT) on the error queue:
 * what `openssl enc -d` prints and what applications look for. The wd
 * provider fails with nothing on the error queue (wd_cipher_final_body
 * returns 0 without ERR_raise). Likewise a final block of the wrong length
 * (PROV_R_WRONG_FINAL_BLOCK_LENGTH). Expected: the same reasons. */
static void cbc_bad_decrypt_reports_the_error(void)
{
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-CBC", cs);
	if (!cs[0] || !cs[1])
		return;
	unsigned char key[16], key2[16], iv[16], pt[40], ct[64], back[80];
	fill(key, sizeof key);
	fill(key2, sizeof key2);
	fill(iv, sizeof iv);
	fill(pt, sizeof pt);
	int l = 0, cl = 0;
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	EVP_EncryptInit_ex2(c, cs[1], key, iv, NULL);
	EVP_EncryptUpdate(c, ct, &l, pt, sizeof pt);
	cl = l;
	EVP_EncryptFinal_ex(c, ct + cl, &l);
	cl += l;
	EVP_CIPHER_CTX_free(c);
	for (int bad_len = 0; bad_len < 2; bad_len++) {
		int reason[2], fin[2];
		for (int k = 0; k < 2; k++) {
			ERR_clear_error();
			c = EVP_CIPHER_CTX_new();
			int ok = EVP_DecryptInit_ex2(c, cs[k], bad_len ? key : key2, iv, NULL) &&
				 EVP_DecryptUpdate(c, back, &l, ct, bad_len ? cl - 3 : cl);
			fin[k] = ok && EVP_DecryptFinal_ex(c, back + l, &l);
			unsigned long e = ERR_peek_last_error();
			reason[k] = ERR_GET_LIB(e) == ERR_LIB_PROV ? ERR_GET_REASON(e) : -1;
			EVP_CIPHER_CTX_free(c);
		}
		ERR_clear_error();
		CHECK(!fin[0] && !fin[1], "%s: the final fails (wd %d default %d)",
		      bad_len ? "a short last block" : "a wrong key", fin[0], fin[1]);
		CHECK(reason[0] == reason[1], "%s: the error reason: wd %d, default %d",
		      bad_len ? "a short last block" : "a wrong key", reason[0], reason[1]);
	}
	free_both(cs);
}

/* ---- main -------------------------------------------------------------- */

/* ---- XTS without a tweak, the raw call, GCM tag length and bytes counted, a refused load ---- */

/* EVP_Cipher, the raw call, on short and partial lengths. */
static void raw_cipher_lengths(void)
{
	const char *names[] = {"AES-128-XTS", "AES-128-CBC", "AES-128-ECB", "AES-128-CTR"};
	size_t lens[] = {0, 5, 15, 16, 17, 300, 301};
	for (int ni = 0; ni < 4; ni++) {
		EVP_CIPHER *cs[2];
		fetch_both(names[ni], cs);
		for (size_t li = 0; cs[0] && cs[1] && li < sizeof lens / sizeof *lens; li++) {
			size_t len = lens[li];
			/* (CBC and ECB raw calls on partial blocks: not compared,
			 * the default provider's answer is no cipher's) */
			if (ni == 1 || ni == 2)
				len -= len % 16;
			unsigned char key[32], iv[16], in[400], out[2][420];
			fill(key, sizeof key);
			fill(iv, sizeof iv);
			fill(in, len);
			int r[2];
			for (int k = 0; k < 2; k++) {
				EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
				memset(out[k], 0, sizeof out[k]);
				EVP_EncryptInit_ex2(c, cs[k], key, iv, NULL);
				r[k] = EVP_Cipher(c, out[k], in, (unsigned)len);
				EVP_CIPHER_CTX_free(c);
			}
			CHECK(r[0] == r[1] && (r[0] <= 0 || !memcmp(out[0], out[1], len)),
			      "%s EVP_Cipher len %zu: wd %d default %d", names[ni], len, r[0], r[1]);
		}
		free_both(cs);
	}
	ERR_clear_error();
}

/* A key and no IV: what each provider makes of data (and XTS of an empty
 * raw call). */
static void data_without_iv(void)
{
	const char *names[] = {"AES-128-XTS", "AES-256-XTS", "AES-128-CBC", "AES-128-CTR"};
	size_t lens[] = {32, 300, 70000};
	static unsigned char in[70000], out[2][70016];
	for (int ni = 0; ni < 4; ni++) {
		EVP_CIPHER *cs[2];
		fetch_both(names[ni], cs);
		for (size_t li = 0; cs[0] && cs[1] && li < 3; li++) {
			unsigned char key[64];
			fill(key, 64);
			fill(in, lens[li]);
			int r[2][3];
			for (int k = 0; k < 2; k++) {
				EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
				int l = 0;
				r[k][0] = EVP_EncryptInit_ex2(c, cs[k], key, NULL, NULL) &&
					  EVP_CIPHER_CTX_set_padding(c, 0);
				r[k][1] = r[k][0] && EVP_EncryptUpdate(c, out[k], &l, in, (int)lens[li]);
				r[k][2] = r[k][1] ? l : 0;
				EVP_CIPHER_CTX_free(c);
			}
			CHECK(!memcmp(r[0], r[1], sizeof r[0]) && (!r[0][1] || !memcmp(out[0], out[1], (size_t)r[0][2])),
			      "%s without IV, %zu bytes: wd %d %d, default %d %d", names[ni], lens[li],
			      r[0][0], r[0][1], r[1][0], r[1][1]);
		}
		free_both(cs);
	}
	ERR_clear_error();
}

/* The tag length a context reports, after a short-tag decryption and
 * then an encryption. */
static void gcm_taglen_after_encrypt(void)
{
	EVP_CIPHER *cs[2];
	fetch_both("AES-128-GCM", cs);
	unsigned char key[16], iv[12], pt[64], ct[80], tag[16];
	fill(key, 16);
	fill(iv, 12);
	fill(pt, 64);
	size_t tl[2] = {0, 0};
	for (int k = 0; cs[0] && cs[1] && k < 2; k++) {
		EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
		int l = 0;
		fill(tag, 16);
		EVP_DecryptInit_ex2(c, cs[k], key, iv, NULL);
		EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_AEAD_SET_TAG, 12, tag);
		EVP_DecryptUpdate(c, ct, &l, pt, 64);
		EVP_DecryptFinal_ex(c, ct, &l);
		EVP_EncryptInit_ex2(c, NULL, NULL, iv, NULL);
		EVP_EncryptUpdate(c, ct, &l, pt, 64);
		EVP_EncryptFinal_ex(c, ct, &l);
		OSSL_PARAM p[] = {OSSL_PARAM_construct_size_t(OSSL_CIPHER_PARAM_AEAD_TAGLEN, &tl[k]),
				  OSSL_PARAM_END};
		EVP_CIPHER_CTX_get_params(c, p);
		EVP_CIPHER_CTX_free(c);
	}
	CHECK(tl[0] == tl[1], "GCM tag length after encrypting: wd %zu default %zu", tl[0], tl[1]);
	free_both(cs);
	ERR_clear_error();
}

/* Bytes of inline GCM messages counted (all of the data, not the first
 * update's). */
static void gcm_inline_bytes_counted(void)
{
	EVP_CIPHER *w = EVP_CIPHER_fetch(NULL, "AES-128-GCM", "provider=wd");
	unsigned char key[16], iv[12], pt[64], ct[64];
	fill(key, 16);
	fill(iv, 12);
	struct wd_crypto_stats s0, s1;
	wd_crypto_get_stats(&s0);
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	int l = 0, ok = EVP_EncryptInit_ex2(c, w, key, iv, NULL);
	for (int i = 0; i < 10; i++)
		ok = ok && EVP_EncryptUpdate(c, ct, &l, pt, 64);
	ok = ok && EVP_EncryptFinal_ex(c, ct, &l);
	EVP_CIPHER_CTX_free(c);
	EVP_CIPHER_free(w);
	wd_crypto_get_stats(&s1);
	uint64_t bytes = s1.cpu_bytes - s0.cpu_bytes + s1.offload_bytes - s0.offload_bytes;
	CHECK(ok && bytes == 640, "GCM message of 10 x 64 bytes: %llu bytes counted",
	      (unsigned long long)bytes);
}

/* 4096 inline AES-GCM messages of 100 bytes on one context, then the
 * context freed: wd_crypto_get_stats counts 4096 CPU requests and
 * 409600 bytes. The 4096th message's count hands the counts over at its
 * start (wd_count at 4096); its bytes, added by its update afterwards,
 * sit beside a request count of 0, which wd_flush_counts skips: they were
 * never counted. Inline messages only (the default settings: below the
 * threshold). */
static void gcm_inline_bytes_all_counted(void)
{
	if (wd_crypto_get_threshold() <= 100 && wd_crypto_get_policy() != WD_CRYPTO_POLICY_CPU)
		return;
	EVP_CIPHER *c = EVP_CIPHER_fetch(NULL, "AES-128-GCM", "provider=wd");
	CHECK(c != NULL, "fetch AES-128-GCM");
	if (c == NULL)
		return;
	unsigned char key[16] = {1}, iv[12] = {2}, in[100], out[100], tag[16];
	fill(in, sizeof in);
	struct wd_crypto_stats s0, s1;
	wd_crypto_get_stats(&s0);
	EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
	int ok = EVP_EncryptInit_ex2(x, c, key, iv, NULL);
	for (int i = 0; ok && i < 4096; i++) {
		int l = 0, f = 0;
		iv[11] = (unsigned char)i;
		iv[10] = (unsigned char)(i >> 8);
		ok = EVP_EncryptInit_ex2(x, NULL, NULL, iv, NULL) &&
		     EVP_EncryptUpdate(x, out, &l, in, sizeof in) && l == (int)sizeof in &&
		     EVP_EncryptFinal_ex(x, out + l, &f) &&
		     EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_AEAD_GET_TAG, 16, tag) > 0;
	}
	CHECK(ok, "4096 GCM messages");
	EVP_CIPHER_CTX_free(x);
	wd_crypto_get_stats(&s1);
	uint64_t req = s1.cpu_requests - s0.cpu_requests;
	uint64_t bytes = s1.cpu_bytes - s0.cpu_bytes;
	CHECK(req == 4096, "%llu requests counted", (unsigned long long)req);
	CHECK(bytes == 4096 * 100, "%llu bytes counted, not %u", (unsigned long long)bytes,
	      4096 * 100);
	EVP_CIPHER_free(c);
}

static const char *prov_dir;

/* A load refused for a setting that does not parse changes nothing: the
 * threshold (or fallback) given beside the bad policy is not applied to
 * the library, whose other users (the instance already loaded) go on
 * with their settings. */
static void refused_load_applies_nothing(void)
{
	size_t t0 = wd_crypto_get_threshold();
	int p0 = wd_crypto_get_policy(), f0 = wd_crypto_get_fallback();
	const char *saved[3] = {getenv("WD_PROVIDER_THRESHOLD"), getenv("WD_PROVIDER_POLICY"),
				getenv("WD_PROVIDER_FALLBACK")};
	char *keep[3];
	for (int i = 0; i < 3; i++)
		keep[i] = saved[i] ? strdup(saved[i]) : NULL;
	setenv("WD_PROVIDER_THRESHOLD", t0 == 12345 ? "54321" : "12345", 1);
	setenv("WD_PROVIDER_FALLBACK", f0 ? "0" : "1", 1);
	setenv("WD_PROVIDER_POLICY", "ofload", 1);
	OSSL_LIB_CTX *c = OSSL_LIB_CTX_new();
	OSSL_PROVIDER_set_default_search_path(c, prov_dir);
	OSSL_PROVIDER *p = OSSL_PROVIDER_load(c, "wd");
	CHECK(p == NULL, "the load with policy 'ofload' is refused");
	ERR_clear_error();
	if (p != NULL)
		OSSL_PROVIDER_unload(p);
	OSSL_LIB_CTX_free(c);
	const char *names[3] = {"WD_PROVIDER_THRESHOLD", "WD_PROVIDER_POLICY", "WD_PROVIDER_FALLBACK"};
	for (int i = 0; i < 3; i++) {
		if (keep[i])
			setenv(names[i], keep[i], 1);
		else
			unsetenv(names[i]);
		free(keep[i]);
	}
	CHECK(wd_crypto_get_threshold() == t0 && wd_crypto_get_policy() == p0 &&
		      wd_crypto_get_fallback() == f0,
	      "after a refused load: threshold %zu (was %zu), policy %d (was %d), fallback %d (was %d)",
	      wd_crypto_get_threshold(), t0, wd_crypto_get_policy(), p0, wd_crypto_get_fallback(), f0);
	/* put them back for the rest of the run */
	wd_crypto_set_threshold(t0);
	wd_crypto_set_fallback(f0);
}

struct test {
	const char *name;
	void (*fn)(void);
};
static const struct test tests[] = {
	{"async_jobs_more_than_the_slots", async_jobs_more_than_the_slots},
	{"yielded_jobs_each_get_their_wake_up", yielded_jobs_each_get_their_wake_up},
	{"gcm_tag_after_short_tag_decrypt", gcm_tag_after_short_tag_decrypt},
	{"gcm_final_before_the_tag", gcm_final_before_the_tag},
	{"gcm_final_on_another_thread", gcm_final_on_another_thread},
	{"cbc_copy_after_direction_change", cbc_copy_after_direction_change},
	{"ctr_original_iv_after_reinit", ctr_original_iv_after_reinit},
	{"async_gcm_beside_a_paused_job", async_gcm_beside_a_paused_job},
	{"sync_request_beside_a_paused_job", sync_request_beside_a_paused_job},
	{"async_jobs_survive_host_death", async_jobs_survive_host_death},
	{"cbc_bad_decrypt_reports_the_error", cbc_bad_decrypt_reports_the_error},
	{"raw_cipher_lengths", raw_cipher_lengths},
	{"data_without_iv", data_without_iv},
	{"gcm_taglen_after_encrypt", gcm_taglen_after_encrypt},
	{"gcm_inline_bytes_counted", gcm_inline_bytes_counted},
	{"gcm_inline_bytes_all_counted", gcm_inline_bytes_all_counted},
	{"refused_load_applies_nothing", refused_load_applies_nothing},
};

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s <dir of wd.so> [test ...]\n", argv[0]);
		return 2;
	}
	prov_dir = argv[1];
	OSSL_PROVIDER_set_default_search_path(NULL, argv[1]);
	OSSL_PROVIDER *wd = OSSL_PROVIDER_load(NULL, "wd");
	OSSL_PROVIDER *def = OSSL_PROVIDER_load(NULL, "default");
	if (wd == NULL || def == NULL) {
		ERR_print_errors_fp(stderr);
		fprintf(stderr, "cannot load the providers\n");
		return 1;
	}
	for (size_t i = 0; i < sizeof tests / sizeof *tests; i++) {
		/* (the host-death test kills a host: only when named) */
		int run = argc == 2 && tests[i].fn != async_jobs_survive_host_death;
		for (int a = 2; a < argc; a++)
			run |= strcmp(argv[a], tests[i].name) == 0;
		if (!run)
			continue;
		int f0 = failed;
		tests[i].fn();
		fprintf(stderr, "%s %s\n", failed == f0 ? "ok  " : "FAIL", tests[i].name);
	}
	printf("%d passed, %d failed\n", passed, failed);
	OSSL_PROVIDER_unload(wd);
	OSSL_PROVIDER_unload(def);
	return failed != 0;
}
