/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* C API test of include/wd_nvme.h: a controller on an in-process host with
 * an nvme device (WD_EMBEDDED_DEVICES) unless WD_HOST names a host that
 * has one. Exit 0 and "N passed, 0 failed". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wd.h"
#include "wd_nvme.h"

#include "check.h"

#define BS 4096
#define N 8

/* A raw Read of `blocks` blocks at lba into buf. */
static void read_sqe(uint8_t sqe[64], uint32_t nsid, uint64_t lba, uint32_t blocks, void *buf)
{
	uint64_t prp1 = (uint64_t)(uintptr_t)buf, prp2 = prp1 + BS;
	uint32_t cdw10 = (uint32_t)lba, cdw11 = (uint32_t)(lba >> 32), cdw12 = blocks - 1;

	memset(sqe, 0, 64);
	sqe[0] = 0x02;
	memcpy(sqe + 4, &nsid, 4);
	memcpy(sqe + 24, &prp1, 8);
	memcpy(sqe + 32, &prp2, 8);
	memcpy(sqe + 40, &cdw10, 4);
	memcpy(sqe + 44, &cdw11, 4);
	memcpy(sqe + 48, &cdw12, 4);
}

int main(void)
{
	uint64_t ctrl = 0, other = 0, qp = 0;
	struct wd_nvme_ns ns;
	struct wd_nvme_cpl cpl[N];
	uint8_t id[4096], sqe[64];
	void *buf = NULL, *priv = NULL;
	char store[] = "/tmp/wd-test-nvme-XXXXXX";
	int ret, i, fd;

	if (!getenv("WD_HOST")) {
		char devs[256];
		fd = mkstemp(store);
		if (fd < 0) {
			perror("mkstemp");
			return 1;
		}
		close(fd);
		snprintf(devs, sizeof devs, "nvme:ns=%s:0:16M,ns=%s:16M:16M", store, store);
		setenv("WD_EMBEDDED_DEVICES", devs, 1);
		ret = wd_use_embedded_host();
		if (ret) {
			char why[512];
			wd_last_error(why, sizeof why);
			fprintf(stderr, "cannot start embedded host: %s (%s)\n", wd_strerror(ret), why);
			return 1;
		}
	}

	CHECK(wd_nvme_open(NULL) == -EINVAL, "NULL out");
	ret = wd_nvme_open(&ctrl);
	CHECK(ret == 0, "open: %s", wd_strerror(ret));
	if (ret)
		goto out;
	CHECK(wd_nvme_identify(ctrl, 1, 0, id) == 0, "identify controller");
	CHECK(memcmp(id + 24, "WrapDrive", 9) == 0, "model number");
	CHECK(wd_nvme_identify(ctrl, 1, 0, NULL) == -EINVAL, "NULL data");
	CHECK(wd_nvme_identify(ctrl + 1000, 1, 0, id) == -EBADF, "forged handle");

	ret = wd_nvme_open_ns(ctrl, 1, &ns);
	CHECK(ret == 0 && ns.nsid == 1 && ns.block_size == BS && ns.blocks == 4096,
	      "open_ns: %s (%u, %u, %llu)", wd_strerror(ret), ns.nsid, ns.block_size,
	      (unsigned long long)ns.blocks);
	/* A namespace is private to one controller. */
	CHECK(wd_nvme_open(&other) == 0, "second controller");
	CHECK(wd_nvme_open_ns(other, 1, &ns) == -EIO, "namespace 1 is taken");
	CHECK(wd_nvme_close(other) == 0, "close second");
	CHECK(wd_nvme_close(other) == -EBADF, "close twice");

	CHECK(wd_alloc(N * BS, -1, &buf) == 0, "alloc");
	CHECK(wd_alloc(BS, -1, &priv) == 0, "alloc private");
	CHECK(wd_nvme_share(ctrl, buf, N * BS) == 0, "share");
	ret = wd_nvme_qpair_create(ctrl, 16, &qp);
	CHECK(ret == 0, "qpair: %s", wd_strerror(ret));

	/* Synchronous round trip through a PRP list (8 pages). */
	for (i = 0; i < N * BS; i++)
		((uint8_t *)buf)[i] = (uint8_t)(i * 13 + 7);
	CHECK(wd_nvme_write(qp, &ns, 100, buf, N * BS) == 0, "write");
	memset(buf, 0, N * BS);
	CHECK(wd_nvme_read(qp, &ns, 100, buf, N * BS) == 0, "read");
	for (i = 0; i < N * BS && ((uint8_t *)buf)[i] == (uint8_t)(i * 13 + 7); i++)
		;
	CHECK(i == N * BS, "data back (first difference at %d)", i);

	/* Errors: outside the namespace, memory never shared, bad length. */
	CHECK(wd_nvme_read(qp, &ns, ns.blocks, buf, BS) == -EIO, "LBA out of range");
	CHECK(wd_nvme_read(qp, &ns, 0, priv, BS) == -EIO, "unshared buffer");
	CHECK(wd_nvme_read(qp, &ns, 0, buf, 100) == -EINVAL, "partial block");
	CHECK(wd_nvme_read(qp, NULL, 0, buf, BS) == -EINVAL, "NULL namespace");
	/* A namespace described otherwise than wd_nvme_open_ns did: smaller
	 * blocks would have the controller move 8x the buffer's bytes. */
	{
		struct wd_nvme_ns forged = ns;

		forged.block_size = 512;
		CHECK(wd_nvme_read(qp, &forged, 0, buf, BS) == -EINVAL, "forged block size");
		forged = ns;
		forged.blocks = ns.blocks * 2;
		CHECK(wd_nvme_write(qp, &forged, ns.blocks, buf, BS) == -EINVAL, "forged size");
		forged = ns;
		forged.nsid = 2;
		CHECK(wd_nvme_submit_rw(qp, &forged, 0, 0, buf, BS) == -EINVAL,
		      "namespace never opened");
	}

	/* Asynchronous: one doorbell for a batch of raw entries, then reap. */
	memset(buf, 0, N * BS);
	for (i = 0; i < 4; i++) {
		read_sqe(sqe, 1, 100 + 2 * i, 2, (uint8_t *)buf + 2 * i * BS);
		CHECK(wd_nvme_push(qp, sqe) >= 0, "push %d", i);
	}
	sqe[0] = 0x7f; /* an opcode the controller does not know */
	CHECK(wd_nvme_push(qp, sqe) >= 0, "push bad opcode");
	CHECK(wd_nvme_ring(qp) == 0, "ring");
	{
		int got = 0, ok = 0, bad = 0, spins = 0;
		while (got < 5 && spins++ < 10000000) {
			int n = wd_nvme_reap(qp, cpl, N);
			if (n < 0) {
				CHECK(n >= 0, "reap: %s", wd_strerror(n));
				break;
			}
			for (i = 0; i < n; i++) {
				if (cpl[i].status == 0)
					ok++;
				else if (cpl[i].status == 0x01 && cpl[i].dnr)
					bad++;
			}
			got += n;
		}
		CHECK(ok == 4 && bad == 1, "4 reads and an invalid opcode (%d, %d)", ok, bad);
	}
	for (i = 0; i < N * BS && ((uint8_t *)buf)[i] == (uint8_t)(i * 13 + 7); i++)
		;
	CHECK(i == N * BS, "batched reads (first difference at %d)", i);
	CHECK(wd_nvme_submit_rw(qp, &ns, 2, 100, buf, BS) == -EINVAL,
	      "write is 0 or 1 (2 was taken for a write)");
	ret = wd_nvme_submit_rw(qp, &ns, 0, 100, buf, BS);
	CHECK(ret >= 0, "submit_rw: %s", wd_strerror(ret));
	{
		int n = 0, spins = 0;
		while (n == 0 && spins++ < 10000000)
			n = wd_nvme_reap(qp, cpl, 1);
		CHECK(n == 1 && cpl[0].cid == ret && cpl[0].status == 0, "its completion");
	}
	CHECK(wd_nvme_reap(qp, NULL, 1) == -EINVAL, "NULL completions");

	/* A forked child owns none of the parent's controllers and queue
	 * pairs: each call is -EBADFD and touches nothing (a doorbell write
	 * faulted in the child, and the entries it wrote broke the parent's
	 * next read). */
	{
		pid_t pid = fork();
		if (pid == 0) {
			int bad = 0;
			bad += wd_nvme_read(qp, &ns, 100, buf, BS) != -EBADFD;
			bad += wd_nvme_submit_rw(qp, &ns, 0, 100, buf, BS) != -EBADFD;
			bad += wd_nvme_identify(ctrl, 1, 0, id) != -EBADFD;
			bad += wd_nvme_qpair_delete(qp) != -EBADFD;
			bad += wd_nvme_close(ctrl) != -EBADFD;
			_exit(bad);
		}
		int st = -1;
		CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "the child's calls on the parent's NVMe handles are -EBADFD (status %#x)", st);
		for (int k = 0; k < 2; k++) {
			memset(buf, 0, BS);
			ret = wd_nvme_read(qp, &ns, 100, buf, BS);
			CHECK(ret == 0 && ((uint8_t *)buf)[BS - 1] == (uint8_t)((BS - 1) * 13 + 7),
			      "the parent reads after the child (%d)", ret);
		}
	}

	/* A raw admin command: Get Features, Volatile Write Cache. */
	memset(sqe, 0, 64);
	sqe[0] = 0x0a;
	sqe[40] = 0x06;
	CHECK(wd_nvme_admin(ctrl, sqe, &cpl[0]) == 0 && cpl[0].status == 0 && cpl[0].result == 1,
	      "write cache on");

	CHECK(wd_nvme_qpair_delete(qp) == 0, "delete qpair");
	CHECK(wd_nvme_read(qp, &ns, 0, buf, BS) == -EBADF, "deleted qpair");
	CHECK(wd_nvme_close(ctrl) == 0, "close");
out:
	wd_free(buf);
	wd_free(priv);
	if (!getenv("WD_HOST"))
		unlink(store);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
