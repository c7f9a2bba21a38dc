/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* A failed wd_use_embedded_host() leaves the process with the host it had.
 * Linked against a libwd.so with no libwd_embedded.so beside it (and none
 * on the loader's path), so the switch fails; the live host is an
 * in-process host of a child, started through the libwd_embedded.so that
 * $WD_EMBEDDED_LIB names (loaded by path in the child only).
 * Exit 0 and "N passed, 0 failed". */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wd.h"

#include "check.h"

typedef int (*start_fn)(char *address, size_t len);

/* In the child: start a host, send its address, serve until the parent
 * closes its end. */
static void serve(const char *lib, int addr_out, int hold_in)
{
	char addr[1024] = "";
	void *h = dlopen(lib, RTLD_NOW);
	start_fn start = h ? (start_fn)(uintptr_t)dlsym(h, "wd_embedded_start") : NULL;
	if (!start || start(addr, sizeof addr) != 0)
		addr[0] = 0;
	if (write(addr_out, addr, strlen(addr) + 1) < 0)
		_exit(2);
	char c;
	while (read(hold_in, &c, 1) > 0)
		;
	_exit(0);
}

static int list_count(size_t *n)
{
	*n = 0;
	return wd_list_capas(NULL, 0, n);
}

int main(void)
{
	const char *lib = getenv("WD_EMBEDDED_LIB");
	if (!lib) {
		fprintf(stderr, "set WD_EMBEDDED_LIB to the path of libwd_embedded.so\n");
		return 2;
	}
	int addr_pipe[2], hold_pipe[2];
	if (pipe(addr_pipe) || pipe(hold_pipe))
		return 2;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		close(addr_pipe[0]);
		close(hold_pipe[1]);
		serve(lib, addr_pipe[1], hold_pipe[0]);
	}
	close(addr_pipe[1]);
	close(hold_pipe[0]);
	char addr[1024] = "";
	size_t got = 0;
	ssize_t k;
	/* Up to its NUL: the child keeps its end open while it serves. */
	while (got < sizeof addr - 1 && (got == 0 || addr[got - 1] != 0) &&
	       (k = read(addr_pipe[0], addr + got, sizeof addr - 1 - got)) > 0)
		got += (size_t)k;
	CHECK(addr[0] != 0, "the child's host started");
	if (addr[0] == 0)
		return 1;
	setenv("WD_HOST", addr, 1);

	size_t n;
	int r = list_count(&n);
	CHECK(r == 0 && n > 0, "capabilities of the live host: %s (%zu)", wd_strerror(r), n);

	char why[1024] = "";
	r = wd_use_embedded_host();
	wd_last_error(why, sizeof why);
	CHECK(r == -EOPNOTSUPP && strstr(why, "libwd_embedded.so") != NULL,
	      "no libwd_embedded.so: the switch fails clearly (%d: %s)", r, why);

	/* Still on the live host, connected before the switch. */
	r = list_count(&n);
	CHECK(r == 0 && n > 0, "capabilities after the failed switch: %s (%zu)", wd_strerror(r), n);
	struct wd_capa capa = { .alg = "memcpy", .numa_node = -1 };
	struct wd_queue q;
	r = wd_request_queue(&q, &capa);
	CHECK(r == 0, "a queue after the failed switch: %s", wd_strerror(r));
	if (r == 0)
		wd_release_queue(&q);

	/* A second failed switch changes nothing either. */
	CHECK(wd_use_embedded_host() == -EOPNOTSUPP, "a second switch fails too");
	r = list_count(&n);
	CHECK(r == 0 && n > 0, "capabilities after a second failed switch: %s", wd_strerror(r));

	close(hold_pipe[1]);
	int st = 0;
	waitpid(pid, &st, 0);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
