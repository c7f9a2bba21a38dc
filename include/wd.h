/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wd.h - WrapDrive: user-space accelerator queues.
 *
 * An application asks for a queue by capability (wd_request_queue), then
 * sends requests and receives completions through rings in memory shared
 * with the device host: wd_send/wd_rcv make no system call while the
 * device polls. Memory the device reads or writes is either shared
 * explicitly (wd_alloc + wd_mem_share), reachable everywhere
 * (WD_CAPA_SHARE_ALL), or carried through the socket (WD_CAPA_ALLOW_LEGACY).
 *
 * Which host: $WD_HOST (a socket path, "@name" for an abstract socket, or
 * "embedded" for a host inside this process, from libwd_embedded.so), else
 * /run/wrapdrive/wd.sock.
 *
 * ABI rules
 *  - Errors: functions returning int return 0 (or a count) on success and a
 *    negative errno on failure; wd_strerror() names it, wd_last_error()
 *    gives this thread's last detailed message.
 *  - Out-parameters are written only on success. Every pointer is checked;
 *    NULL where one is required is -EINVAL, a queue released or never
 *    requested -EBADF.
 *  - Ownership: struct wd_queue and struct wd_capa belong to the caller.
 *    A request passed to wd_send belongs to the library until wd_rcv hands
 *    the same pointer back: keep it valid and do not touch it meanwhile.
 *    Completion status and result are written into the request.
 *  - Threads: every call is thread-safe; calls on one queue serialise.
 *  - fork: queues and shared memory registrations are not inherited; in the
 *    child, calls on the parent's queues return -EBADFD. Request new queues.
 *  - Process death releases every queue of the process (no cleanup needed).
 *  - Reserved fields must be zero. Structures only grow at the end.
 */
#ifndef WD_H
#define WD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- capabilities ---------------------------------------------------- */

/* The device may reach any memory of the process: no wd_mem_share needed. */
#define WD_CAPA_SHARE_ALL    0x1u
/* Requests travel through the socket, one system call each (slow path). */
#define WD_CAPA_ALLOW_LEGACY 0x2u

/* What to ask for. */
struct wd_capa {
	const char *alg;      /* algorithm, e.g. "memcpy" */
	uint32_t flags;       /* WD_CAPA_* */
	uint32_t depth;       /* ring depth, a power of two in 2..4096; 0 = 256 */
	int32_t numa_node;    /* preferred NUMA node, -1 = any */
	uint32_t reserved[3]; /* zero */
};

/* A queue; filled by wd_request_queue. Read-only for the caller.
 * When the host restarts (same socket, within WD_RECONNECT_MS, default
 * 1000 ms), the library makes the queue again by itself with the same
 * memory shared, and sends again the requests in flight that are safe to
 * repeat (a no-op, and a memcpy between ranges that do not overlap: an
 * overlapping copy may have moved its own source); others complete with
 * -ECONNRESET.
 * id and dev_name stay those of the first grant. */
struct wd_queue {
	uint32_t id;          /* host-wide queue id (at the first grant) */
	uint32_t depth;       /* most requests in flight */
	uint32_t flags;       /* granted WD_CAPA_* */
	uint32_t device_api;  /* message-format version of the device */
	char dev_name[32];    /* "dev<N>" */
	char alg[64];         /* algorithm */
	void *priv;           /* library state */
};

/* One queue type a host offers (wd_list_capas). */
struct wd_capa_info {
	char dev_name[32];
	char alg[64];
	uint32_t flags;
	uint32_t available_instances;
	uint32_t device_api;
	int32_t numa_zone_id;
	uint32_t priority;
	uint32_t reserved;
};

/* A translation fault the device hit on a queue (wd_get_faults). */
struct wd_fault {
	uint64_t seq;         /* fault number on this queue */
	uint64_t iova;        /* address the device tried to use */
	uint32_t pasid;       /* queue id */
	uint8_t write;        /* 1 write, 0 read */
	uint8_t reason;       /* 1 unmapped, 2 permission, 3 out of range, 4 no domain */
	uint16_t reserved;
};

/* ---- messages of the "memcpy" algorithm (dummy device, device_api 1) --- */

#define WD_DUMMY_OP_NOP  0    /* completes at once */
#define WD_DUMMY_OP_COPY 1    /* copy len bytes from src to dst */
#define WD_DUMMY_MAX_COPY (64u << 20)

struct wd_dummy_msg {
	uint16_t opcode;      /* in: WD_DUMMY_OP_* */
	uint16_t flags;       /* in: zero */
	int32_t status;       /* out: 0, or -EFAULT (address not shared), -EINVAL, -EMSGSIZE,
	                         -EOPNOTSUPP (unknown opcode) */
	uint64_t src;         /* in: source address */
	uint64_t dst;         /* in: destination address */
	uint64_t len;         /* in: bytes */
	uint64_t result;      /* out: bytes copied */
};

/* ---- the queue API ---------------------------------------------------- */

/* Ask for a queue. The raw queues speak one message format, the "memcpy"
 * algorithm's (struct wd_dummy_msg), which "memcpy-async" queues (an
 * asynchronous copy device) speak too; the other types wd_list_capas shows
 * are served through their own libraries and refused here with
 * -EOPNOTSUPP, wd_last_error naming the library: "cipher" and "digest"
 * through libwd_crypto (wd_crypto.h), "compress" through libwd_comp
 * (wd_comp.h), "nvme" through the NVMe calls (wd_nvme.h).
 * -ENODEV: no device serves capa->alg; -EBUSY: all in use;
 * -EDQUOT: over a per-user limit of the host (wd_last_error names it);
 * -EOPNOTSUPP: WD_CAPA_SHARE_ALL without /proc/self/mem; -EPERM: the host
 * is not trusted (WD_HOST_UIDS) or refused this user; -ENOTCONN: no host.
 * A WD_CAPA_SHARE_ALL queue is bound to this process image: after an exec
 * its requests fail with -EFAULT and the queue is broken. */
int wd_request_queue(struct wd_queue *q, struct wd_capa *capa);
/* Give the queue back; requests in flight are cancelled. */
void wd_release_queue(struct wd_queue *q);

/* Queue a request; -EAGAIN when the queue is full. */
int wd_send(struct wd_queue *q, void *req);
/* Take one completion: *req is the pointer given to wd_send. -EAGAIN: none. */
int wd_rcv(struct wd_queue *q, void **req);
/* As wd_send, but wait for room. */
int wd_send_sync(struct wd_queue *q, void *req);
/* As wd_rcv, but wait for a completion (-EAGAIN if nothing is in flight;
 * -ENOTCONN if the host goes away). */
int wd_rcv_sync(struct wd_queue *q, void **req);

/* Queue up to n requests with one wake-up of the device at most: returns
 * how many were queued (from the first; fewer than n when the queue fills),
 * -EAGAIN if none fit. A NULL request ends the batch: the ones before it
 * are queued and counted, and if it is the first, the call returns -EINVAL.
 * Since WD_0.3. */
int wd_send_batch(struct wd_queue *q, void *const *reqs, size_t n);
/* Take up to max completions: writes the request pointers given to wd_send
 * into reqs[0..count) and returns count (-EAGAIN: none ready). Since WD_0.3. */
int wd_rcv_batch(struct wd_queue *q, void **reqs, size_t max);

/* Let the device use [addr, addr+size) of memory from wd_alloc (widened to
 * whole pages). flags: 0. -EINVAL if the memory is not from wd_alloc. */
int wd_mem_share(struct wd_queue *q, const void *addr, size_t size, int flags);
/* Undo wd_mem_share (same addr and size); returns once the device can no
 * longer reach the memory. A range that is not exactly one shared range
 * (part of one, or several) is refused and stays reachable: errno is then
 * set (ENOENT; EINVAL for a NULL queue, EBADF for a dead one). Prefer
 * wd_mem_unshare2. */
void wd_mem_unshare(struct wd_queue *q, const void *addr, size_t size);
/* As wd_mem_unshare, returning 0 or a negative errno (-ENOENT: not exactly
 * one shared range, which stays shared; -ENOTCONN: a host that did not
 * answer and still lives may reach it, so it stays shared: call again).
 * Since WD_0.2. */
int wd_mem_unshare2(struct wd_queue *q, const void *addr, size_t size);

/* ---- memory, capabilities, faults, errors ---------------------------- */

/* Shareable memory (whole pages; zeroed when new, memory freed earlier in
 * the process comes back as it was left). numa_node: -1 = any, else a NUMA
 * node of this machine (/sys/devices/system/node/node<N>), -EINVAL for one
 * it lacks (a kernel without NUMA lists none: every node is then taken).
 * The pages are bound to the node where the kernel allows it, else taken
 * from any node. Memory a
 * queue still shares (wd_mem_share of a range inside it) is freed by
 * wd_free only once unshared or its queue released: the device may still
 * write it, so it is not handed out again before. */
int wd_alloc(size_t size, int numa_node, void **out);
int wd_free(void *addr);

/* Queue types of the host: writes min(max, total) entries, *count = total.
 * Every device type of the host is listed, including those only other
 * libraries serve (wd_request_queue refuses them with -EOPNOTSUPP). */
int wd_list_capas(struct wd_capa_info *out, size_t max, size_t *count);
/* Consume up to max fault records of a queue; returns how many. */
int wd_get_faults(struct wd_queue *q, struct wd_fault *out, size_t max);

/* Static text for a negative (or positive) errno. */
const char *wd_strerror(int err);
/* This thread's last error message, copied into buf (always NUL-terminated);
 * returns the message length. */
int wd_last_error(char *buf, size_t len);
/* Use a host started inside this process from now on (like WD_HOST=embedded).
 * The host comes from libwd_embedded.so, loaded now (installed beside
 * libwd.so); -EOPNOTSUPP when it cannot be found (see wd_last_error). A
 * failed switch changes nothing: the process keeps the host it had. */
int wd_use_embedded_host(void);

#ifdef __cplusplus
}
#endif

#endif /* WD_H */
