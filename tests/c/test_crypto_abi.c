/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* libwd_crypto.so's pointer checks and its routing memo.
 * Built as test_crypto_link.c is (-lwd_crypto -lwd); needs no host.
 * Exit 0 and "N passed, 0 failed". */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wd.h"
#include "wd_crypto.h"

#include "check.h"

static int cipher_output_wraps(void)
{
	static const unsigned char k[16] = "0123456789abcdef", iv[16] = "fedcba9876543210";
	unsigned char in[32] = {0};
	struct wd_cipher *c = NULL;
	if (wd_cipher_new(&c, "aes-128-cbc", k, 16, 1) != 0 || wd_cipher_set_iv(c, iv, 16) != 0)
		return 2;
	return wd_cipher_update(c, in, WRAPPING, sizeof in) == -EINVAL ? 0 : 3;
}

static int digest_input_wraps(void)
{
	struct wd_digest *d = NULL;
	if (wd_digest_new(&d, "sha256", NULL, 0) != 0)
		return 2;
	return wd_digest_update(d, WRAPPING, 32) == -EINVAL ? 0 : 3;
}

static int aead_tag_wraps(void)
{
	static const unsigned char k[16] = "0123456789abcdef", iv[12] = "0123456789ab";
	unsigned char pt[16] = {0}, ct[16];
	struct wd_aead *a = NULL;
	if (wd_aead_new(&a, "aes-128-gcm", k, 16) != 0)
		return 2;
	return wd_aead_seal(a, iv, sizeof iv, NULL, 0, pt, ct, sizeof pt, WRAPPING, 16) == -EINVAL
		       ? 0
		       : 3;
}

/* A pointer whose range wraps around the address space is -EINVAL, not a
 * crash (ABI rule: every pointer checked, ptr + len included). */
static void test_wrapping_ranges(void)
{
	int r = in_child(cipher_output_wraps);
	CHECK(r == 0, "wd_cipher_update with an output range that wraps: child ended %d", r);
	r = in_child(digest_input_wraps);
	CHECK(r == 0, "wd_digest_update with an input range that wraps: child ended %d", r);
	r = in_child(aead_tag_wraps);
	CHECK(r == 0, "wd_aead_seal with a tag range that wraps: child ended %d", r);
}

/* Lengths no allocation can serve (2^62 bytes: past any machine's memory
 * whatever its overcommit policy, and ptr + len does not wrap). */
#define HUGE_LEN ((size_t)1 << 62)

static int says_no_memory(int r)
{
	char why[256];
	wd_last_error(why, sizeof why);
	return r == -ENOMEM && strstr(why, "cannot allocate") != NULL;
}

/* Overlapping input and output of an absurd length: the input's copy
 * cannot be made, -ENOMEM. Before, the library aborted the process. */
static int huge_overlapping_requests(void)
{
	static const unsigned char k[16] = "0123456789abcdef", iv[16] = "fedcba9876543210";
	static unsigned char buf[64], tag[16];
	struct wd_cipher *c = NULL;
	struct wd_aead *a = NULL;
	struct wd_job *job = (struct wd_job *)buf;
	if (wd_cipher_new(&c, "aes-128-ctr", k, 16, 1) != 0 || wd_cipher_set_iv(c, iv, 16) != 0 ||
	    wd_aead_new(&a, "aes-128-gcm", k, 16) != 0)
		return 2;
	if (!says_no_memory(wd_cipher_update(c, buf + 16, buf, HUGE_LEN)))
		return 3;
	if (!says_no_memory(wd_cipher_offload(c, buf + 16, buf, HUGE_LEN)))
		return 4;
	if (!says_no_memory(wd_cipher_start(c, buf + 16, buf, HUGE_LEN, &job)) ||
	    job != (struct wd_job *)buf)
		return 5;
	if (!says_no_memory(wd_aead_seal(a, iv, 12, NULL, 0, buf + 16, buf, HUGE_LEN, tag, 16)))
		return 6;
	/* Additional data of that length, whose copy the library keeps. */
	if (!says_no_memory(wd_aead_seal(a, iv, 12, buf, HUGE_LEN, buf + 16, buf, 16, tag, 16)))
		return 7;
	if (!says_no_memory(wd_aead_open(a, iv, 12, buf, HUGE_LEN, buf + 16, buf, 16, tag, 16)))
		return 8;
	/* Still usable after. */
	if (wd_cipher_update(c, buf + 16, buf, 32) != 0)
		return 9;
	wd_cipher_free(c);
	wd_aead_free(a);
	return 0;
}

static void test_huge_overlapping_lengths(void)
{
	int r = in_child(huge_overlapping_requests);
	CHECK(r == 0, "absurd lengths with overlapping buffers are -ENOMEM: child ended %d", r);
}

/* The inline routing memo answers as the library does: under the cpu
 * policy a small request is the policy's (WD_CPU_POLICY), as
 * wd_crypto_route says and as the library counts its own requests. */
static void test_memo_matches_router_under_cpu_policy(void)
{
	CHECK(wd_crypto_set_policy(WD_CRYPTO_POLICY_CPU) == 0 && wd_crypto_set_threshold(256) == 0,
	      "settings");
	int lib = wd_crypto_route(WD_KIND_CIPHER, 16, 0);
	struct wd_route_memo m;
	memset(&m, 0, sizeof m);
	wd_route_memo_init(&m);
	int memo = wd_route_memo_route(&m, WD_KIND_CIPHER, 16, 0);
	CHECK(lib == WD_CPU_POLICY, "wd_crypto_route: %#x", lib);
	CHECK(memo == lib, "memo answered %#x, the router %#x", memo, lib);

	/* What the library counts for its own small request under cpu. */
	static const unsigned char k[16] = "0123456789abcdef", iv[16] = "fedcba9876543210";
	unsigned char in[16] = {0}, out[16];
	struct wd_cipher *c = NULL;
	struct wd_crypto_stats s0, s1;
	CHECK(wd_crypto_get_stats(&s0) == 0, "stats");
	CHECK(wd_cipher_new(&c, "aes-128-cbc", k, 16, 1) == 0 && wd_cipher_set_iv(c, iv, 16) == 0 &&
		      wd_cipher_update(c, in, out, sizeof in) == 0,
	      "a small request");
	CHECK(wd_crypto_get_stats(&s1) == 0, "stats");
	CHECK(s1.cpu_policy - s0.cpu_policy == 1 && s1.cpu_below_threshold == s0.cpu_below_threshold,
	      "the library counts it as the policy's: policy +%llu, threshold +%llu",
	      (unsigned long long)(s1.cpu_policy - s0.cpu_policy),
	      (unsigned long long)(s1.cpu_below_threshold - s0.cpu_below_threshold));
	wd_cipher_free(c);
	wd_crypto_set_policy(WD_CRYPTO_POLICY_AUTO);
}

/* A hold with no queue on the thread: -ENOTCONN, nothing made. */
static void test_hold_without_a_queue(void)
{
	CHECK(wd_crypto_hold_readable(1) == -ENOTCONN, "wd_crypto_hold_readable without a queue");
}

int main(void)
{
	setenv("WD_HOST", "/nonexistent/wd.sock", 1);
	test_hold_without_a_queue();
	test_wrapping_ranges();
	test_huge_overlapping_lengths();
	test_memo_matches_router_under_cpu_policy();
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
