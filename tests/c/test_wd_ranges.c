/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* libwd.so refuses arrays whose range wraps around the address
 * space (-EINVAL) instead of reading or writing there, as it refuses a
 * wd_mem_share range that wraps. Built as test_wd.c is (-lwd), on an
 * in-process host. Exit 0 and "N passed, 0 failed". */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wd.h"

#include "check.h"

static struct wd_queue q;

static int list_capas_wraps(void)
{
	size_t n = 0;
	return wd_list_capas(WRAPPING, 4, &n) == -EINVAL ? 0 : 3;
}

/* In the child the parent's queue is -EBADFD, so a queue of its own. */
static int send_batch_wraps(void)
{
	struct wd_queue cq;
	struct wd_capa c = {.alg = "memcpy", .numa_node = -1};
	if (wd_request_queue(&cq, &c) != 0)
		return 2;
	return wd_send_batch(&cq, WRAPPING, 4) == -EINVAL ? 0 : 3;
}

int main(void)
{
	CHECK(wd_use_embedded_host() == 0, "an in-process host");
	struct wd_capa c = {.alg = "memcpy", .numa_node = -1};
	CHECK(wd_request_queue(&q, &c) == 0, "a queue");
	int r = in_child(list_capas_wraps);
	CHECK(r == 0, "wd_list_capas into an array that wraps: child ended %d", r);
	r = in_child(send_batch_wraps);
	CHECK(r == 0, "wd_send_batch from an array that wraps: child ended %d", r);
	void *reqs[1];
	CHECK(wd_rcv_batch(&q, WRAPPING, 4) == -EINVAL, "wd_rcv_batch into an array that wraps");
	CHECK(wd_rcv_batch(&q, reqs, 1) == -EAGAIN, "the queue still works");
	wd_release_queue(&q);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
