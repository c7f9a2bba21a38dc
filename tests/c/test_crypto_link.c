/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* libwd_crypto.so is its own library: a program links -lwd_crypto -lwd,
 * its errors are reported by libwd.so's wd_last_error, and it computes
 * (on the device, or counted on the CPU) like before the split.
 * Exit 0 and "N passed, 0 failed". */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wd.h"
#include "wd_crypto.h"

#include "check.h"

/* A failing call (checked at thread exit: call_at_thread_exit). */
static int update_without_session(void)
{
	return wd_cipher_update(NULL, NULL, NULL, 0);
}

/* After fork: a cipher stream fed on the device before goes on in the
 * child (its chaining state is the caller's); a digest streaming on the
 * device does not (its state is the parent's): the child's calls on it are
 * -EBADFD naming the fork, until wd_digest_final starts it over. The
 * parent goes on with both. */
static void test_fork_mid_stream(void)
{
	enum { N = 64 << 10 };
	static unsigned char in[2 * N], ref_ct[2 * N], ct[2 * N];
	static const unsigned char k[16] = "0123456789abcdef", iv[16] = "fedcba9876543210";
	unsigned char ref_md[32], md[32];
	for (int i = 0; i < 2 * N; i++)
		in[i] = (unsigned char)(i * 13 + 1);
	CHECK(wd_crypto_set_threshold(0) == 0 &&
		      wd_crypto_set_policy(WD_CRYPTO_POLICY_OFFLOAD) == 0,
	      "offload everything");
	struct wd_digest *rd = NULL, *d = NULL;
	struct wd_cipher *rc = NULL, *c = NULL;
	CHECK(wd_digest_new(&rd, "sha256", NULL, 0) == 0 && wd_digest_update(rd, in, 2 * N) == 0 &&
		      wd_digest_final(rd, ref_md, sizeof ref_md) == 32,
	      "the reference digest");
	CHECK(wd_cipher_new(&rc, "aes-128-ctr", k, 16, 1) == 0 && wd_cipher_set_iv(rc, iv, 16) == 0 &&
		      wd_cipher_update(rc, in, ref_ct, 2 * N) == 0,
	      "the reference ciphertext");
	CHECK(wd_digest_new(&d, "sha256", NULL, 0) == 0 && wd_digest_update(d, in, N) == 0,
	      "a digest's first half before fork");
	CHECK(wd_cipher_new(&c, "aes-128-ctr", k, 16, 1) == 0 && wd_cipher_set_iv(c, iv, 16) == 0 &&
		      wd_cipher_update(c, in, ct, N - 5) == 0,
	      "a cipher stream's first part before fork");
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		char msg[256] = "";
		int bad = 0;
		if (wd_digest_update(d, in + N, N) != -EBADFD ||
		    wd_last_error(msg, sizeof msg) <= 0 || !strstr(msg, "fork"))
			bad |= 1;
		if (wd_digest_final(d, md, sizeof md) != -EBADFD)
			bad |= 2;
		/* Started over: a whole message in the child. */
		if (wd_digest_update(d, in, 2 * N) != 0 || wd_digest_final(d, md, sizeof md) != 32 ||
		    memcmp(md, ref_md, 32) != 0)
			bad |= 4;
		if (wd_cipher_update(c, in + N - 5, ct + N - 5, N + 5) != 0 ||
		    memcmp(ct, ref_ct, 2 * N) != 0)
			bad |= 8;
		if (bad)
			fprintf(stderr, "child: failures %#x (%s)\n", bad, msg);
		_exit(bad);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
		      WEXITSTATUS(status) == 0,
	      "the child: the digest refused then started over, the cipher stream went on");
	CHECK(wd_digest_update(d, in + N, N) == 0 && wd_digest_final(d, md, sizeof md) == 32 &&
		      memcmp(md, ref_md, 32) == 0,
	      "the parent finished its digest");
	CHECK(wd_cipher_update(c, in + N - 5, ct + N - 5, N + 5) == 0 &&
		      memcmp(ct, ref_ct, 2 * N) == 0,
	      "the parent finished its cipher stream");
	wd_digest_free(rd);
	wd_digest_free(d);
	wd_cipher_free(rc);
	wd_cipher_free(c);
}

static int readable(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* The wait descriptor of an event loop: armed with nothing in flight it
 * stays quiet; held (wd_crypto_hold_readable: a waiter with no request of
 * its own) it is readable, through a disarm and a synchronous request of
 * 8 MiB that sleeps on the queue, until the hold is given back. */
static void test_wait_descriptor_hold(void)
{
	static const unsigned char k[16] = "0123456789abcdef", iv[16] = "fedcba9876543210";
	enum { LEN = 8 << 20 };
	unsigned char *buf = calloc(1, LEN);
	struct wd_cipher *c = NULL;
	CHECK(buf && wd_crypto_set_policy(WD_CRYPTO_POLICY_OFFLOAD) == 0 &&
		      wd_cipher_new(&c, "aes-128-cbc", k, 16, 1) == 0 &&
		      wd_cipher_set_iv(c, iv, 16) == 0 && wd_cipher_offload(c, buf, buf, 4096) == 0,
	      "a request on the device (the thread's queue made)");
	int fd = wd_crypto_wait_fd();
	CHECK(fd >= 0, "wait descriptor");
	if (fd >= 0 && buf) {
		CHECK(wd_crypto_arm() == 0 && !readable(fd), "armed, nothing in flight: quiet");
		CHECK(wd_crypto_hold_readable(1) == 0 && readable(fd), "held: readable");
		wd_crypto_disarm();
		CHECK(readable(fd), "held: readable after a disarm");
		CHECK(wd_cipher_offload(c, buf, buf, LEN) == 0 && readable(fd),
		      "held: readable after a synchronous request");
		CHECK(wd_crypto_hold_readable(0) == 0, "hold given back");
		wd_crypto_disarm();
		CHECK(!readable(fd), "given back and disarmed: quiet");
	}
	wd_cipher_free(c);
	free(buf);
	wd_crypto_set_policy(WD_CRYPTO_POLICY_AUTO);
}

int main(void)
{
	struct wd_cipher *c = NULL;
	char msg[256] = "";
	int r = wd_cipher_new(&c, "aes-999-foo", "0123456789abcdef", 16, 1);
	CHECK(r == -EINVAL && c == NULL, "unknown cipher refused, out untouched");
	CHECK(wd_last_error(msg, sizeof msg) > 0 && strstr(msg, "aes-999-foo"),
	      "wd_last_error (libwd.so) names libwd_crypto.so's error");

	/* SHA-256("abc"), FIPS 180-2 B.1. */
	static const unsigned char want[32] = {
		0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
		0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
		0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
	struct wd_digest *d = NULL;
	unsigned char got[64];
	r = wd_digest_new(&d, "sha256", NULL, 0);
	CHECK(r == 0 && d != NULL, "sha256 session");
	if (d) {
		CHECK(wd_digest_update(d, "abc", 3) == 0, "digest update");
		r = wd_digest_final(d, got, sizeof got);
		CHECK(r == 32 && memcmp(got, want, 32) == 0, "sha256(abc)");
		wd_digest_free(d);
	}

	/* The routing memo: the library's settings inline, an answer of the
	 * router reused wd_route_memo_reuses times for the same kind of
	 * request of about the same size, asked again after that, for the
	 * other kind or for another size. */
	CHECK(wd_route_memo_reuses(8192) == WD_ROUTE_MEMO_REUSE &&
		      wd_route_memo_reuses(1024) == 64 && wd_route_memo_reuses(16) == 255 &&
		      wd_route_memo_reuses(0) == 255 && wd_route_memo_reuses((size_t)-1) == 15,
	      "more reuses for small requests");
	struct wd_route_memo m;
	CHECK(wd_crypto_set_threshold(4096) == 0 &&
		      wd_crypto_set_policy(WD_CRYPTO_POLICY_OFFLOAD) == 0,
	      "settings");
	wd_route_memo_init(&m);
	CHECK(m.threshold == 4096 && m.policy == WD_CRYPTO_POLICY_OFFLOAD && m.left == 0,
	      "memo filled with the settings");
	CHECK(wd_route_memo_route(&m, WD_KIND_CIPHER, 100, 0) == WD_CPU_THRESHOLD,
	      "below the threshold: CPU, without an answer kept");
	CHECK(m.left == 0, "nothing reused below the threshold");
	int first = wd_route_memo_route(&m, WD_KIND_CIPHER, 8192, 0);
	/* (The router may ask to time one answer and not the next.) */
	CHECK((first & ~WD_ROUTE_TIMED) ==
		      (wd_crypto_route(WD_KIND_CIPHER, 8192, 0) & ~WD_ROUTE_TIMED),
	      "the router's answer");
	CHECK(m.left == WD_ROUTE_MEMO_REUSE, "kept for reuse");
	for (int i = 0; i < WD_ROUTE_MEMO_REUSE; i++)
		CHECK(wd_route_memo_route(&m, WD_KIND_CIPHER, 8192, 0) ==
			      (first & ~WD_ROUTE_TIMED),
		      "reused");
	CHECK(m.left == 0, "reuses spent");
	(void)wd_route_memo_route(&m, WD_KIND_CIPHER, 8192, 0);
	CHECK(m.left == WD_ROUTE_MEMO_REUSE, "asked again once spent");
	CHECK(m.from == 4096 && m.span == 16384 - 4096, "for half to twice its size");
	(void)wd_route_memo_route(&m, WD_KIND_CIPHER, 16384, 0);
	CHECK(m.left == WD_ROUTE_MEMO_REUSE && m.from == 8192, "asked again for twice the size");
	CHECK(!wd_route_memo_holds(&m, 8191) && wd_route_memo_holds(&m, 8192) &&
		      wd_route_memo_holds(&m, 32767) && !wd_route_memo_holds(&m, 32768),
	      "nothing reused for another size");
	(void)wd_route_memo_route(&m, WD_KIND_CIPHER, 16383, 0);
	CHECK(m.left == WD_ROUTE_MEMO_REUSE - 1, "reused within the size");
	(void)wd_route_memo_route(&m, WD_KIND_CIPHER, (size_t)-1, 0);
	CHECK(m.from == (size_t)-1 / 2 && m.from + m.span == (size_t)-1, "no overflow");
	int a = wd_route_memo_route(&m, WD_KIND_CIPHER, 8192, 1);
	CHECK(m.async == 1, "an asynchronous request is not served a synchronous answer");
	CHECK(m.left == ((a & WD_ROUTE_DEVICE) ? 0 : WD_ROUTE_MEMO_REUSE),
	      "an asynchronous offload is decided again each time");
	CHECK(wd_crypto_set_policy(WD_CRYPTO_POLICY_CPU) == 0, "cpu policy");
	wd_route_memo_init(&m);
	CHECK(wd_route_memo_route(&m, WD_KIND_DIGEST, 1 << 20, 0) == WD_CPU_POLICY &&
		      wd_route_memo_fixed(&m, 1 << 20) == WD_CPU_POLICY &&
		      wd_route_memo_reuse_cpu(&m, 1 << 20) == 0,
	      "the cpu policy, inline, nothing to reuse");
	wd_route_memo_init(NULL); /* ignored */

	/* A seal refused for its tag length writes nothing (it wrote the whole
	 * ciphertext first); a job of no bytes may name no buffers. */
	struct wd_aead *g = NULL;
	unsigned char gkey[16] = {1}, giv[12] = {2}, gpt[32] = {3}, gct[32], gtag[17];
	CHECK(wd_aead_new(&g, "aes-128-gcm", gkey, sizeof gkey) == 0 && g != NULL, "a GCM key");
	for (size_t bad = 0; g != NULL && bad <= 17; bad += 17) {
		memset(gct, 0xee, sizeof gct);
		CHECK(wd_aead_seal(g, giv, sizeof giv, NULL, 0, gpt, gct, sizeof gpt, gtag, bad) ==
				      -EINVAL &&
			      gct[0] == 0xee && gct[31] == 0xee,
		      bad == 0 ? "a 0-byte tag refused before any output"
			       : "a 17-byte tag refused before any output");
	}
	CHECK(g != NULL && wd_aead_seal(g, giv, sizeof giv, NULL, 0, gpt, gct, sizeof gpt, gtag, 16) == 0,
	      "then a seal with a good tag");
	wd_aead_free(g);
	struct wd_cipher *e = NULL;
	struct wd_job *job = NULL;
	CHECK(wd_cipher_new(&e, "aes-128-ecb", "0123456789abcdef", 16, 1) == 0 &&
		      wd_cipher_start_offload(e, NULL, NULL, 0, &job) == 0 &&
		      (job == NULL || wd_job_wait(job) == 0),
	      "an empty job with no buffers");
	wd_cipher_free(e);

	/* Buffers from wd_alloc (libwd.so's allocator): the device reads the
	 * input and writes the output where they are, counted; the same bytes
	 * as through the staging area from malloc'ed buffers; one buffer for
	 * both (in == out) is staged. */
	enum { N = 96 << 10 };
	void *src = NULL, *dst = NULL;
	unsigned char *hsrc = malloc(N), *hdst = malloc(N);
	uint64_t b0 = 0, b1 = 0, b2 = 0, b3 = 0;
	CHECK(wd_crypto_get_in_place_bytes(NULL) == -EINVAL, "NULL out-pointer refused");
	CHECK(wd_alloc(N, -1, &src) == 0 && wd_alloc(N, -1, &dst) == 0 && hsrc && hdst,
	      "buffers");
	CHECK(wd_crypto_set_threshold(0) == 0 &&
		      wd_crypto_set_policy(WD_CRYPTO_POLICY_OFFLOAD) == 0,
	      "offload everything");
	if (src && dst && hsrc && hdst) {
		for (int i = 0; i < N; i++)
			hsrc[i] = ((unsigned char *)src)[i] = (unsigned char)(i * 31 + 7);
		static const unsigned char k[16] = "0123456789abcdef", iv[16] = "fedcba9876543210";
		struct wd_cipher *e = NULL, *r = NULL;
		CHECK(wd_cipher_new(&e, "aes-128-cbc", k, 16, 1) == 0 &&
			      wd_cipher_new(&r, "aes-128-cbc", k, 16, 1) == 0 &&
			      wd_cipher_set_iv(e, iv, 16) == 0 && wd_cipher_set_iv(r, iv, 16) == 0,
		      "two sessions");
		CHECK(wd_crypto_set_in_place(2) == -EINVAL, "wd_crypto_set_in_place: 0 or 1");
		/* Off (the default): staged. */
		CHECK(wd_crypto_set_in_place(0) == 0 && wd_crypto_get_in_place_bytes(&b0) == 0 &&
			      wd_cipher_update(r, hsrc, hdst, 16) == 0 &&
			      wd_cipher_update(e, src, dst, 16) == 0 &&
			      wd_crypto_get_in_place_bytes(&b1) == 0 && b1 == b0,
		      "in place off: wd_alloc buffers are staged");
		CHECK(wd_crypto_set_in_place(1) == 0, "in place on");
		CHECK(wd_crypto_get_in_place_bytes(&b0) == 0, "in-place bytes");
		/* Two requests, so the chain crosses from one to the next (after
		 * the 16 bytes above, on both sessions). */
		CHECK(wd_cipher_update(e, (char *)src + 16, (char *)dst + 16, N / 2 - 16) == 0 &&
			      wd_cipher_update(e, (char *)src + N / 2, (char *)dst + N / 2, N / 2) == 0,
		      "encrypt wd_alloc buffers");
		CHECK(wd_crypto_get_in_place_bytes(&b1) == 0 && b1 - b0 == N - 16,
		      "the device worked in place");
		CHECK(wd_cipher_update(r, hsrc + 16, hdst + 16, N / 2 - 16) == 0 &&
			      wd_cipher_update(r, hsrc + N / 2, hdst + N / 2, N / 2) == 0,
		      "encrypt malloc'ed buffers");
		CHECK(wd_crypto_get_in_place_bytes(&b2) == 0 && b2 == b1,
		      "malloc'ed buffers are staged");
		CHECK(memcmp(dst, hdst, N) == 0, "the same ciphertext either way");
		struct wd_cipher *d = NULL;
		CHECK(wd_cipher_new(&d, "aes-128-cbc", k, 16, 0) == 0 &&
			      wd_cipher_set_iv(d, iv, 16) == 0 &&
			      wd_cipher_update(d, dst, dst, N) == 0,
		      "decrypt in one wd_alloc buffer");
		CHECK(wd_crypto_get_in_place_bytes(&b3) == 0 && b3 == b2,
		      "one buffer for input and output is staged");
		CHECK(memcmp(dst, hsrc, N) == 0, "decrypted back");
		wd_cipher_free(d);
		wd_cipher_free(r);
		wd_cipher_free(e);
		/* A digest stream reads wd_alloc memory in place too. */
		struct wd_digest *dd = NULL, *dr = NULL;
		unsigned char m1[64], m2[64];
		uint64_t b4 = 0, b5 = 0;
		CHECK(wd_digest_new(&dd, "sha256", NULL, 0) == 0 &&
			      wd_digest_new(&dr, "sha256", NULL, 0) == 0,
		      "two digests");
		CHECK(wd_crypto_get_in_place_bytes(&b4) == 0 && wd_digest_update(dd, src, N) == 0 &&
			      wd_crypto_get_in_place_bytes(&b5) == 0 && b5 - b4 == N,
		      "the device read the digest's input in place");
		CHECK(wd_digest_update(dr, hsrc, N) == 0, "the same from malloc'ed memory");
		CHECK(wd_digest_final(dd, m1, sizeof m1) == 32 &&
			      wd_digest_final(dr, m2, sizeof m2) == 32 && memcmp(m1, m2, 32) == 0,
		      "the same digest either way");
		wd_digest_free(dd);
		wd_digest_free(dr);
	}
	wd_free(src);
	wd_free(dst);
	free(hsrc);
	free(hdst);

	test_fork_mid_stream();
	test_wait_descriptor_hold();
	CHECK(call_at_thread_exit(update_without_session) == -EINVAL, "a call at thread exit answers");
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
