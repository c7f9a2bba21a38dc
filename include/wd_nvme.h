/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* WrapDrive mediated NVMe controller: the C API (libwd.so, symbol version
 * WD_0.4). See docs/nvme.md for the device and docs/c-abi.md for the
 * rules every call follows: 0 or a non-negative count on success, a
 * negative errno on failure (wd_strerror() names it, wd_last_error()
 * explains it; a command that completed with an error status is -EIO and
 * wd_last_error() names the status, as is a controller that broke the
 * protocol, e.g. a completion for no command), out-parameters written only on
 * success, every pointer checked. Controllers and queue pairs are handles:
 * a stale or forged one is -EBADF. */
#ifndef WD_NVME_H
#define WD_NVME_H

#include <stddef.h>
#include <stdint.h>

#include "wd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A namespace as the I/O calls need it (from wd_nvme_open_ns). */
struct wd_nvme_ns {
	uint32_t nsid;
	uint32_t block_size;
	uint64_t blocks;
};

/* A completion. status = status code type << 8 | status code (0: success);
 * dnr: the controller says retrying cannot succeed. */
struct wd_nvme_cpl {
	uint32_t result;
	uint16_t sq_head;
	uint16_t sq_id;
	uint16_t cid;
	uint16_t status;
	uint8_t dnr;
	uint8_t reserved[3];
};

/* Ask the host (WD_HOST, or the embedded one after wd_use_embedded_host())
 * for a controller and bring it up: reset, admin queue, enable, Identify,
 * Number of Queues, Doorbell Buffer Config. -ENODEV: no nvme device. */
int wd_nvme_open(uint64_t *ctrl);
/* Shut the controller down (CC.SHN), delete it and its queue pairs. */
int wd_nvme_close(uint64_t ctrl);

/* Identify data (4096 bytes into data) for CNS cns and NSID nsid. */
int wd_nvme_identify(uint64_t ctrl, uint8_t cns, uint32_t nsid, void *data);
/* Run one raw admin command (64-byte submission entry; its command id is
 * assigned) and wait: 0 when it completed, whatever its status (cpl). */
int wd_nvme_admin(uint64_t ctrl, const void *sqe, struct wd_nvme_cpl *cpl);
/* Attach namespace nsid to this controller unless it is, and describe it.
 * -EIO with "namespace is private": another controller has it. */
int wd_nvme_open_ns(uint64_t ctrl, uint32_t nsid, struct wd_nvme_ns *ns);
/* Share memory from wd_alloc() with the controller: data buffers must be
 * shared before a command names them (any other address completes with
 * Data Transfer Error and an IOMMU fault). */
int wd_nvme_share(uint64_t ctrl, void *addr, size_t len);

/* Create / delete an I/O queue pair of `entries` entries (2..4096). */
int wd_nvme_qpair_create(uint64_t ctrl, uint32_t entries, uint64_t *qp);
int wd_nvme_qpair_delete(uint64_t qp);

/* Read / write len bytes (whole blocks, at most 256 KiB, buf 4-byte
 * aligned and shared) at block lba, and wait. A command that failed to be
 * rung or waited for (host gone: -ENOTCONN; timeout) is given up: never
 * sent again when the queue pair is made again, its id free once its
 * late completion (if any) came; until then (or until the queue pair is
 * deleted) the controller may still read or write its buffer, so keep the
 * buffer for it. ns is as wd_nvme_open_ns described it on
 * the queue pair's controller: another namespace, block size or size is
 * -EINVAL. */
int wd_nvme_read(uint64_t qp, const struct wd_nvme_ns *ns, uint64_t lba, void *buf, size_t len);
int wd_nvme_write(uint64_t qp, const struct wd_nvme_ns *ns, uint64_t lba, void *buf, size_t len);
/* The same without waiting (write: 0 read, 1 write): the doorbell is rung,
 * the command id (>= 0) returned; its completion comes from wd_nvme_reap.
 * -EAGAIN: the queue pair is full; a failed ring gives the command up. */
int wd_nvme_submit_rw(uint64_t qp, const struct wd_nvme_ns *ns, int write, uint64_t lba,
		      void *buf, size_t len);
/* Write a raw 64-byte submission entry (command id assigned and returned)
 * without ringing; wd_nvme_ring() then tells the controller about every
 * entry pushed since the last ring (one doorbell for a batch). */
int wd_nvme_push(uint64_t qp, const void *sqe);
int wd_nvme_ring(uint64_t qp);
/* Copy up to max completions out without waiting; returns how many. */
int wd_nvme_reap(uint64_t qp, struct wd_nvme_cpl *out, uint32_t max);

#ifdef __cplusplus
}
#endif

#endif /* WD_NVME_H */
