/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* C API test: uses only include/wd.h. Runs against an in-process host
 * unless WD_HOST names another one. Exit 0 and "N passed, 0 failed". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wd.h"

#include "check.h"

static void test_copy(void)
{
	struct wd_capa capa = { .alg = "memcpy", .depth = 64, .numa_node = -1 };
	struct wd_queue q;
	void *src, *dst, *got;
	int ret;

	ret = wd_request_queue(&q, &capa);
	CHECK(ret == 0, "request_queue: %s", wd_strerror(ret));
	if (ret)
		return;
	CHECK(q.depth == 64 && q.device_api == 1, "depth %u api %u", q.depth, q.device_api);
	CHECK(strncmp(q.dev_name, "dev", 3) == 0, "dev_name %s", q.dev_name);

	CHECK(wd_alloc(8192, -1, &src) == 0, "alloc src");
	CHECK(wd_alloc(8192, -1, &dst) == 0, "alloc dst");
	for (int i = 0; i < 8192; i++)
		((unsigned char *)src)[i] = (unsigned char)(i * 7);
	CHECK(wd_mem_share(&q, src, 8192, 0) == 0, "share src");
	CHECK(wd_mem_share(&q, dst, 8192, 0) == 0, "share dst");

	/* Many requests in flight, received by pointer. */
	struct wd_dummy_msg msgs[16];
	for (int i = 0; i < 16; i++) {
		msgs[i] = (struct wd_dummy_msg){ .opcode = WD_DUMMY_OP_COPY,
			.src = (uint64_t)src + i * 512, .dst = (uint64_t)dst + i * 512, .len = 512 };
		CHECK(wd_send(&q, &msgs[i]) == 0, "send %d", i);
	}
	int seen = 0;
	while (seen < 16) {
		ret = wd_rcv_sync(&q, &got);
		CHECK(ret == 0, "rcv_sync: %s", wd_strerror(ret));
		if (ret)
			break;
		struct wd_dummy_msg *m = got;
		CHECK(m >= msgs && m < msgs + 16, "pointer handed back is one we sent");
		CHECK(m->status == 0 && m->result == 512, "status %d result %llu", m->status,
		      (unsigned long long)m->result);
		seen++;
	}
	CHECK(memcmp(src, dst, 8192) == 0, "device copied the bytes");
	CHECK(wd_rcv(&q, &got) == -EAGAIN, "nothing left to receive");

	/* An address never shared faults, and the fault is recorded. */
	static char not_shared[4096];
	struct wd_dummy_msg bad = { .opcode = WD_DUMMY_OP_COPY, .src = (uint64_t)not_shared,
		.dst = (uint64_t)dst, .len = 64 };
	CHECK(wd_send_sync(&q, &bad) == 0, "send bad");
	CHECK(wd_rcv_sync(&q, &got) == 0 && got == &bad, "rcv bad");
	CHECK(bad.status == -EFAULT, "bad status %d", bad.status);
	struct wd_fault f[4];
	ret = wd_get_faults(&q, f, 4);
	CHECK(ret == 1 && f[0].iova == (uint64_t)not_shared && f[0].reason == 1, "faults %d", ret);

	/* Malformed requests complete with a status. */
	struct wd_dummy_msg weird = { .opcode = 77 };
	CHECK(wd_send(&q, &weird) == 0, "send weird");
	CHECK(wd_rcv_sync(&q, &got) == 0 && weird.status == -EOPNOTSUPP, "weird status %d", weird.status);

	/* Sharing memory that is not from wd_alloc is refused clearly. */
	CHECK(wd_mem_share(&q, not_shared, 4096, 0) == -EINVAL, "share foreign memory");
	/* A partial unshare is refused and said so; the range stays shared. */
	CHECK(wd_mem_unshare2(&q, src, 4096) == -ENOENT, "partial unshare refused");
	errno = 0;
	wd_mem_unshare(&q, (char *)src + 4096, 4096);
	CHECK(errno == ENOENT, "partial unshare sets errno");
	CHECK(wd_mem_unshare2(&q, src, 8192) == 0, "whole unshare");
	wd_mem_unshare(&q, dst, 8192);
	msgs[0].status = 1;
	CHECK(wd_send_sync(&q, &msgs[0]) == 0 && wd_rcv_sync(&q, &got) == 0, "after unshare");
	CHECK(msgs[0].status == -EFAULT, "unshared memory faults (%d)", msgs[0].status);

	wd_release_queue(&q);
	CHECK(wd_send(&q, &msgs[0]) == -EBADF, "released queue is EBADF");
	wd_release_queue(&q); /* twice is harmless */
	CHECK(wd_free(src) == 0 && wd_free(dst) == 0, "free");
	CHECK(wd_free(src) == -EINVAL, "double free refused");
}

static void test_legacy_and_share_all(void)
{
	struct wd_capa capa = { .alg = "memcpy", .flags = WD_CAPA_ALLOW_LEGACY, .numa_node = -1 };
	struct wd_queue q;
	void *got;
	static char a[3000], b[3000];

	memset(a, 0x3c, sizeof a);
	CHECK(wd_request_queue(&q, &capa) == 0, "legacy queue");
	struct wd_dummy_msg m = { .opcode = WD_DUMMY_OP_COPY, .src = (uint64_t)a, .dst = (uint64_t)b, .len = sizeof a };
	CHECK(wd_send(&q, &m) == 0 && wd_rcv(&q, &got) == 0 && got == &m, "legacy round trip");
	CHECK(m.status == 0 && memcmp(a, b, sizeof a) == 0, "legacy copied (status %d)", m.status);
	wd_release_queue(&q);

	capa.flags = WD_CAPA_SHARE_ALL;
	int ret = wd_request_queue(&q, &capa);
	if (ret == -EOPNOTSUPP) {
		printf("skip: WD_CAPA_SHARE_ALL unavailable here\n");
		return;
	}
	CHECK(ret == 0, "share-all queue: %s", wd_strerror(ret));
	memset(b, 0, sizeof b);
	m.status = 1;
	CHECK(wd_send_sync(&q, &m) == 0 && wd_rcv_sync(&q, &got) == 0, "share-all round trip");
	CHECK(m.status == 0 && memcmp(a, b, sizeof a) == 0, "share-all copied (status %d)", m.status);
	wd_release_queue(&q);
}

static void test_errors(void)
{
	struct wd_capa capa = { .alg = "no-such-alg", .numa_node = -1 };
	struct wd_queue q;
	memset(&q, 0xee, sizeof q);
	CHECK(wd_request_queue(&q, &capa) == -ENODEV, "unknown alg is ENODEV");
	/* Listed by wd_list_capas, but served by another library. */
	capa.alg = "cipher";
	char why[256];
	CHECK(wd_request_queue(&q, &capa) == -EOPNOTSUPP && wd_last_error(why, sizeof why) > 0 &&
		      strstr(why, "libwd_crypto") != NULL,
	      "a cipher queue is libwd_crypto's: %s", why);
	CHECK(q.id == 0xeeeeeeee, "out-parameter untouched on a type served elsewhere");
	capa.alg = "no-such-alg";
	CHECK(wd_request_queue(NULL, &capa) == -EINVAL, "NULL queue");
	CHECK(wd_request_queue(&q, NULL) == -EINVAL, "NULL capa");
	capa.alg = "memcpy";
	capa.depth = 3;
	CHECK(wd_request_queue(&q, &capa) == -EINVAL, "depth 3 refused");
	CHECK(q.id == 0xeeeeeeee, "out-parameter untouched on failure");
	capa.depth = 0;
	capa.reserved[1] = 1;
	CHECK(wd_request_queue(&q, &capa) == -EINVAL, "reserved must be zero");
	capa.reserved[1] = 0;
	capa.numa_node = -2;
	CHECK(wd_request_queue(&q, &capa) == -EINVAL, "NUMA node -2 refused");
	CHECK(q.id == 0xeeeeeeee, "out-parameter untouched on a refused NUMA node");
	capa.numa_node = -1;
	/* wd_alloc: a node the machine does not have is refused, not ignored
	 * (where the kernel lists its nodes). */
	void *mem = &q;
	if (access("/sys/devices/system/node", F_OK) == 0)
		CHECK(wd_alloc(4096, 999, &mem) == -EINVAL && mem == &q, "wd_alloc on NUMA node 999");
	CHECK(wd_alloc(4096, 0, &mem) == 0 && mem != &q && wd_free(mem) == 0, "wd_alloc on node 0");
	CHECK(strlen(wd_strerror(-EBUSY)) > 0, "strerror");
	CHECK(strcmp(wd_strerror(-EIO), "input/output error") == 0, "EIO has its text");
	/* The errnos wd_comp.h documents read as what they mean there too. */
	CHECK(strstr(wd_strerror(-EBADMSG), "corrupt") != NULL, "EBADMSG: %s", wd_strerror(-EBADMSG));
	CHECK(strstr(wd_strerror(-ENOBUFS), "too small") != NULL, "ENOBUFS: %s", wd_strerror(-ENOBUFS));
	CHECK(strstr(wd_strerror(-EOVERFLOW), "ratio") != NULL, "EOVERFLOW: %s",
	      wd_strerror(-EOVERFLOW));
	CHECK(strcmp(wd_strerror(-ENOLINK), "unknown error") == 0,
	      "an errno WrapDrive never returns is not called an I/O error: %s",
	      wd_strerror(-ENOLINK));
	char buf[8];
	CHECK(wd_last_error(buf, sizeof buf) > 0 && strlen(buf) < 8, "last_error truncates");
	size_t n = 0;
	struct wd_capa_info info[8];
	CHECK(wd_list_capas(info, 8, &n) == 0 && n >= 1, "list capas");
	CHECK(strcmp(info[0].alg, "memcpy") == 0 && info[0].device_api == 1, "capa info %s", info[0].alg);
	void *p = (void *)1;
	CHECK(wd_alloc(0, -1, &p) == -EINVAL && p == (void *)1, "alloc 0 refused");
}

static void test_fork(void)
{
	struct wd_capa capa = { .alg = "memcpy", .numa_node = -1 };
	struct wd_queue q;
	CHECK(wd_request_queue(&q, &capa) == 0, "queue before fork");
	pid_t pid = fork();
	if (pid == 0) {
		struct wd_dummy_msg m = { .opcode = WD_DUMMY_OP_NOP };
		int r = wd_send(&q, &m);
		_exit(r == -EBADFD ? 0 : 1);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child cannot use the parent's queue");
	struct wd_dummy_msg m = { .opcode = WD_DUMMY_OP_NOP };
	void *got;
	CHECK(wd_send(&q, &m) == 0 && wd_rcv_sync(&q, &got) == 0 && m.status == 0, "parent still can");
	wd_release_queue(&q);
}

/* Batched submit and reap: more requests than the ring holds, sent in
 * batches, each handed back once, the bytes copied; bad arguments. */
static void test_batch(void)
{
	struct wd_capa capa = { .alg = "memcpy", .depth = 8, .numa_node = -1 };
	struct wd_queue q;
	enum { N = 40, LEN = 256 };
	unsigned char *src, *dst;
	struct wd_dummy_msg msgs[N];
	void *ptrs[N], *got[N];
	int seen[N] = { 0 };
	int ret;

	ret = wd_request_queue(&q, &capa);
	CHECK(ret == 0, "request_queue: %s", wd_strerror(ret));
	if (ret)
		return;
	CHECK(wd_alloc(N * LEN, -1, (void **)&src) == 0, "alloc src");
	CHECK(wd_alloc(N * LEN, -1, (void **)&dst) == 0, "alloc dst");
	for (int i = 0; i < N * LEN; i++)
		src[i] = (unsigned char)(i * 13 + 1);
	CHECK(wd_mem_share(&q, src, N * LEN, 0) == 0, "share src");
	CHECK(wd_mem_share(&q, dst, N * LEN, 0) == 0, "share dst");
	for (int i = 0; i < N; i++) {
		msgs[i] = (struct wd_dummy_msg){ .opcode = WD_DUMMY_OP_COPY,
			.src = (uint64_t)(src + i * LEN), .dst = (uint64_t)(dst + i * LEN), .len = LEN };
		ptrs[i] = &msgs[i];
	}
	int sent = 0, received = 0, rounds = 0;
	while (received < N && rounds++ < 100000) {
		if (sent < N) {
			ret = wd_send_batch(&q, ptrs + sent, (size_t)(N - sent));
			CHECK(ret > 0 || ret == -EAGAIN, "send_batch: %s", wd_strerror(ret));
			CHECK(ret <= 8, "at most the depth in flight, got %d", ret);
			if (ret > 0)
				sent += ret;
		}
		ret = wd_rcv_batch(&q, got, N);
		CHECK(ret > 0 || ret == -EAGAIN, "rcv_batch: %s", wd_strerror(ret));
		for (int k = 0; k < ret; k++) {
			struct wd_dummy_msg *m = got[k];
			int i = (int)(m - msgs);
			CHECK(i >= 0 && i < N && !seen[i], "pointer %d handed back once", i);
			if (i >= 0 && i < N)
				seen[i]++;
			CHECK(m->status == 0 && m->result == LEN, "status %d", m->status);
		}
		if (ret > 0)
			received += ret;
	}
	CHECK(sent == N && received == N, "sent %d received %d", sent, received);
	CHECK(memcmp(src, dst, N * LEN) == 0, "device copied every batch");
	CHECK(wd_rcv_batch(&q, got, N) == -EAGAIN, "nothing left");
	CHECK(wd_send_batch(&q, NULL, 1) == -EINVAL, "NULL array");
	CHECK(wd_rcv_batch(&q, NULL, 1) == -EINVAL, "NULL out-array");
	void *with_null[2] = { &msgs[0], NULL };
	CHECK(wd_send_batch(&q, with_null, 2) == 1, "a NULL request ends the batch after the first");
	CHECK(wd_rcv_batch(&q, got, 1) == 1 || (wd_rcv_sync(&q, got) == 0), "the first completes");
	CHECK(wd_send_batch(&q, with_null + 1, 1) == -EINVAL, "a NULL first request");
	CHECK(wd_send_batch(NULL, ptrs, 1) == -EINVAL, "NULL queue");
	wd_mem_unshare(&q, src, N * LEN);
	wd_mem_unshare(&q, dst, N * LEN);
	wd_release_queue(&q);
	wd_free(src);
	wd_free(dst);
}

/* A call from a thread-key destructor (a C library cleaning up at thread
 * exit) runs after the thread's Rust locals are gone (glibc): it answers
 * its errno, never aborts the process (the last error message, kept in
 * one of those locals, is then not kept). */
static int send_then_read_the_error(void)
{
	char m[64];
	int r = wd_send(NULL, NULL);
	return wd_last_error(m, sizeof m) >= 0 ? r : 1;
}

static void test_thread_exit(void)
{
	CHECK(call_at_thread_exit(send_then_read_the_error) == -EINVAL, "calls at thread exit answer");
}

int main(void)
{
	if (!getenv("WD_HOST")) {
		int r = wd_use_embedded_host();
		if (r) {
			char why[512];
			wd_last_error(why, sizeof why);
			fprintf(stderr, "cannot start embedded host: %s (%s)\n", wd_strerror(r), why);
			return 1;
		}
	}
	test_copy();
	test_batch();
	test_legacy_and_share_all();
	test_errors();
	test_fork();
	test_thread_exit();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
