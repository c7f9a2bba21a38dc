/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* C API across host restarts: a host (`wd serve`, path in WD_BIN) killed
 * with requests in flight and started again on the same socket; the
 * library makes the queue again by itself, with the same memory shared,
 * and the requests in flight complete on the new host. Uses only
 * include/wd.h. Exit 0 and "N passed, 0 failed". */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wd.h"

#include "check.h"

static char sock[256];

/* Start `wd serve` on sock and wait until the socket exists. */
static pid_t start_host(const char *wd)
{
	unlink(sock);
	pid_t pid = fork();
	if (pid == 0) {
		execl(wd, wd, "serve", "--socket", sock, "--device", "dummy", (char *)NULL);
		_exit(127);
	}
	struct stat st;
	for (int i = 0; i < 1000 && stat(sock, &st) != 0; i++)
		usleep(5000);
	return pid;
}

static void stop(pid_t pid, int sig)
{
	kill(pid, sig);
	if (sig == SIGKILL)
		waitpid(pid, NULL, 0);
	else
		usleep(50000); /* let every thread stop */
}

int main(void)
{
	const char *wd = getenv("WD_BIN");
	if (!wd) {
		fprintf(stderr, "WD_BIN must name the wd binary\n");
		return 2;
	}
	snprintf(sock, sizeof sock, "/tmp/wd-c-reconnect-%d.sock", (int)getpid());
	setenv("WD_HOST", sock, 1);
	pid_t host = start_host(wd);

	struct wd_capa capa = { .alg = "memcpy", .depth = 16, .numa_node = -1 };
	struct wd_queue q;
	int ret = wd_request_queue(&q, &capa);
	CHECK(ret == 0, "request_queue: %s", wd_strerror(ret));
	if (ret)
		goto out;
	void *src, *dst, *got;
	CHECK(wd_alloc(65536, -1, &src) == 0, "alloc src");
	CHECK(wd_alloc(65536, -1, &dst) == 0, "alloc dst");
	for (int i = 0; i < 65536; i++)
		((unsigned char *)src)[i] = (unsigned char)(i * 13 + 1);
	CHECK(wd_mem_share(&q, src, 65536, 0) == 0, "share src");
	CHECK(wd_mem_share(&q, dst, 65536, 0) == 0, "share dst");

	/* Four copies sent to a frozen host, which is then killed and
	 * started again. */
	stop(host, SIGSTOP);
	struct wd_dummy_msg m[4];
	for (int i = 0; i < 4; i++) {
		m[i] = (struct wd_dummy_msg){ .opcode = WD_DUMMY_OP_COPY,
			.src = (uint64_t)src + i * 16384, .dst = (uint64_t)dst + i * 16384,
			.len = 16384 };
		CHECK(wd_send(&q, &m[i]) == 0, "send %d", i);
	}
	stop(host, SIGKILL);
	host = start_host(wd);
	for (int i = 0; i < 4; i++) {
		ret = wd_rcv_sync(&q, &got);
		CHECK(ret == 0, "rcv_sync after the restart: %s", wd_strerror(ret));
		if (ret)
			break;
		struct wd_dummy_msg *r = got;
		CHECK(r->status == 0 && r->result == 16384, "status %d", r->status);
	}
	CHECK(memcmp(src, dst, 65536) == 0, "every copy landed on the new host");

	/* The queue goes on with its memory shared again. */
	memset(dst, 0, 65536);
	struct wd_dummy_msg one = { .opcode = WD_DUMMY_OP_COPY, .src = (uint64_t)src,
		.dst = (uint64_t)dst, .len = 65536 };
	CHECK(wd_send_sync(&q, &one) == 0 && wd_rcv_sync(&q, &got) == 0 && one.status == 0,
	      "copy on the new host: %d", one.status);
	CHECK(memcmp(src, dst, 65536) == 0, "copied");

	/* No host at all: the wait ends with -ENOTCONN after the window. */
	stop(host, SIGSTOP);
	CHECK(wd_send(&q, &one) == 0, "send to a frozen host");
	stop(host, SIGKILL);
	host = 0;
	time_t t0 = time(NULL);
	ret = wd_rcv_sync(&q, &got);
	CHECK(ret == -ENOTCONN, "no host back: %s", wd_strerror(ret));
	CHECK(time(NULL) - t0 < 10, "within the reconnection window");
	wd_release_queue(&q);
out:
	if (host > 0)
		stop(host, SIGKILL);
	unlink(sock);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
