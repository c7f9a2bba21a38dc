/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * wd_comp.h: WrapDrive compression (libwd_comp.so, -lwd_comp).
 *
 * One-shot compression and decompression of deflate (raw, zlib, gzip),
 * zstd and LZ4 frames, offloaded to the host's zip device or run in the
 * calling thread with the same engines (the same bytes either way, but
 * for a deflate-family block the auto policy cuts in two between the
 * device and the caller when a host is there: a valid stream, a little
 * larger; WD_COMP_SPLIT=0 never cuts, see docs/compression.md).
 *
 * A struct wd_comp belongs to one thread at a time. It connects to the
 * host named by WD_COMP_HOST, else WD_HOST, else the default socket;
 * WD_COMP_POLICY (auto, offload, cpu), WD_COMP_THRESHOLD (bytes; smaller
 * requests stay on the CPU) and WD_COMP_FALLBACK=0 (fail with -ENOTCONN
 * instead of computing here without a queue) choose where requests run;
 * WD_COMP_JOURNAL (bytes, 4 MiB by default) bounds what a device stream
 * keeps to survive a host restart.
 * No host is not an error: requests then run here, counted as fallbacks.
 *
 * Every call returns 0 or a negative errno, and then wd_last_error()
 * (libwd.so, when linked) says why:
 *   -EINVAL     a NULL, foreign or overlapping pointer, an unknown
 *               algorithm, a level the algorithm does not take;
 *   -ENOBUFS    the output does not fit in *dst_len bytes;
 *   -EBADMSG    corrupt or truncated compressed data;
 *   -EOVERFLOW  decompression beyond max_ratio times the input;
 *   -ENOTCONN   no queue and fallback off; other errnos from the device.
 * Out-parameters are written only on success.
 */
#ifndef WD_COMP_H
#define WD_COMP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Formats (the zip device's message format numbers them the same). */
enum wd_comp_alg {
    WD_COMP_DEFLATE = 1, /* raw deflate, RFC 1951 */
    WD_COMP_ZLIB = 2,    /* zlib framing, RFC 1950 */
    WD_COMP_GZIP = 3,    /* gzip framing, RFC 1952 (one member per call) */
    WD_COMP_ZSTD = 4,    /* Zstandard frames, RFC 8878 */
    WD_COMP_LZ4 = 5,     /* LZ4 frames */
};

/* The library's default level (zlib's Z_DEFAULT_COMPRESSION). Otherwise
 * deflate formats take 0-12 (libdeflate's scale: 1-9 as zlib, 10-12
 * slower and smaller), zstd 1-22, LZ4 1. */
#define WD_COMP_DEFAULT_LEVEL (-1)

struct wd_comp;

/* Where requests went and why. */
struct wd_comp_stats {
    uint64_t offloaded;     /* run by the device, whatever their outcome */
    uint64_t cpu_threshold; /* here: smaller than the threshold */
    uint64_t cpu_policy;    /* here: policy cpu, or larger than one request (64 MiB) */
    uint64_t cpu_assist;    /* here while every device slot was busy */
    uint64_t cpu_fallback;  /* here: no queue (no host, no zip device, host gone) */
    uint64_t bytes_in;
    uint64_t bytes_out;
};

/* A compressor configured from the environment; *out on success. */
int wd_comp_new(struct wd_comp **out);
/* Free (NULL is ignored). */
void wd_comp_free(struct wd_comp *c);

/* Room that always suffices to compress len bytes with alg at any level
 * (0 for an unknown algorithm, or a len no buffer can have: past
 * SIZE_MAX / 2 - 1 MiB). */
size_t wd_comp_bound(int alg, size_t len);

/* Compress src into one stream. *dst_len: the room at dst on entry, the
 * bytes written on success. */
int wd_comp_compress(struct wd_comp *c, int alg, int level, const void *src, size_t src_len,
                     void *dst, size_t *dst_len);

/* A deflate, zlib or gzip stream compressed a piece at a time: its check
 * value and length so far (set by the first piece). */
struct wd_comp_pieces {
    uint32_t check;
    uint64_t len;
};

#define WD_COMP_PIECE_FIRST 1 /* the stream's first piece: its header first */
#define WD_COMP_PIECE_LAST 2  /* its last: a final block and the trailer */

/* Compress src as one piece of a stream of alg (WD_COMP_DEFLATE, _ZLIB or
 * _GZIP), so that a long stream leaves as its input comes: a piece that is
 * not the last ends at a full flush point (as zlib's Z_FULL_FLUSH leaves a
 * stream; the next piece starts without its history). Large pieces are
 * cut between the device and the calling thread under the auto policy.
 * *dst_len: the room on entry (wd_comp_bound + 20 always suffices), the
 * bytes written on success; *p is carried on (written on success only). */
int wd_comp_compress_piece(struct wd_comp *c, int alg, int level, struct wd_comp_pieces *p,
                           const void *src, size_t src_len, void *dst, size_t *dst_len,
                           int flags);

/* Decompress the stream at the start of src. *dst_len: the room at dst
 * on entry, the bytes written on success; *consumed (when not NULL): the
 * input bytes the stream took (deflate, zlib: its stream; gzip: its first
 * member; any rest follows it). A zstd or LZ4 src is every frame of it,
 * concatenated frames decoding as one, and must be whole frames (a rest
 * that is not a frame is -EBADMSG). max_ratio: refuse output beyond this
 * many times the input (0: no limit; at most 65535). */
int wd_comp_decompress(struct wd_comp *c, int alg, const void *src, size_t src_len,
                       size_t *consumed, void *dst, size_t *dst_len, unsigned max_ratio);

/* Counters of c. */
int wd_comp_stats(struct wd_comp *c, struct wd_comp_stats *out);

/* One buffer of a batch: src/src_len the input; dst and, on entry,
 * dst_len the room; on success dst_len is the bytes written and consumed
 * the input taken. */
struct wd_comp_buf {
    const void *src;
    size_t src_len;
    void *dst;
    size_t dst_len;
    size_t consumed;
};

/* Compress (decompress) n independent buffers, several in flight on the
 * device, the calling thread compressing too while every slot is busy.
 * The first error fails the batch; the counts of every buffer are written
 * only when all succeeded. At most 65536 buffers (-EINVAL past it). */
int wd_comp_compress_batch(struct wd_comp *c, int alg, int level, struct wd_comp_buf *bufs,
                           size_t n);
int wd_comp_decompress_batch(struct wd_comp *c, int alg, struct wd_comp_buf *bufs, size_t n,
                             unsigned max_ratio);

/* Scatter lists (struct iovec, <sys/uio.h>; at most 1024 pieces each,
 * pieces may be empty). Compress the message in src's pieces, in order,
 * into one stream written across dst's pieces, in order; *produced: the
 * bytes written on success. On the device the pieces are gathered into
 * and scattered from the request's staging memory (no copy more than one
 * contiguous buffer costs). No output piece may overlap another piece,
 * input or output (-EINVAL). Since WD_COMP_0.2. */
int wd_comp_compress_sg(struct wd_comp *c, int alg, int level, const struct iovec *src,
                        size_t n_src, const struct iovec *dst, size_t n_dst, size_t *produced);
/* Decompress the stream at the start of src's pieces into dst's pieces;
 * *consumed (when not NULL) and *produced as for wd_comp_decompress. */
int wd_comp_decompress_sg(struct wd_comp *c, int alg, const struct iovec *src, size_t n_src,
                          size_t *consumed, const struct iovec *dst, size_t n_dst,
                          size_t *produced, unsigned max_ratio);

/* Asynchronous requests (since WD_COMP_0.2). wd_comp_submit starts one
 * and returns at once with *ticket: op WD_COMP_OP_COMPRESS (level) or
 * WD_COMP_OP_DECOMPRESS (max_ratio as for wd_comp_decompress) of src
 * into dst, dst_len bytes of room. src may be reused on return (it is
 * copied); dst must stay valid and untouched until the request is
 * finished. A request the router keeps here (below the threshold, every
 * device slot busy, no queue) is computed before submit returns: its
 * error is submit's (no ticket), its result is ready at the first poll. Each ticket is finished exactly once:
 * wd_comp_poll returns -EAGAIN while the request is on the device, else
 * finishes it (0, with *produced and *consumed written where not NULL,
 * or the request's negative errno); wd_comp_wait waits. An unknown or finished
 * ticket is -EINVAL. A request whose host died is computed here from its
 * copy of the input. */
enum wd_comp_op {
    WD_COMP_OP_COMPRESS = 0,
    WD_COMP_OP_DECOMPRESS = 1,
};
int wd_comp_submit(struct wd_comp *c, int op, int alg, int level, unsigned max_ratio,
                   const void *src, size_t src_len, void *dst, size_t dst_len, uint64_t *ticket);
int wd_comp_poll(struct wd_comp *c, uint64_t ticket, size_t *consumed, size_t *produced);
int wd_comp_wait(struct wd_comp *c, uint64_t ticket, size_t *consumed, size_t *produced);

/* Streams: state that carries across calls, in a session of the zip
 * device when a queue is to be had, else in this thread. A device stream
 * whose host restarted is rebuilt from the journal it keeps (its first
 * WD_COMP_JOURNAL input bytes) on the new host, or here when fallback is
 * on; one that cannot be fails with -ENOTCONN: start a new one. Not LZ4. */
struct wd_comp_stream;

/* Flush modes (zlib's Z_NO_FLUSH, Z_SYNC_FLUSH, Z_FULL_FLUSH, Z_FINISH). */
enum wd_comp_flush {
    WD_COMP_NO_FLUSH = 0,
    WD_COMP_SYNC_FLUSH = 1,
    WD_COMP_FULL_FLUSH = 2,
    WD_COMP_FINISH = 3,
};

/* A stream: compress (non-zero) or decompress; level as above (ignored
 * when decompressing); window_bits 8-15 for deflate formats (0: 15); an
 * optional preset dictionary (at most 32 KiB; not gzip). */
int wd_comp_stream_new(struct wd_comp *c, int alg, int compress, int level, int window_bits,
                       const void *dict, size_t dict_len, struct wd_comp_stream **out);
/* Take what fits of the input and write what fits of the output.
 * *src_len: available on entry, taken on return; *dst_len: room on entry,
 * written on return; *end (optional): 1 once the stream ended (compress:
 * WD_COMP_FINISH took all input and wrote the trailer; call again with
 * room until then). */
int wd_comp_stream_run(struct wd_comp *c, struct wd_comp_stream *s, const void *src,
                       size_t *src_len, void *dst, size_t *dst_len, int flush, int *end);
/* Free (NULL is ignored); c must be the compressor that made it. */
void wd_comp_stream_free(struct wd_comp *c, struct wd_comp_stream *s);

/* Device streams of c rebuilt from their journal after a host restart,
 * and those lost (past WD_COMP_JOURNAL, a replay that answered
 * otherwise, nowhere to rebuild them). */
int wd_comp_stream_stats(struct wd_comp *c, uint64_t *rebuilt, uint64_t *lost);

/* Deflate blocks of c cut in two pieces compressed at once, one on the
 * device and one in the calling thread (WD_COMP_SPLIT, counted in no
 * field of struct wd_comp_stats). */
int wd_comp_split_stats(struct wd_comp *c, uint64_t *split);

/* Whether c may cut blocks and pieces between the device and the calling
 * thread (on: 1, the default, as WD_COMP_SPLIT configures it) or never
 * (0): a cut pays while the engine's CPU would otherwise idle, not in a
 * program whose own threads keep every CPU busy. 0, or -EINVAL (on is
 * neither 0 nor 1). Since WD_COMP_0.5. */
int wd_comp_set_split(struct wd_comp *c, int on);

#ifdef __cplusplus
}
#endif

#endif /* WD_COMP_H */
