/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * libwdz.so: zlib's ABI, with whole-buffer work sent to WrapDrive.
 *
 * Loaded before the system's libz.so.1 (LD_PRELOAD, or linked with -lwdz
 * in place of -lz), it exports every function zlib exports, under zlib's
 * symbol versions (libwdz.map). Most calls go straight on to the system
 * zlib, found with dlsym(RTLD_NEXT); these are taken over when a whole
 * buffer is at hand (docs/compression.md lists exactly when):
 *
 *   compress, compress2, uncompress, uncompress2: one call, one buffer;
 *   deflate: a stream's input up to Z_FINISH, given in one call or in
 *            several with Z_NO_FLUSH (gathered, up to 4 MiB; past it the
 *            stream leaves a 4 MiB piece at a time; 256 KiB for a gz
 *            file's stream), or up to a flush
 *            that brings 64 KiB or more (which ends a piece);
 *   inflate: a stream's first call, when its input holds the whole stream.
 *
 * Those go to libwd_comp (the zip device, or libdeflate in this thread
 * when offloading does not pay or there is no host); below 128 bytes, to
 * zlib states the thread keeps. Streams that cannot wait for their whole
 * input (inflate in pieces, inflateBack, deflate flushed on the way with
 * less, or in pieces and then given a call the pieces cannot serve) run on
 * zlib-rs here, with zlib's API. Everything else,
 * and anything the offload path refuses (corrupt data, too little room,
 * parameters libdeflate's output would not honour: window sizes below
 * 32 KiB, strategies, gzip headers), runs in the system zlib from the
 * start, so its results, errors and messages are zlib's. Output taken
 * over is a valid stream that any zlib decodes, though not byte for byte
 * what zlib would have written.
 *
 * Per stream the shim keeps a small record (found by the z_stream's
 * address) of how the stream was opened and whether it was taken over;
 * output that does not fit the caller's buffer waits in the record and
 * leaves in later calls, as zlib's own pending output does.
 *
 * WDZ_DISABLE=1 passes everything through; WDZ_MIN_BYTES is the smallest
 * buffer taken over (default: any); WD_COMP_* configure the library (see
 * wd_comp.h).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "wd_comp.h"

/* zlib-rs's inflate, from libwd_comp.so (crates/wd-comp-capi/src/zrs.rs). */
int wd__zrs_inflateInit2_(z_streamp strm, int windowBits, const char *version, int stream_size);
int wd__zrs_inflate(z_streamp strm, int flush);
int wd__zrs_inflateEnd(z_streamp strm);
int wd__zrs_inflateReset(z_streamp strm);
int wd__zrs_inflateResetKeep(z_streamp strm);
int wd__zrs_inflateCopy(z_streamp dest, z_streamp source);
int wd__zrs_inflateSetDictionary(z_streamp strm, const Bytef *dictionary, uInt dictLength);
int wd__zrs_inflateGetDictionary(z_streamp strm, Bytef *dictionary, uInt *dictLength);
int wd__zrs_inflateSync(z_streamp strm);
int wd__zrs_inflateSyncPoint(z_streamp strm);
int wd__zrs_inflatePrime(z_streamp strm, int bits, int value);
long wd__zrs_inflateMark(z_streamp strm);
int wd__zrs_inflateUndermine(z_streamp strm, int subvert);
int wd__zrs_inflateValidate(z_streamp strm, int check);
unsigned long wd__zrs_inflateCodesUsed(z_streamp strm);
int wd__zrs_deflateInit2_(z_streamp strm, int level, int method, int windowBits, int memLevel,
                          int strategy, const char *version, int stream_size);
int wd__zrs_deflate(z_streamp strm, int flush);
int wd__zrs_deflateEnd(z_streamp strm);
int wd__zrs_deflateParams(z_streamp strm, int level, int strategy);
int wd__zrs_deflateSetDictionary(z_streamp strm, const Bytef *dictionary, uInt dictLength);
int wd__zrs_deflateGetDictionary(z_streamp strm, Bytef *dictionary, uInt *dictLength);
int wd__zrs_deflateSetHeader(z_streamp strm, gz_headerp head);
int wd__zrs_deflatePrime(z_streamp strm, int bits, int value);
int wd__zrs_deflateTune(z_streamp strm, int good_length, int max_lazy, int nice_length,
                        int max_chain);
uLong wd__zrs_deflateBound(z_streamp strm, uLong sourceLen);
int wd__zrs_deflatePending(z_streamp strm, unsigned *pending, int *bits);
int wd__zrs_deflateCopy(z_streamp dest, z_streamp source);

#undef gzgetc

/* Per-thread state, in the initial-exec model: the library is preloaded
 * or linked, so its few bytes fit the static TLS block, and each access
 * is one instruction instead of a call to __tls_get_addr (a dozen of
 * which made up 4% of python's zlib.decompress of 16-byte blocks). */
#define TLS __thread __attribute__((tls_model("initial-exec")))

/* ---- the system zlib ---------------------------------------------------- */

static void *real_sym(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        /* Loaded by dlopen into a program without zlib: load it. */
        static void *handle;
        void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
        if (!h) {
            h = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
            __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
        }
        f = h ? dlsym(h, name) : NULL;
    }
    if (!f) {
        fprintf(stderr, "libwdz: the system zlib's %s was not found: %s\n", name, dlerror());
        abort();
    }
    return f;
}

/* The system zlib's `name`, looked up once. */
#define REAL(name)                                                                       \
    ({                                                                                   \
        static __typeof__(&name) fn_;                                                    \
        __typeof__(&name) f_ = __atomic_load_n(&fn_, __ATOMIC_RELAXED);                  \
        if (!f_) {                                                                       \
            f_ = (__typeof__(&name))real_sym(#name);                                     \
            __atomic_store_n(&fn_, f_, __ATOMIC_RELAXED);                                \
        }                                                                                \
        f_;                                                                              \
    })

/* ---- configuration ------------------------------------------------------ */

static int cfg_ready;
static int cfg_disabled;
static int cfg_stats; /* WDZ_STATS=1: count what is taken over (see count) */
/* Buffers below these sizes are left to zlib (WDZ_MIN_BYTES sets both).
 * None by default: small whole streams go to a zlib state the thread
 * keeps (see SMALL_DEFLATE and SMALL_WHOLE), which costs less than the
 * program's own zlib call would. */
static size_t cfg_min_deflate = 1, cfg_min_inflate = 1;

static void cfg_load(void)
{
    if (__atomic_load_n(&cfg_ready, __ATOMIC_ACQUIRE))
        return;
    const char *d = getenv("WDZ_DISABLE");
    cfg_disabled = d && strcmp(d, "1") == 0;
    const char *st = getenv("WDZ_STATS");
    cfg_stats = st && strcmp(st, "1") == 0;
    const char *m = getenv("WDZ_MIN_BYTES");
    if (m && *m) {
        char *end;
        unsigned long long v = strtoull(m, &end, 10);
        if (*end == '\0')
            cfg_min_deflate = cfg_min_inflate = v;
        else
            fprintf(stderr,
                    "libwdz: WDZ_MIN_BYTES='%s' is not a byte count (using %zu and %zu)\n", m,
                    cfg_min_deflate, cfg_min_inflate);
    }
    __atomic_store_n(&cfg_ready, 1, __ATOMIC_RELEASE);
}

/* Set while the system zlib runs a call the shim gave back to it: zlib's
 * own calls of deflate and inflate come back here, and must not try the
 * offload path a second time. */
static TLS int tl_inside;

/* Set while the system zlib initialises a stream, or works on a state
 * the shim keeps: the calls it makes inside come back here and go
 * straight to it (no records; see inflateInit2_ and kept_deflate). Each
 * had made or looked up a record: python's zlib.decompress of 16-byte
 * blocks through the shim went from 0.70x to about 0.8x the system
 * zlib's rate without them. */
static TLS int tl_initing;

/* Set while a gz* call runs (the system zlib's gzwrite, gzprintf,
 * gzflush, gzclose...): a deflate stream it opens is a gz file's (see
 * GZ_PIECE). */
static TLS int tl_gz;

/* Whether a buffer of n bytes is worth taking over, to compress (its
 * input) or to decompress (its compressed input). */
static int worth(size_t n, int deflating)
{
    cfg_load();
    size_t min = deflating ? cfg_min_deflate : cfg_min_inflate;
    return !cfg_disabled && !tl_inside && n >= min && n > 0;
}

/* Least input of an inflate stream's first call for zlib-rs to decode it:
 * below it (blocks of about 64 bytes and less) zlib-rs's set-up costs
 * more than the system zlib's whole call (python's zlib.decompress of 16
 * bytes: 0.45x stock zlib's rate on zlib-rs, 0.70x on the system zlib
 * through the shim). */
#define ZRS_MIN_IN 64

/* ---- counters (WDZ_STATS=1 prints them at exit) ------------------------- */

enum {
    ST_ONESHOT,
    ST_DEFLATE,
    ST_INFLATE,
    ST_ZRS,
    ST_ZRS_BIG,
    ST_ZRS_FLUSHED,
    ST_DECLINED,
    ST_PIECES,
    ST_COUNT
};
static unsigned long stats[ST_COUNT];

/* This thread's compressor (see comp). */
static TLS struct wd_comp *tl_comp;

/* Only when asked for: a locked add on a line every thread shares is
 * paid on each stream (about 1 ns of the shim's 125 on a 16-byte message
 * in a loop of init, inflate and end, one thread; more with several).
 * (Every stream is opened after cfg_load.) */
static void count(int what)
{
    if (cfg_stats)
        __atomic_fetch_add(&stats[what], 1, __ATOMIC_RELAXED);
}

__attribute__((destructor)) static void print_stats(void)
{
    if (!cfg_stats)
        return;
    unsigned long any = 0;
    for (int i = 0; i < ST_COUNT; i++)
        any |= stats[i];
    if (!any)
        return; /* a process that never used zlib */
    fprintf(stderr,
            "libwdz: taken over: %lu one-shot calls, %lu deflate streams, %lu inflate streams; "
            "inflate streams in pieces on zlib-rs: %lu; deflate streams on zlib-rs: %lu "
            "handed over from pieces, %lu flushed on the way; deflate streams in pieces: %lu; declined (left "
            "to zlib): %lu\n",
            stats[ST_ONESHOT], stats[ST_DEFLATE], stats[ST_INFLATE], stats[ST_ZRS],
            stats[ST_ZRS_BIG], stats[ST_ZRS_FLUSHED], stats[ST_PIECES], stats[ST_DECLINED]);
    /* Where the requests went (the exiting thread's compressor: other
     * threads' went with them). */
    struct wd_comp_stats r;
    uint64_t cut = 0;
    if (tl_comp && wd_comp_stats(tl_comp, &r) == 0 && wd_comp_split_stats(tl_comp, &cut) == 0)
        fprintf(stderr,
                "libwdz: this thread's requests: %lu on the device; here: %lu under the "
                "threshold, %lu by policy or measured cost, %lu while the device was busy, "
                "%lu without a device; %lu cut between the device and here\n",
                (unsigned long)r.offloaded, (unsigned long)r.cpu_threshold,
                (unsigned long)r.cpu_policy, (unsigned long)r.cpu_assist,
                (unsigned long)r.cpu_fallback, (unsigned long)cut);
}

/* ---- this thread's compressor ------------------------------------------ */

static pthread_key_t comp_key;
static pthread_once_t comp_once = PTHREAD_ONCE_INIT;
static TLS int tl_comp_failed;

/* When each thread that compresses through its compressor last did (see
 * deflater): milliseconds of CLOCK_MONOTONIC_COARSE, plus one (0: a free
 * slot); a thread's slot is freed when it ends. A thread that finds no
 * free slot counts as always busy. */
#define BUSY_SLOTS 64
static uint64_t busy_at[BUSY_SLOTS];
static TLS int tl_busy_slot = -1;

/* Set when this thread's key destructors begin (it is ending): what it
 * keeps (compressor, scratch buffer, spare record, zlib states) is freed
 * and not made again, since a destructor that runs later (another
 * library's, calling zlib) would have it made after its own destructor
 * ran, to be kept forever. Such calls are left to the system zlib. */
static TLS int tl_ending;

static void comp_free(void *c)
{
    if (tl_busy_slot >= 0 && tl_busy_slot < BUSY_SLOTS)
        __atomic_store_n(&busy_at[tl_busy_slot], 0, __ATOMIC_RELAXED);
    tl_ending = 1;
    if (tl_comp == c)
        tl_comp = NULL;
    wd_comp_free(c);
}
static void comp_key_make(void) { pthread_key_create(&comp_key, comp_free); }

static struct wd_comp *comp(void)
{
    if (tl_comp || tl_comp_failed || tl_ending)
        return tl_comp;
    pthread_once(&comp_once, comp_key_make);
    int rc = wd_comp_new(&tl_comp);
    if (rc != 0) {
        /* Said once per process: otherwise a setting that does not parse
         * (WD_COMP_THRESHOLD=4k, WD_COMP_POLICY=fast) silently leaves
         * everything to the system zlib. */
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "libwdz: no compressor (%s%s): nothing goes to WrapDrive\n",
                    strerror(-rc),
                    rc == -EINVAL ? ": a WD_COMP_* setting that does not parse?" : "");
        tl_comp = NULL;
        tl_comp_failed = 1;
        return NULL;
    }
    /* Freed when the thread ends. */
    pthread_setspecific(comp_key, tl_comp);
    return tl_comp;
}

/* The CPUs this process may run on (1 if it cannot tell). */
static int cpus(void)
{
    static int n;
    int got = __atomic_load_n(&n, __ATOMIC_RELAXED);
    if (!got) {
        cpu_set_t set;
        got = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        got = got > 0 ? got : 1;
        __atomic_store_n(&n, got, __ATOMIC_RELAXED);
    }
    return got;
}

/* How long after its last compression a thread counts as compressing. */
#define BUSY_MS 100

/* The least input the library cuts by default (WD_COMP_SPLIT): only
 * for as much does deflater count the busy threads (a walk of all the
 * slots), not on the small compressions it cannot concern. */
#define CUT_MIN ((size_t)16 << 10)

/* This thread's compressor, to compress with: blocks are cut between the
 * device and this thread (wd_comp_set_split) only while fewer threads
 * compress than there are CPUs, so the engine runs on a CPU that would
 * otherwise idle. pigz's two compressing threads on two CPUs, each
 * block a piece cut in two, took 0.30 s for 68 MB at level 1 against
 * 0.20 s uncut (stock zlib 0.28 s). A thread counts while it compressed
 * in the last BUSY_MS: a pool of threads that take turns still cuts.
 * `len`: the input about to be compressed. */
static struct wd_comp *deflater(size_t len)
{
    static TLS int told = -1; /* what this thread's compressor was last told */
    struct wd_comp *c = comp();
    if (!c)
        return NULL;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    uint64_t now = (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000 + 1;
    for (int i = 0; tl_busy_slot < 0 && i < BUSY_SLOTS; i++) {
        uint64_t free_slot = 0;
        if (__atomic_compare_exchange_n(&busy_at[i], &free_slot, now, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            tl_busy_slot = i;
    }
    if (tl_busy_slot < 0)
        tl_busy_slot = BUSY_SLOTS; /* (none free) */
    int busy = tl_busy_slot == BUSY_SLOTS ? cpus() : 0;
    if (tl_busy_slot < BUSY_SLOTS)
        __atomic_store_n(&busy_at[tl_busy_slot], now, __ATOMIC_RELAXED);
    if (len < CUT_MIN)
        return c;
    for (int i = 0; i < BUSY_SLOTS && busy < cpus(); i++) {
        uint64_t at = __atomic_load_n(&busy_at[i], __ATOMIC_RELAXED);
        busy += at && (at >= now || now - at < BUSY_MS); /* (another's clock read later) */
    }
    int split = busy < cpus();
    if (split != told && wd_comp_set_split(c, split) == 0)
        told = split;
    return c;
}

/* ---- per-stream records ------------------------------------------------- */

enum phase {
    FRESH,   /* nothing done yet: may be taken over */
    GATHER,  /* input taken with Z_NO_FLUSH waits in the record */
    ZLIB,    /* the system zlib has it */
    DRAIN,   /* zlib has it; output of gathered input waits in the record */
    PENDING, /* taken over; output waits in the record */
    PIECES,  /* taken over a piece at a time: input for the next piece
                gathers, the last piece's output may wait in the record */
    DONE,    /* taken over and finished */
    ZRS,     /* an inflate stream zlib-rs decodes here (`zrs`) */
};

struct record {
    /* RECORD_MAGIC: tells the record from zlib's state, whose first
     * field is a pointer (see own_record). */
    uint64_t magic;
    struct record *next;
    z_streamp strm;
    int deflating;
    int alg;      /* WD_COMP_* of a deflate stream; -1: not offloadable */
    int window;   /* windowBits as given */
    int level;
    int eligible; /* opened with parameters the offload path honours */
    int gz;       /* a gz file's deflate stream (see GZ_PIECE) */
    /* The system zlib's state is made only when a call needs it (a
     * stream taken over whole never does, nor an inflate stream zlib-rs
     * decodes): for deflate, these are its parameters; for inflate,
     * `window`. */
    int lazy;
    int method, window_bits, mem_level, strategy;
    enum phase phase;
    unsigned char *pending;
    size_t pend_len, pend_pos;
    size_t pend_cap; /* capacity when `pending` is a scratch buffer, else 0 */
    uLong adler;
    /* GATHER: the input so far, compressed whole at Z_FINISH. */
    unsigned char *gather;
    size_t gather_len, gather_cap;
    /* A lazy deflate stream's dictionary, given before any data: held
     * until the stream's engine is made (see `held`). */
    unsigned char *dict;
    size_t dict_len;
    /* zlib-rs's stream; the caller's z_stream is copied in and out around
     * each call. Inflate: made at the first call it serves and kept across
     * resets (the system zlib's state beside it stays as initialised).
     * Deflate: a stream that gathered more than one request carries goes
     * on in a fresh zlib-rs state instead of the system zlib's (phase ZLIB
     * then means zlib-rs), until its End or reset. */
    z_stream *zrs;
    int no_zrs;    /* a call only the system zlib serves came first */
    /* PIECES: the stream's check value and length so far, whether its
     * header has left, the room of `pending` (which the pieces reuse), and
     * the last 32 KiB of input before what is gathered (the history a
     * zlib-rs state taking the stream over starts from). */
    struct wd_comp_pieces pieces;
    int pieced;
    size_t piece_room;
    unsigned char *tail;
    size_t tail_len;
    /* A stream in pieces that zlib-rs took over (raw deflate, continuing
     * from the last piece's full flush point): the shim keeps the check
     * value and writes the framing's trailer. */
    int cont;
    /* PIECES: the flush of the last call (zlib's `last_flush`: a flush
     * asked again with no new input makes no progress). */
    int last_flush;
    int zlib_used; /* inflate: the system zlib's state went past its init */
    /* inflate, PENDING: input bytes of the whole stream not yet counted as
     * taken (the last one), taken with the last of the output: while
     * output waits, input remains, as zlib (whose trailer is read last)
     * leaves it, for callers such as gzread that stop at end of file
     * when no input remains. */
    size_t held_in;
    /* A stream in pieces just handed to zlib-rs by a call other than
     * deflate, nothing gathered: zlib-rs's state has seen no flush, so
     * its first deflate applies zlib's rule for a repeated flush with
     * `last_flush` (see cont_deflate). */
    int handed_flush;
};

/* Not a user-space address (the top 16 bits are set). */
#define RECORD_MAGIC 0x57445a2d52454344ull

/* A stream with no system zlib state yet (a lazy inflate stream) keeps
 * its record in its own `state` field, which only zlib reads: finding it
 * needs no table and no lock. zlib's states (inflate's and deflate's)
 * begin with a pointer to their stream, never equal to the magic. */
static struct record *own_record(z_streamp s)
{
    struct record *r = (struct record *)s->state;
    return r && r->magic == RECORD_MAGIC && r->strm == s ? r : NULL;
}

/* Every other stream's record is in a table keyed by the stream's
 * address. */
#define BUCKETS 256
static struct record *table[BUCKETS];
/* The table's lock: held for a walk along one bucket, so a spin lock (an
 * exchange to take, a store to give back) rather than a mutex, whose
 * lock and unlock calls cost about as much again as the walk: a stream
 * in the table takes it at its open, on each call and at its end (three
 * times for a one-shot stream: a tenth of the shim's cost on python's
 * zlib.decompress of 16-byte blocks, before those streams kept their
 * record in themselves). A waiter whose holder was preempted yields
 * after a while. */
static int table_lock;

static void table_take(void)
{
    for (unsigned spins = 0; __atomic_exchange_n(&table_lock, 1, __ATOMIC_ACQUIRE); spins++) {
        if (spins >= 100)
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
            __builtin_ia32_pause();
#endif
    }
}

/* Pairs with the acquiring exchange of the next table_take. */
static void table_give(void) { __atomic_store_n(&table_lock, 0, __ATOMIC_RELEASE); }

/* A fork taken while another thread holds the table's lock would leave
 * the child's copy held for ever (that thread does not exist there): fork
 * waits for the lock, and both sides give it back. */
__attribute__((constructor)) static void table_at_fork(void)
{
    pthread_atfork(table_take, table_give, table_give);
}

static size_t bucket(z_streamp s) { return ((uintptr_t)s >> 4) % BUCKETS; }

static struct record *find(z_streamp s)
{
    struct record *own = own_record(s);
    if (own)
        return own;
    table_take();
    struct record *r = table[bucket(s)];
    while (r && r->strm != s)
        r = r->next;
    table_give();
    return r;
}

/* This thread's scratch output for whole-stream work whose output does
 * not fit the caller's buffer: grown as needed and kept between calls (a
 * buffer allocated per call would be faulted in each time), freed at
 * thread exit. A stream whose output waits takes the buffer over and
 * gives it back to the thread that drains it. Only up to SCRATCH_KEEP
 * is kept: a larger one (up to MAX_ASIDE) goes once its stream is done,
 * so that one large stream does not leave a thread holding it. */
static TLS unsigned char *tl_scratch;
static TLS size_t tl_scratch_len;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *b)
{
    tl_ending = 1;
    if (tl_scratch == b) {
        tl_scratch = NULL;
        tl_scratch_len = 0;
    }
    free(b);
}

static void scratch_key_make(void) { pthread_key_create(&scratch_key, scratch_free); }

static unsigned char *scratch(size_t size)
{
    if (size <= tl_scratch_len)
        return tl_scratch;
    if (tl_ending)
        return NULL;
    pthread_once(&scratch_once, scratch_key_make);
    unsigned char *b = realloc(tl_scratch, size);
    if (!b)
        return NULL;
    tl_scratch = b;
    tl_scratch_len = size;
    pthread_setspecific(scratch_key, b);
    return b;
}

/* The most scratch a thread keeps after use: python's 64 KiB blocks,
 * which decode whole into 16 times their input (compressed, a little more
 * than 64 KiB when incompressible), reuse theirs call after call without
 * faulting it in again; a stream that needed more is rarer, and its
 * buffer's cost small beside its own work. */
#define SCRATCH_KEEP ((size_t)2 << 20)

/* After whole-stream work: a scratch buffer past SCRATCH_KEEP is freed. */
static void scratch_trim(void)
{
    if (tl_scratch_len > SCRATCH_KEEP) {
        free(tl_scratch);
        tl_scratch = NULL;
        tl_scratch_len = 0;
        pthread_setspecific(scratch_key, NULL);
    }
}

static void drop_pending(struct record *r)
{
    if (r->pending && r->pend_cap && r->pend_cap <= SCRATCH_KEEP && !tl_scratch && !tl_ending) {
        /* A scratch buffer the stream took over: back to this thread. */
        pthread_once(&scratch_once, scratch_key_make);
        tl_scratch = r->pending;
        tl_scratch_len = r->pend_cap;
        pthread_setspecific(scratch_key, tl_scratch);
    } else {
        free(r->pending);
    }
    r->pending = NULL;
    r->pend_len = r->pend_pos = r->pend_cap = 0;
    r->piece_room = 0;
}

/* Take s's record out of the table (the caller holds the lock). */
static struct record *unlink_record(z_streamp s)
{
    struct record **p = &table[bucket(s)];
    while (*p && (*p)->strm != s)
        p = &(*p)->next;
    struct record *r = *p;
    if (r)
        *p = r->next;
    return r;
}

/* What a thread keeps between streams, freed when it ends: a record
 * (a program that opens and ends a stream per message, as python's
 * zlib.decompress, then pays no allocation for it) and the system zlib
 * states small whole streams run in (see SMALL_DEFLATE, SMALL_WHOLE). */
static TLS struct record *tl_spare;
static TLS z_stream *tl_deflaters[3]; /* zlib, raw, gzip framing */
static TLS z_stream *tl_small;        /* inflate */
static TLS int tl_small_window;       /* its windowBits */
static TLS int tl_keyed;
static pthread_key_t kept_key;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;

/* At thread exit (this thread's variables still there). */
static void kept_free(void *unused)
{
    (void)unused;
    tl_ending = 1;
    free(tl_spare);
    tl_spare = NULL;
    for (int i = 0; i < 3; i++) {
        if (tl_deflaters[i]) {
            REAL(deflateEnd)(tl_deflaters[i]);
            free(tl_deflaters[i]);
            tl_deflaters[i] = NULL;
        }
    }
    if (tl_small) {
        REAL(inflateEnd)(tl_small);
        free(tl_small);
        tl_small = NULL;
    }
}

static void kept_key_make(void) { pthread_key_create(&kept_key, kept_free); }

/* Before this thread keeps anything: the key whose destructor frees it. */
static void keeping(void)
{
    if (!tl_keyed) {
        pthread_once(&kept_once, kept_key_make);
        pthread_setspecific(kept_key, (void *)1); /* non-NULL: the destructor runs */
        tl_keyed = 1;
    }
}

static void free_record(struct record *r)
{
    if (!r)
        return;
    drop_pending(r);
    free(r->gather);
    free(r->dict);
    free(r->tail);
    if (r->zrs) {
        (r->deflating ? wd__zrs_deflateEnd : wd__zrs_inflateEnd)(r->zrs);
        free(r->zrs);
    }
    if (tl_spare || tl_ending) {
        free(r);
        return;
    }
    keeping();
    tl_spare = r;
}

/* s's record, taken from the stream or out of the table (the caller
 * frees it), or NULL. */
static struct record *take(z_streamp s)
{
    struct record *own = own_record(s);
    if (own) {
        s->state = Z_NULL;
        return own;
    }
    table_take();
    struct record *r = unlink_record(s);
    table_give();
    return r;
}

static void forget(z_streamp s) { free_record(take(s)); }

/* Drop s's record from the table, if it has one there; unlike forget,
 * without reading s->state (a stream being opened may hold anything). */
static void forget_table(z_streamp s)
{
    table_take();
    struct record *old = unlink_record(s);
    table_give();
    free_record(old);
}

/* Into the table, replacing any record s had there (a stream
 * re-initialised without End). */
static void table_insert(struct record *r)
{
    table_take();
    struct record *old = unlink_record(r->strm);
    r->next = table[bucket(r->strm)];
    table[bucket(r->strm)] = r;
    table_give();
    free_record(old);
}

/* A record from this thread's spare, else a new one; NULL out of memory. */
static struct record *new_record(void)
{
    struct record *r = tl_spare;
    if (r)
        tl_spare = NULL;
    else
        r = malloc(sizeof *r);
    return r;
}

/* Keep r as s's record: in the stream itself when it is a lazy inflate
 * stream (see own_record), else in the table. */
static struct record *keep_record(z_streamp s, struct record *r)
{
    r->strm = s;
    r->magic = RECORD_MAGIC;
    if (!r->deflating && r->lazy)
        s->state = (struct internal_state *)r;
    else
        table_insert(r);
    return r;
}

/* Keep a record for s with init's parameters and state, owning nothing
 * yet. Out of memory leaves the stream to zlib alone. */
static struct record *remember(z_streamp s, const struct record *init)
{
    struct record *r = new_record();
    if (!r)
        return NULL;
    *r = *init;
    r->pending = NULL;
    r->pend_len = r->pend_pos = r->pend_cap = 0;
    r->gather = NULL;
    r->gather_len = r->gather_cap = 0;
    r->dict = NULL;
    r->dict_len = 0;
    r->zrs = NULL;
    r->tail = NULL;
    r->tail_len = 0;
    r->piece_room = 0;
    return keep_record(s, r);
}

/* The record of a copy of the stream whose record is `src`, with its own
 * gathered input and waiting output; NULL out of memory (then dest has
 * none: the copy must fail, it would lack what the source holds). */
static struct record *remember_copy(z_streamp dest, const struct record *src)
{
    struct record *r = remember(dest, src);
    if (!r)
        return NULL;
    if (src->gather_len) {
        r->gather = malloc(src->gather_len);
        if (!r->gather)
            goto fail;
        memcpy(r->gather, src->gather, src->gather_len);
        r->gather_len = r->gather_cap = src->gather_len;
    }
    if (src->dict) {
        r->dict = malloc(src->dict_len ? src->dict_len : 1);
        if (!r->dict)
            goto fail;
        memcpy(r->dict, src->dict, src->dict_len);
        r->dict_len = src->dict_len;
    }
    if (src->pending) {
        r->pending = malloc(src->pend_len ? src->pend_len : 1);
        if (!r->pending)
            goto fail;
        memcpy(r->pending, src->pending, src->pend_len);
        r->pend_len = src->pend_len;
        r->pend_pos = src->pend_pos;
        r->piece_room = src->pend_len;
    }
    if (src->tail) {
        r->tail = malloc(src->tail_len);
        if (!r->tail)
            goto fail;
        memcpy(r->tail, src->tail, src->tail_len);
        r->tail_len = src->tail_len;
    }
    return r;
fail:
    forget(dest);
    return NULL;
}

/* Move waiting output to the caller; Z_STREAM_END once all is out. */
static int serve_pending(struct record *r, z_streamp s)
{
    size_t left = r->pend_len - r->pend_pos;
    size_t n = left < s->avail_out ? left : s->avail_out;
    if (n == 0 && left > 0)
        return Z_BUF_ERROR;
    memcpy(s->next_out, r->pending + r->pend_pos, n);
    r->pend_pos += n;
    s->next_out += n;
    s->avail_out -= (uInt)n;
    s->total_out += n;
    if (r->pend_pos < r->pend_len)
        return Z_OK;
    drop_pending(r);
    if (r->held_in && s->avail_in >= r->held_in) {
        s->next_in += r->held_in;
        s->avail_in -= (uInt)r->held_in;
        s->total_in += r->held_in;
    }
    r->held_in = 0;
    r->phase = DONE;
    s->adler = r->adler;
    return Z_STREAM_END;
}

static uLong be32(const unsigned char *p)
{
    return ((uLong)p[0] << 24) | ((uLong)p[1] << 16) | ((uLong)p[2] << 8) | p[3];
}

static uLong le32(const unsigned char *p)
{
    return ((uLong)p[3] << 24) | ((uLong)p[2] << 16) | ((uLong)p[1] << 8) | p[0];
}

/* The check value zlib leaves in strm->adler after a whole stream,
 * read from the stream's own trailer. */
static uLong trailer_check(int alg, const unsigned char *stream, size_t len, uLong current)
{
    if (alg == WD_COMP_ZLIB && len >= 4)
        return be32(stream + len - 4);
    if (alg == WD_COMP_GZIP && len >= 8)
        return le32(stream + len - 8);
    return current;
}

/* ---- zlib-rs's streams -------------------------------------------------- */

/* zlib-rs (0.6.8) reports damage that its fast decoding loop finds as
 * "repeated call with bad state": the loop names the damage, and the
 * state it leaves in then overwrites the message. zlib names the damage
 * (one of the three messages below), and on a later call to a failed
 * stream keeps saying what it said. The shim says what it can: the
 * stream's message from before the call, else the three at once. */
#define ZRS_BAD_STATE "repeated call with bad state"
#define ZRS_FAST_DAMAGE                                                                  \
    "invalid literal/length code, invalid distance code or invalid distance too far back"

static char *zrs_msg(char *said, char *before)
{
    if (said && strcmp(said, ZRS_BAD_STATE) == 0)
        return before ? before : (char *)ZRS_FAST_DAMAGE;
    return said;
}

static void zrs_in(z_stream *z, const z_stream *s)
{
    z->next_in = s->next_in;
    z->avail_in = s->avail_in;
    z->next_out = s->next_out;
    z->avail_out = s->avail_out;
}

/* Back to the caller's stream. The counts grow by what this call took
 * and wrote, as zlib counts (zlib-rs keeps its own output count, which
 * inflateSync sets back to 0); a raw stream's `adler` stays the caller's,
 * as zlib leaves it (zlib-rs would say 1). */
static void zrs_out(z_stream *s, const z_stream *z, int raw)
{
    s->total_in += (uLong)(z->next_in - s->next_in);
    s->total_out += (uLong)(z->next_out - s->next_out);
    s->next_in = z->next_in;
    s->avail_in = z->avail_in;
    s->next_out = z->next_out;
    s->avail_out = z->avail_out;
    s->msg = zrs_msg(z->msg, s->msg);
    s->data_type = z->data_type;
    if (!raw)
        s->adler = z->adler;
}

static void carried(struct record *r, z_streamp s, const unsigned char *in);

/* Run `call` on zlib-rs's state with the caller's fields copied in and
 * back. On a stream zlib-rs carries on from pieces (`cont`, a raw state
 * of zlib-rs's) the shim keeps the check value: whatever input the call
 * took (deflate, and deflateParams, which deflates what it is given)
 * goes into it. */
#define ZRS_CALL(r, strm, call)                                                          \
    ({                                                                                   \
        z_stream *z_ = (r)->zrs;                                                         \
        const unsigned char *in_ = (strm)->next_in;                                      \
        zrs_in(z_, (strm));                                                              \
        __typeof__(call) ret_ = (call);                                                  \
        zrs_out((strm), z_, (r)->window < 0 || (r)->cont);                               \
        if ((r)->cont)                                                                   \
            carried((r), (strm), in_);                                                   \
        ret_;                                                                            \
    })

/* zlib-rs's level for zlib's: its level 1 trades a fifth more output for
 * speed (static codes); its level 2 is faster than zlib's level 1 and no
 * larger. */
static int zrs_level(int level) { return level == 1 ? 2 : level; }

/* A deflate call on whichever zlib has the stream. */
#define DEFLATE_CALL(r, strm, zrs_call, real_call)                                       \
    ((r) && (r)->zrs ? ZRS_CALL((r), (strm), (zrs_call)) : (real_call))

/* End a deflate stream's zlib-rs state: the stream is lazy again (no
 * zlib's state at all); zlib-rs's answer. */
static int zrs_deflate_drop(struct record *r)
{
    int ret = wd__zrs_deflateEnd(r->zrs);
    free(r->zrs);
    r->zrs = NULL;
    r->lazy = 1;
    return ret;
}

/* Below this many bytes of input a whole deflate stream (or a compress2
 * call) is compressed by the system zlib in a state this thread keeps
 * for its framing and resets for each stream, not by libdeflate, whose
 * level 1 clears a 128 KiB table on every call where zlib's reset clears
 * 64 KiB; and a program's own zlib init costs more than either when its
 * 270 KiB come from cold heap. python's zlib.compress of 16-byte blocks:
 * 0.18 s for 64 Ki blocks on the kept state, 0.62-0.81 s on the system
 * zlib, the heap deciding; at 64 bytes the kept state and libdeflate are
 * even (0.34 and 0.36 s), from 128 bytes libdeflate wins (0.40 against
 * 0.49 s). The output is zlib's own, byte for byte. */
#define SMALL_DEFLATE 128

/* Compress `len` bytes at `src` whole into `out` (`room` bytes) as zlib's
 * deflateInit2_(level, windowBits, memLevel 8, default strategy) and
 * deflate(Z_FINISH) would: the bytes written, its check value and data
 * type; -1 when it did not fit (or no state could be had). */
static long kept_deflate(int window_bits, int level, const unsigned char *src, size_t len,
                         unsigned char *out, size_t room, uLong *check, int *data_type)
{
    int i = window_bits == 15 ? 0 : window_bits == -15 ? 1 : window_bits == 31 ? 2 : -1;
    if (i < 0 || len > UINT32_MAX || tl_ending)
        return -1;
    if (room > UINT32_MAX)
        room = UINT32_MAX;
    z_stream *z = tl_deflaters[i];
    int ret;
    tl_initing++; /* zlib's init, reset and params call its other entries */
    if (z) {
        ret = REAL(deflateReset)(z);
        /* After a reset no data is owed: params only sets the level. */
        if (ret == Z_OK)
            ret = REAL(deflateParams)(z, level, Z_DEFAULT_STRATEGY);
    } else if ((z = calloc(1, sizeof *z))) {
        ret = REAL(deflateInit2_)(z, level, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY,
                                  ZLIB_VERSION, (int)sizeof *z);
        if (ret == Z_OK) {
            keeping();
            tl_deflaters[i] = z;
        } else {
            free(z);
        }
    } else {
        ret = Z_MEM_ERROR;
    }
    if (ret == Z_OK) {
        z->next_in = (z_const Bytef *)src;
        z->avail_in = (uInt)len;
        z->next_out = out;
        z->avail_out = (uInt)room;
        ret = REAL(deflate)(z, Z_FINISH);
    }
    tl_initing--;
    if (ret != Z_STREAM_END)
        return -1;
    *check = z->adler;
    *data_type = z->data_type;
    return (long)(room - z->avail_out);
}

/* Below this many compressed bytes a whole stream is decoded by the
 * system zlib in a state this thread keeps (reset for each stream), not
 * by libdeflate, which builds bigger decode tables for a block with its
 * own codes than zlib does: on 64-byte text blocks (a third of them with
 * such codes) libdeflate ran at 0.7x zlib's rate, zlib-rs beside it at
 * 0.93x (the two evicting each other's tables), a kept zlib state at
 * zlib's own rate; from 256-byte blocks libdeflate wins (1.1x). */
#define SMALL_WHOLE 128

/* Decode the whole stream at `in` (framed as windowBits `window` says)
 * into `out` with this thread's kept zlib inflate state: the state, to
 * read what it took, wrote and checked, when the stream ends within
 * `room` bytes; else NULL (nothing changed but bytes of `out`). */
static z_stream *kept_inflate(int window, const unsigned char *in, size_t len,
                              unsigned char *out, size_t room)
{
    if (len > UINT32_MAX || tl_ending)
        return NULL;
    if (room > UINT32_MAX)
        room = UINT32_MAX;
    z_stream *z = tl_small;
    int ret;
    tl_initing++; /* zlib's init and reset call its other resets */
    if (z && window == tl_small_window) {
        /* (What inflateReset2 does for an unchanged window, one call
         * fewer.) */
        ret = REAL(inflateReset)(z);
    } else if (z) {
        ret = REAL(inflateReset2)(z, window);
    } else if ((z = calloc(1, sizeof *z))) {
        ret = REAL(inflateInit2_)(z, window, ZLIB_VERSION, (int)sizeof *z);
        if (ret == Z_OK) {
            keeping();
            tl_small = z;
        } else {
            free(z);
        }
    } else {
        ret = Z_MEM_ERROR;
    }
    tl_initing--;
    if (ret != Z_OK) {
        tl_small_window = -100; /* (no windowBits: the next call resets in full) */
        return NULL;
    }
    tl_small_window = window;
    z->next_in = (z_const Bytef *)in;
    z->avail_in = (uInt)len;
    z->next_out = out;
    z->avail_out = (uInt)room;
    /* Z_FINISH: a stream that ends in this call needs no window. */
    tl_inside++;
    ret = REAL(inflate)(z, Z_FINISH);
    tl_inside--;
    return ret == Z_STREAM_END ? z : NULL;
}

/* ---- one-shot calls ----------------------------------------------------- */

int compress2(Bytef *dest, uLongf *destLen, const Bytef *source, uLong sourceLen, int level)
{
    if (destLen && worth(sourceLen, 1) && level >= -1 && level <= 9 && level != 0 &&
        sourceLen < SMALL_DEFLATE) {
        uLong check;
        int data_type;
        long n = kept_deflate(MAX_WBITS, level, source, sourceLen, dest, *destLen, &check,
                              &data_type);
        if (n >= 0) {
            *destLen = (uLongf)n;
            count(ST_ONESHOT);
            return Z_OK;
        }
        /* Too little room: zlib's own call says so. */
    } else if (destLen && worth(sourceLen, 1) && level >= -1 && level <= 9 && level != 0) {
        struct wd_comp *c = deflater(sourceLen);
        size_t room = *destLen;
        if (c && wd_comp_compress(c, WD_COMP_ZLIB, level, source, sourceLen, dest, &room) == 0) {
            *destLen = room;
            count(ST_ONESHOT);
            return Z_OK;
        }
        count(ST_DECLINED);
    }
    tl_inside++;
    int ret = REAL(compress2)(dest, destLen, source, sourceLen, level);
    tl_inside--;
    return ret;
}

int compress(Bytef *dest, uLongf *destLen, const Bytef *source, uLong sourceLen)
{
    return compress2(dest, destLen, source, sourceLen, Z_DEFAULT_COMPRESSION);
}

int uncompress2(Bytef *dest, uLongf *destLen, const Bytef *source, uLong *sourceLen)
{
    if (destLen && sourceLen && worth(*sourceLen, 0) && *destLen > 0 &&
        *sourceLen < SMALL_WHOLE) {
        z_stream *z = kept_inflate(MAX_WBITS, source, *sourceLen, dest, *destLen);
        if (z) {
            /* (The state's count: its room was at most 4 GiB, the
             * caller's may be more.) */
            *destLen = z->total_out;
            *sourceLen -= z->avail_in;
            count(ST_ONESHOT);
            return Z_OK;
        }
        /* Not whole, not valid, or too little room: zlib's call says. */
    } else if (destLen && sourceLen && worth(*sourceLen, 0) && *destLen > 0) {
        struct wd_comp *c = comp();
        size_t room = *destLen, used = 0;
        if (c && wd_comp_decompress(c, WD_COMP_ZLIB, source, *sourceLen, &used, dest, &room, 0) ==
                     0) {
            *destLen = room;
            *sourceLen = used;
            count(ST_ONESHOT);
            return Z_OK;
        }
        count(ST_DECLINED);
    }
    tl_inside++;
    int ret = REAL(uncompress2)(dest, destLen, source, sourceLen);
    tl_inside--;
    return ret;
}

int uncompress(Bytef *dest, uLongf *destLen, const Bytef *source, uLong sourceLen)
{
    return uncompress2(dest, destLen, source, &sourceLen);
}

/* ---- deflate ------------------------------------------------------------ */

/* An error zlib's deflate returns with its message (its ERR_RETURN; the
 * string is zlib's own). */
static int err_return(z_streamp strm, int err)
{
    strm->msg = (char *)REAL(zError)(err);
    return err;
}

static struct record deflate_record(int level, int windowBits, int strategy)
{
    struct record r = {.deflating = 1, .level = level, .window = windowBits, .phase = FRESH};
    if (windowBits == 15)
        r.alg = WD_COMP_ZLIB;
    else if (windowBits == -15)
        r.alg = WD_COMP_DEFLATE;
    else if (windowBits == 31)
        r.alg = WD_COMP_GZIP;
    else
        r.alg = -1; /* a smaller window than libdeflate's 32 KiB */
    r.eligible = r.alg > 0 && strategy == Z_DEFAULT_STRATEGY && level != 0 && level >= -1 &&
                 level <= 9;
    return r;
}

/* What zlib's deflateInit2_ would refuse (its checks, in its order). */
static int deflate_params_bad(z_streamp strm, int level, int method, int windowBits,
                              int memLevel, int strategy, const char *version, int stream_size)
{
    if (!version || version[0] != ZLIB_VERSION[0] || stream_size != (int)sizeof(z_stream))
        return Z_VERSION_ERROR;
    if (!strm)
        return Z_STREAM_ERROR;
    if (level == Z_DEFAULT_COMPRESSION)
        level = 6;
    if (windowBits < 0)
        windowBits = windowBits < -15 ? 0 : -windowBits;
    else if (windowBits > 15)
        windowBits -= 16;
    if (memLevel < 1 || memLevel > 9 || method != Z_DEFLATED || windowBits < 8 ||
        windowBits > 15 || level < 0 || level > 9 || strategy < 0 || strategy > Z_FIXED)
        return Z_STREAM_ERROR;
    return Z_OK;
}

int deflateInit2_(z_streamp strm, int level, int method, int windowBits, int memLevel,
                  int strategy, const char *version, int stream_size)
{
    struct record r = deflate_record(level, windowBits, strategy);
    r.gz = tl_gz > 0;
    cfg_load();
    if (r.eligible && !cfg_disabled && !tl_inside &&
        deflate_params_bad(strm, level, method, windowBits, memLevel, strategy, version,
                           stream_size) == Z_OK) {
        /* zlib's state waits until a call needs it; the fields zlib's
         * init sets, set as it sets them. */
        r.lazy = 1;
        r.method = method;
        r.window_bits = windowBits;
        r.mem_level = memLevel;
        r.strategy = strategy;
        if (remember(strm, &r)) {
            /* No state of zlib's: NULL, not what the caller left (find
             * reads it). */
            strm->state = Z_NULL;
            strm->msg = Z_NULL;
            strm->total_in = strm->total_out = 0;
            strm->data_type = Z_UNKNOWN;
            strm->adler = r.alg == WD_COMP_GZIP ? crc32(0L, Z_NULL, 0) : adler32(0L, Z_NULL, 0);
            return Z_OK;
        }
    }
    /* A record left at this address (a stream opened again without its
     * End, or memory reused) goes first, and zlib's init runs as zlib's
     * own: the deflateReset it calls comes back here, and found on a
     * lazy record it would answer for zlib without zlib's reset, leaving
     * the state just allocated unset. */
    forget_table(strm);
    tl_initing++;
    int ret = REAL(deflateInit2_)(strm, level, method, windowBits, memLevel, strategy, version,
                                  stream_size);
    tl_initing--;
    if (ret == Z_OK && !tl_initing) {
        r.lazy = 0;
        remember(strm, &r);
    }
    return ret;
}

int deflateInit_(z_streamp strm, int level, const char *version, int stream_size)
{
    return deflateInit2_(strm, level, Z_DEFLATED, MAX_WBITS, 8, Z_DEFAULT_STRATEGY, version,
                         stream_size);
}

/* Give a lazily opened stream zlib's state now; Z_OK or zlib's error. A
 * deflate stream that was taken over starts again (only a reset or a
 * call zlib refuses on a finished stream can follow). An inflate stream
 * gets the state its init would have made, and keeps its counts and
 * check value (zlib-rs or the whole path may have moved them). */
static int ensure_real_record(struct record *r, z_streamp strm)
{
    if (!r || !r->lazy)
        return Z_OK;
    /* Not lazy while zlib makes it: its init calls its resets, which
     * come back here. */
    r->lazy = 0;
    int ret;
    if (r->deflating) {
        /* (The held dictionary out of the record first: zlib's init calls
         * deflateReset, which comes back here and restarts the record.) */
        unsigned char *dict = r->dict;
        size_t dict_len = r->dict_len;
        r->dict = NULL;
        r->dict_len = 0;
        ret = REAL(deflateInit2_)(strm, r->level, r->method, r->window_bits, r->mem_level,
                                  r->strategy, ZLIB_VERSION, (int)sizeof(z_stream));
        if (ret == Z_OK && dict) {
            /* (sets `adler` as the held call did) */
            ret = REAL(deflateSetDictionary)(strm, dict, (uInt)dict_len);
            if (ret != Z_OK) {
                REAL(deflateEnd)(strm);
                ret = Z_MEM_ERROR;
            }
        }
        if (ret == Z_OK) {
            free(dict);
        } else {
            r->dict = dict;
            r->dict_len = dict_len;
        }
    } else {
        z_stream was = *strm;
        tl_initing++;
        ret = REAL(inflateInit2_)(strm, r->window, ZLIB_VERSION, (int)sizeof(z_stream));
        tl_initing--;
        strm->total_in = was.total_in;
        strm->total_out = was.total_out;
        strm->adler = was.adler;
        strm->msg = was.msg;
        if (ret == Z_OK)
            table_insert(r); /* the stream's state is zlib's now */
        else
            strm->state = was.state; /* still lazy, its record there */
    }
    if (ret != Z_OK)
        r->lazy = 1;
    return ret;
}

static int ensure_real(z_streamp strm)
{
    return ensure_real_record(strm ? find(strm) : NULL, strm);
}

/* Largest output the shim holds for a caller with a small buffer. */
#define MAX_ASIDE ((size_t)256 << 20)
/* Smallest scratch buffer a whole stream of unknown size is decoded in,
 * and the most a whole inflate stream sets aside for input of under
 * SCRATCH_FIRST / ASIDE_PER_IN bytes. */
#define SCRATCH_FIRST ((size_t)256 << 10)
/* The most a whole inflate stream sets aside per byte of its input (a
 * stream that would need more is declined): python's zlib.decompress of
 * a 64 KiB block gives 16 KiB of room, and blocks compress 2 to 8 times,
 * highly repetitive ones more (decoded within the 256 KiB floor up to
 * 8 KiB of input, 32 times above). */
#define ASIDE_PER_IN 32

/* A whole stream is done: `used` bytes of the caller's input taken, `made` output bytes
 * at `out` (the caller's buffer or this thread's scratch). Hand out what
 * fits and keep the rest. */
static int finish_whole(struct record *r, z_streamp s, size_t used, const unsigned char *out,
                        size_t made, uLong check)
{
    size_t now = out == s->next_out || made < s->avail_out ? made : s->avail_out;
    unsigned char *rest = NULL;
    if (now < made) {
        /* The rest waits in the scratch buffer itself, which the stream
         * takes over until it is drained: no copy of it. */
        if (out != tl_scratch)
            return -1;
        rest = tl_scratch;
        r->pend_cap = tl_scratch_len;
        tl_scratch = NULL;
        tl_scratch_len = 0;
        pthread_setspecific(scratch_key, NULL);
        if (!r->deflating && used > 0 && used == s->avail_in) {
            r->held_in = 1;
            used--;
        }
    }
    r->adler = check;
    s->next_in += used;
    s->avail_in -= (uInt)used;
    s->total_in += used;
    if (out != s->next_out)
        memcpy(s->next_out, out, now);
    s->next_out += now;
    s->avail_out -= (uInt)now;
    s->total_out += now;
    if (!rest) {
        s->adler = check;
        r->phase = DONE;
        return Z_STREAM_END;
    }
    r->pending = rest;
    r->pend_len = made;
    r->pend_pos = now;
    r->phase = PENDING;
    return Z_OK;
}

/* zlib's guess of the data type (trees.c, detect_data_type), over the
 * input bytes rather than the first block's literals: Z_BINARY when a
 * byte of the "black list" (0-6, 14-25, 28-31) occurs, else Z_TEXT when
 * one of the "white list" (9, 10, 13, 32-255) does, else Z_BINARY. */
static int data_type_of(const unsigned char *p, size_t n)
{
    static const uint32_t black = 0xf3ffc07fu; /* bits 0-6, 14-25, 28-31 */
    int text = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c < 32 && (black >> c & 1))
            return Z_BINARY;
        text |= c >= 32 || c == 9 || c == 10 || c == 13;
    }
    return text ? Z_TEXT : Z_BINARY;
}

/* Compress the stream's whole input, `len` bytes at `src` (the caller's
 * input, or what was gathered with the caller's last piece appended, of
 * which `used` bytes are the caller's now); Z_STREAM_END, Z_OK (output
 * waits in the record), or -1 when the offload path declined (nothing
 * was consumed or written). */
static int deflate_whole(struct record *r, z_streamp s, const unsigned char *src, size_t len,
                         size_t used)
{
    if (len < SMALL_DEFLATE && r->lazy && r->mem_level == 8) {
        /* zlib's bound for a small input with the largest header. */
        size_t bound = len + (len >> 12) + (len >> 14) + 13 + 18;
        unsigned char *out = s->avail_out >= bound ? s->next_out : scratch(bound);
        size_t room = out == s->next_out ? s->avail_out : bound;
        uLong check;
        int data_type;
        long n = out ? kept_deflate(r->window_bits, r->level, src, len, out, room, &check,
                                    &data_type)
                     : -1;
        if (n >= 0) {
            s->data_type = data_type;
            /* (A raw stream's `adler` stays as the init set it.) */
            return finish_whole(r, s, used, out, (size_t)n, r->window < 0 ? s->adler : check);
        }
    }
    struct wd_comp *c = deflater(len);
    if (!c)
        return -1;
    size_t bound = wd_comp_bound(r->alg, len);
    size_t room = s->avail_out;
    unsigned char *out = s->next_out;
    if (room < bound) {
        /* Too little room to be sure: compress aside, hand out in parts
         * (not beyond MAX_ASIDE: zlib streams a larger input in less). */
        if (bound > MAX_ASIDE)
            return -1;
        out = scratch(bound);
        if (!out)
            return -1;
        room = bound;
    }
    if (wd_comp_compress(c, r->alg, r->level, src, len, out, &room) != 0)
        return -1;
    s->data_type = data_type_of(src, len);
    return finish_whole(r, s, used, out, room, trailer_check(r->alg, out, room, s->adler));
}

/* Least data (gathered and brought by the call) for a lazy deflate stream
 * flushed on the way to go to zlib-rs rather than the system zlib:
 * zlib-rs's fresh state costs more to make than zlib's, and its speed
 * pays for it from a few KiB (a stream reset, given its level and
 * dictionary and flushed per message: 0.62x zlib's rate at 256 bytes,
 * 0.92x at 1 KiB, 1.07x at 2 KiB, 1.19x at 4 KiB, 1.3x at 16 KiB; pigz's
 * 128 KiB blocks are such messages). */
#define ZRS_DEFLATE_MIN 4096

/* Most input a stream gathers to compress whole, and the size of the
 * pieces a longer one leaves in: python's compressobj writing 20 MB in
 * 64 KiB pieces, a host there, 5 runs each (medians): 0.092 s at 2 MiB,
 * 0.095 s at 4 MiB, 0.101 s at 8 MiB, 0.113 s at 16 MiB (larger buffers
 * fault in more fresh memory and leave the caches); stock zlib, one run,
 * 0.243 s. */
#define MAX_GATHER ((size_t)4 << 20)

/* The same for a gz file's stream. zlib's gzwrite writes its output to
 * the file as deflate makes it (in gz's 8 KiB buffer), and gzoffset
 * reports the file's offset: what is in the file. zlib's deflate holds
 * at most a block (16 Ki symbols: 16 KiB of incompressible input, a few
 * hundred KiB of text) before writing it; gathered as other streams, a
 * gz file got nothing until 4 MiB of input had come (a program's
 * progress shown by gzoffset stood still, and a file being written held
 * nothing readable). Pieces of 256 KiB hold back about what zlib does on
 * text, more on incompressible data; each starts without the history
 * before it: gzwrite of 4 MB of licence texts, this project's docs and a
 * program, at levels 1, 6 and 9, wrote 0.3-0.4% more than in one piece
 * (still less than stock zlib), 1% more in 128 KiB pieces, 2-2.5% in
 * 64 KiB. */
#define GZ_PIECE ((size_t)256 << 10)

static size_t gather_max(const struct record *r) { return r->gz ? GZ_PIECE : MAX_GATHER; }

/* Least input a flush (Z_BLOCK, Z_PARTIAL_FLUSH, Z_SYNC_FLUSH,
 * Z_FULL_FLUSH) brings for it to leave as a piece (see `deflate_pieces`)
 * rather than on zlib-rs: a piece starts without the history before it,
 * which costs little on a large flush (pigz's 128 KiB blocks) and much on
 * the small messages of a protocol that flushes each one and relies on
 * the history across them. Also the least for a raw stream's dictionary
 * to be left unused (see `drops_dict`). */
#define FLUSH_PIECE_MIN ((size_t)64 << 10)

/* Whether a lazy deflate stream whose next flush or end brings `n` bytes
 * may be taken over with its dictionary unused: only a raw stream (a zlib
 * stream's header names its dictionary), and only for a large input, where
 * the dictionary helps its first 32 KiB alone: pigz, which gives each
 * 128 KiB block the 32 KiB before it, writes 1.1% more at level 1 without
 * them (-i) and 1.8% more at level 6, on 34 MB of licence texts, a
 * program and this project's sources.
 * Any inflate given the dictionary still decodes the stream. */
static int drops_dict(const struct record *r, size_t n)
{
    return r->window < 0 && n >= FLUSH_PIECE_MIN;
}

/* What zlib adds to `total_in` for a dictionary: the bytes of it that fill
 * the window (the last 2^windowBits; zlib reads them as input). */
static uLong dict_counted(const struct record *r, uInt len)
{
    int bits = r->window_bits < 0 ? -r->window_bits : r->window_bits & 15;
    uLong size = (uLong)1 << (bits == 8 ? 9 : bits); /* (zlib makes a window of 8 bits 9) */
    return len < size ? len : size;
}

/* The dictionary a stream taken over leaves unused. */
static void drop_dict(struct record *r)
{
    free(r->dict);
    r->dict = NULL;
    r->dict_len = 0;
}

/* Append `n` bytes of the caller's input to what the stream gathered;
 * 0, or -1 out of memory (nothing taken). */
static int gather_n(struct record *r, z_streamp s, size_t n)
{
    if (n == 0)
        return 0;
    if (r->gather_len + n > r->gather_cap) {
        size_t cap = r->gather_cap ? r->gather_cap : 64 << 10;
        while (cap < r->gather_len + n)
            cap *= 2;
        unsigned char *g = realloc(r->gather, cap);
        if (!g)
            return -1;
        r->gather = g;
        r->gather_cap = cap;
    }
    memcpy(r->gather + r->gather_len, s->next_in, n);
    r->gather_len += n;
    s->next_in += n;
    s->avail_in -= (uInt)n;
    s->total_in += n;
    return 0;
}

/* All of the caller's input. */
static int gather(struct record *r, z_streamp s) { return gather_n(r, s, s->avail_in); }

/* Output of gathered input run through the engine that took the stream
 * over, `len` bytes at `aside` (which the record takes): handed out before
 * anything the engine writes later (DRAIN); none, and the phase stays. */
static void set_aside(struct record *r, unsigned char *aside, size_t len)
{
    if (!len) {
        free(aside);
        return;
    }
    /* (What is there is empty: the buffer a first piece that failed
     * left, or none.) */
    drop_pending(r);
    r->pending = aside;
    r->pend_len = len;
    r->pend_pos = 0;
    r->phase = DRAIN;
}

/* zlib takes over a stream that gathered input: its state is made and the
 * gathered input run through it (Z_NO_FLUSH), output going to the
 * caller's buffer while it has room and then aside in the record, to be
 * handed out before anything zlib writes later (DRAIN). Z_OK or zlib's
 * error (Z_MEM_ERROR when the aside cannot grow). */
static int spill(struct record *r, z_streamp s, int big)
{
    /* Out of the record first: zlib's init calls deflateReset, which
     * comes back here and restarts the record. */
    unsigned char *g = r->gather;
    size_t g_len = r->gather_len, g_cap = r->gather_cap;
    r->gather = NULL;
    r->gather_len = r->gather_cap = 0;
    int was_lazy = r->lazy;
    int ret = Z_MEM_ERROR;
    if (was_lazy && (big || g_len + s->avail_in >= ZRS_DEFLATE_MIN)) {
        /* More than one request carries, or a stream flushed on the way
         * with data enough: a fresh zlib-rs state (faster than the system
         * zlib from a few KiB; fresh, so its output depends on the input
         * and dictionary alone), given what was held for it. */
        z_stream *z = calloc(1, sizeof *z);
        if (z && wd__zrs_deflateInit2_(z, zrs_level(r->level), r->method, r->window_bits,
                                       r->mem_level, r->strategy, ZLIB_VERSION,
                                       (int)sizeof *z) == Z_OK) {
            r->zrs = z;
            ret = r->dict ? ZRS_CALL(r, s, wd__zrs_deflateSetDictionary(z, r->dict,
                                                                        (uInt)r->dict_len))
                          : Z_OK;
            if (ret == Z_OK) {
                free(r->dict);
                r->dict = NULL;
                r->dict_len = 0;
                r->lazy = 0;
                count(big ? ST_ZRS_BIG : ST_ZRS_FLUSHED);
            } else {
                wd__zrs_deflateEnd(z);
                r->zrs = NULL;
                free(z);
            }
        } else {
            free(z);
        }
    }
    if (ret != Z_OK)
        ret = ensure_real(s);
    if (ret != Z_OK) {
        r->gather = g;
        r->gather_len = g_len;
        r->gather_cap = g_cap;
        return ret;
    }
    if (!was_lazy || r->zrs)
        s->total_in -= g_len; /* counted when gathered, counted again below */
    r->phase = ZLIB;
    if (!g_len) {
        free(g);
        return Z_OK;
    }
    /* zlib counts the gathered input as it takes it (the system zlib's
     * init zeroed the totals of a lazy stream); the output set aside
     * counts once handed out. */
    z_const Bytef *in = s->next_in;
    uInt in_len = s->avail_in;
    Bytef *out = s->next_out;
    uInt out_len = out ? s->avail_out : 0;
    size_t aside_cap = 0, aside_len = 0;
    unsigned char *aside = NULL;
    s->next_in = g;
    s->avail_in = (uInt)g_len;
    tl_inside++;
    while (s->avail_in > 0 && ret == Z_OK) {
        if (out_len > 0) {
            s->next_out = out;
            s->avail_out = out_len;
        } else {
            if (aside_cap - aside_len < 4096) {
                size_t cap = aside_cap ? aside_cap * 2 : g_len / 2 + 4096;
                unsigned char *a = realloc(aside, cap);
                if (!a) {
                    ret = Z_MEM_ERROR;
                    break;
                }
                aside = a;
                aside_cap = cap;
            }
            s->next_out = aside + aside_len;
            s->avail_out = (uInt)(aside_cap - aside_len);
        }
        Bytef *before = s->next_out;
        ret = DEFLATE_CALL(r, s, wd__zrs_deflate(r->zrs, Z_NO_FLUSH), REAL(deflate)(s, Z_NO_FLUSH));
        size_t made = (size_t)(s->next_out - before);
        if (out_len > 0) {
            out += made;
            out_len -= (uInt)made;
        } else {
            aside_len += made;
        }
    }
    tl_inside--;
    s->total_out -= aside_len;
    s->next_in = in;
    s->avail_in = in_len;
    s->next_out = out;
    s->avail_out = out_len;
    free(g);
    if (ret != Z_OK) {
        free(aside);
        return ret;
    }
    set_aside(r, aside, aside_len);
    return Z_OK;
}

/* Hand out output of gathered input set aside by spill(): the bytes
 * moved; the stream is zlib's alone once they are all out. */
static size_t drain(struct record *r, z_streamp s)
{
    size_t left = r->pend_len - r->pend_pos;
    size_t room = s->next_out ? s->avail_out : 0;
    size_t n = left < room ? left : room;
    if (n)
        memcpy(s->next_out, r->pending + r->pend_pos, n);
    r->pend_pos += n;
    s->next_out += n;
    s->avail_out -= (uInt)n;
    s->total_out += n;
    if (r->pend_pos == r->pend_len) {
        drop_pending(r);
        r->phase = ZLIB;
    }
    return n;
}

/* ---- deflate streams in pieces ------------------------------------------ */

/* A Z_NO_FLUSH stream that gathers more than MAX_GATHER leaves in pieces
 * of that size (wd_comp_compress_piece: the device and this thread at
 * once, libdeflate on both), each but the last ending at a full flush
 * point, instead of going on in zlib-rs: python's compressobj writing a
 * 24 MiB gzip stream ran 1.3x stock zlib in zlib-rs, 2.3x in pieces. A call
 * the pieces cannot serve (another flush, deflateParams, ...) hands the
 * stream to a raw zlib-rs state that carries on from the last piece's
 * flush point (its history the last 32 KiB of input), the shim keeping
 * the check value and writing the trailer (`cont`). */

/* The check value `check` of a stream of `alg` carried on over `len`
 * bytes at `p`. */
static uint32_t carry_check(int alg, uint32_t check, const unsigned char *p, size_t len)
{
    if (alg == WD_COMP_ZLIB)
        return (uint32_t)adler32_z(check, p, len);
    if (alg == WD_COMP_GZIP)
        return (uint32_t)crc32_z(check, p, len);
    return check;
}

/* Input a zlib-rs state carrying a stream on from its pieces took, from
 * `in` to the stream's `next_in`: into the stream's check value and
 * length, and `adler` (a raw stream's stays the caller's). */
static void carried(struct record *r, z_streamp s, const unsigned char *in)
{
    size_t took = (size_t)(s->next_in - in);
    /* (Not for none: zlib's check functions given no buffer start a
     * check anew, and a caller may pass none.) */
    if (took) {
        r->pieces.check = carry_check(r->alg, r->pieces.check, in, took);
        r->pieces.len += took;
    }
    if (r->alg != WD_COMP_DEFLATE)
        s->adler = r->pieces.check;
}

/* The trailer of a stream in pieces into t: its length. */
static size_t pieces_trailer(const struct record *r, unsigned char t[8])
{
    uint32_t c = r->pieces.check;
    uint32_t n = (uint32_t)r->pieces.len;
    if (r->alg == WD_COMP_ZLIB) {
        t[0] = c >> 24, t[1] = c >> 16, t[2] = c >> 8, t[3] = c;
        return 4;
    }
    if (r->alg == WD_COMP_GZIP) {
        t[0] = c, t[1] = c >> 8, t[2] = c >> 16, t[3] = c >> 24;
        t[4] = n, t[5] = n >> 8, t[6] = n >> 16, t[7] = n >> 24;
        return 8;
    }
    return 0;
}

/* Keep the last 32 KiB of the input so far (what was kept, then what was
 * gathered) as the history a zlib-rs state taking over would start from;
 * 0, or -1 out of memory. */
#define TAIL_MAX ((size_t)32 << 10)
static int keep_tail(struct record *r)
{
    const size_t w = TAIL_MAX;
    if (!r->tail && !(r->tail = malloc(w)))
        return -1;
    size_t g = r->gather_len;
    if (g >= w) {
        memcpy(r->tail, r->gather + g - w, w);
        r->tail_len = w;
        return 0;
    }
    size_t keep = r->tail_len + g > w ? w - g : r->tail_len;
    memmove(r->tail, r->tail + r->tail_len - keep, keep);
    memcpy(r->tail + keep, r->gather, g);
    r->tail_len = keep + g;
    return 0;
}

/* Compress what the stream gathered as its next piece (the first with the
 * framing's header, the last with its trailer) into `pending`, which is
 * empty; 0, or -1 (nothing changed). */
static int emit_piece(struct record *r, int last)
{
    struct wd_comp *c = deflater(r->gather_len);
    /* (The tail's buffer before the piece: keeping the tail once the
     * piece is made cannot fail.) */
    if (!c || (!r->tail && !(r->tail = malloc(TAIL_MAX))))
        return -1;
    size_t room = wd_comp_bound(r->alg, r->gather_len) + 20;
    if (r->piece_room < room) {
        drop_pending(r);
        if (!(r->pending = malloc(room)))
            return -1;
        r->piece_room = room;
    }
    struct wd_comp_pieces p = r->pieces;
    size_t n = room;
    int flags = (r->pieced ? 0 : WD_COMP_PIECE_FIRST) | (last ? WD_COMP_PIECE_LAST : 0);
    if (wd_comp_compress_piece(c, r->alg, r->level, &p, r->gather, r->gather_len, r->pending, &n,
                               flags) != 0)
        return -1;
    /* Only now: a piece that failed leaves its input to zlib-rs, whose
     * history must end where that input begins (see pieces_handoff). */
    keep_tail(r);
    r->pieces = p;
    r->pieced = 1;
    r->pend_len = n;
    r->pend_pos = 0;
    r->gather_len = 0;
    return 0;
}

/* Hand out what waits of the pieces' output: the bytes moved. */
static size_t serve_piece(struct record *r, z_streamp s)
{
    size_t left = r->pend_len - r->pend_pos;
    size_t n = left < s->avail_out ? left : s->avail_out;
    memcpy(s->next_out, r->pending + r->pend_pos, n);
    r->pend_pos += n;
    s->next_out += n;
    s->avail_out -= (uInt)n;
    s->total_out += n;
    if (r->pend_pos == r->pend_len)
        r->pend_pos = r->pend_len = 0; /* (the buffer stays for the next piece) */
    return n;
}

/* zlib's order of the flushes (its RANK), for its rule that a flush asked
 * again with no new input makes no progress. */
static int flush_rank(int flush) { return flush * 2 - (flush > 4 ? 9 : 0); }

/* An empty stored block, as zlib's Z_SYNC_FLUSH and Z_FULL_FLUSH write
 * when nothing came since the last flush point, into `pending` (empty);
 * the stream is at a byte boundary. 0, or -1 out of memory. */
static int empty_block(struct record *r)
{
    static const unsigned char block[5] = {0, 0, 0, 0xff, 0xff};
    if (r->piece_room < sizeof block) {
        drop_pending(r);
        if (!(r->pending = malloc(sizeof block)))
            return -1;
        r->piece_room = sizeof block;
    }
    memcpy(r->pending, block, sizeof block);
    r->pend_len = sizeof block;
    r->pend_pos = 0;
    return 0;
}

/* Not a zlib code: what deflate_pieces answers when the stream is to be
 * handed over. */
#define HAND_OVER (-100)

/* A call on a stream in pieces: zlib's answer, or HAND_OVER when it is
 * to be handed over (a piece could not be made, or a flush brought less than
 * FLUSH_PIECE_MIN: the input gathered is still there). A flush ends a
 * piece at a full flush point, which is also all that Z_BLOCK,
 * Z_PARTIAL_FLUSH and Z_SYNC_FLUSH ask (Z_BLOCK's few bits zlib would
 * hold, and deflatePending report, are none: the piece is aligned). */
static int deflate_pieces(struct record *r, z_streamp s, int flush)
{
    int flushing = flush != Z_NO_FLUSH && flush != Z_FINISH;
    int old = r->last_flush;
    r->last_flush = flush;
    if (flushing && r->pend_len == r->pend_pos && s->avail_in == 0 &&
        flush_rank(flush) <= flush_rank(old))
        return err_return(s, Z_BUF_ERROR);
    int progress = 0;
    for (;;) {
        if (r->pend_len > r->pend_pos) {
            progress |= serve_piece(r, s) > 0;
            if (s->avail_out == 0)
                r->last_flush = -1; /* (as zlib: the same flush again is no repeat) */
            if (r->pend_len > r->pend_pos)
                return progress ? Z_OK : err_return(s, Z_BUF_ERROR);
            if (flushing && r->last_flush == flush && s->avail_in == 0 && r->gather_len == 0)
                return Z_OK; /* this flush's piece is out */
        }
        size_t want = gather_max(r) - r->gather_len;
        size_t n = s->avail_in < want ? s->avail_in : want;
        if (n) {
            if (gather_n(r, s, n) != 0)
                return HAND_OVER;
            progress = 1;
        }
        if (r->gather_len == gather_max(r) && (s->avail_in || flush == Z_NO_FLUSH)) {
            if (emit_piece(r, 0) != 0)
                return HAND_OVER;
            s->adler = r->alg == WD_COMP_DEFLATE ? s->adler : r->pieces.check;
            continue;
        }
        if (flush == Z_NO_FLUSH)
            return progress ? Z_OK : err_return(s, Z_BUF_ERROR);
        if (flushing) {
            if (r->gather_len > 0 && r->gather_len < FLUSH_PIECE_MIN)
                return HAND_OVER;
            if (r->gather_len > 0 ? emit_piece(r, 0) != 0
                : flush != Z_BLOCK && empty_block(r) != 0)
                return HAND_OVER;
            s->adler = r->alg == WD_COMP_DEFLATE ? s->adler : r->pieces.check;
            serve_piece(r, s);
            if (s->avail_out == 0)
                r->last_flush = -1;
            return Z_OK;
        }
        if (emit_piece(r, 1) != 0)
            return HAND_OVER;
        r->adler = r->alg == WD_COMP_DEFLATE ? s->adler : r->pieces.check;
        r->phase = PENDING;
        int ret = serve_pending(r, s);
        /* (The buffer the pieces reused goes with the stream's end.) */
        return ret == Z_BUF_ERROR && progress ? Z_OK : ret;
    }
}

/* A stream in pieces goes on in a raw zlib-rs state from the last piece's
 * flush point, its history the input before what it gathered, which is
 * run through it now (its output waiting after the pieces', DRAIN). Z_OK
 * or Z_MEM_ERROR (nothing changed). */
static int pieces_handoff(struct record *r)
{
    z_stream *z = calloc(1, sizeof *z);
    int bits = r->window_bits < 0 ? -r->window_bits : r->window_bits & 15;
    if (!z || wd__zrs_deflateInit2_(z, zrs_level(r->level), r->method, -bits, r->mem_level,
                                    r->strategy, ZLIB_VERSION, (int)sizeof *z) != Z_OK) {
        free(z);
        return Z_MEM_ERROR;
    }
    int ret = Z_OK;
    if (r->tail_len)
        ret = wd__zrs_deflateSetDictionary(z, r->tail, (uInt)r->tail_len);
    /* Its output after what waits: a buffer of its own, the waiting bytes first. */
    size_t left = r->pend_len - r->pend_pos;
    size_t cap = left + r->gather_len / 2 + 4096;
    unsigned char *aside = ret == Z_OK ? malloc(cap) : NULL;
    if (!aside) {
        wd__zrs_deflateEnd(z);
        free(z);
        return Z_MEM_ERROR;
    }
    memcpy(aside, r->pending + r->pend_pos, left);
    size_t len = left;
    z->next_in = r->gather;
    z->avail_in = (uInt)r->gather_len;
    while (z->avail_in > 0 && ret == Z_OK) {
        if (cap - len < 4096) {
            unsigned char *a = realloc(aside, cap * 2);
            if (!a) {
                ret = Z_MEM_ERROR;
                break;
            }
            aside = a;
            cap *= 2;
        }
        z->next_out = aside + len;
        z->avail_out = (uInt)(cap - len);
        ret = wd__zrs_deflate(z, Z_NO_FLUSH);
        len = (size_t)(z->next_out - aside);
    }
    if (ret != Z_OK) {
        free(aside);
        wd__zrs_deflateEnd(z);
        free(z);
        return Z_MEM_ERROR;
    }
    r->pieces.check = carry_check(r->alg, r->pieces.check, r->gather, r->gather_len);
    r->pieces.len += r->gather_len;
    r->gather_len = 0;
    drop_pending(r);
    r->zrs = z;
    r->cont = 1;
    r->lazy = 0;
    r->phase = ZLIB;
    set_aside(r, aside, len);
    count(ST_ZRS_BIG);
    return Z_OK;
}

/* A stream in pieces goes on in zlib-rs: from the last piece's flush
 * point, or, before any piece left, as any stream past MAX_GATHER. */
static int pieces_to_zrs(struct record *r, z_streamp s)
{
    if (r->pieced)
        return pieces_handoff(r);
    r->phase = GATHER;
    r->eligible = 0;
    return spill(r, s, 1);
}

/* deflate() on zlib-rs's raw state carrying a stream in pieces on: the
 * check value kept, the trailer written after zlib-rs's end. */
static int cont_deflate(struct record *r, z_streamp s, int flush)
{
    if (r->handed_flush) {
        /* zlib's: a flush asked again with no new input and nothing
         * pending makes no progress. */
        unsigned pend = 0;
        r->handed_flush = 0;
        if (flush != Z_FINISH && s->avail_in == 0 && s->avail_out &&
            flush_rank(flush) <= flush_rank(r->last_flush) &&
            wd__zrs_deflatePending(r->zrs, &pend, Z_NULL) == Z_OK && pend == 0) {
            r->last_flush = flush;
            return err_return(s, Z_BUF_ERROR);
        }
    }
    int ret = ZRS_CALL(r, s, wd__zrs_deflate(r->zrs, flush));
    if (ret != Z_STREAM_END)
        return ret;
    unsigned char t[8];
    size_t tn = pieces_trailer(r, t);
    size_t now = tn < s->avail_out ? tn : s->avail_out;
    memcpy(s->next_out, t, now);
    s->next_out += now;
    s->avail_out -= (uInt)now;
    s->total_out += now;
    r->adler = s->adler;
    if (now == tn) {
        r->phase = DONE;
        return Z_STREAM_END;
    }
    drop_pending(r);
    if (!(r->pending = malloc(tn - now)))
        return Z_MEM_ERROR;
    memcpy(r->pending, t + now, tn - now);
    r->pend_len = tn - now;
    r->pend_pos = 0;
    r->phase = PENDING;
    return Z_OK;
}

/* deflate() on zlib-rs or the system zlib, whichever has the stream. */
static int deflate_on(struct record *r, z_streamp s, int flush)
{
    if (r && r->cont)
        return cont_deflate(r, s, flush);
    return DEFLATE_CALL(r, s, wd__zrs_deflate(r->zrs, flush), REAL(deflate)(s, flush));
}

int deflate(z_streamp strm, int flush)
{
    if (tl_initing)
        return REAL(deflate)(strm, flush); /* zlib's own call, on a kept state */
    struct record *r = strm ? find(strm) : NULL;
    /* (zlib's checks, in its order: a flush out of range is refused
     * without a message, the rest with one.) */
    if (r && (r->phase == PENDING || r->phase == DONE || r->phase == DRAIN ||
              r->phase == PIECES) &&
        (flush < 0 || flush > Z_BLOCK))
        return Z_STREAM_ERROR;
    if (r && (r->phase == PENDING || r->phase == DONE)) {
        /* As zlib answers a finished stream. */
        if (flush != Z_FINISH || !strm->next_out)
            return err_return(strm, Z_STREAM_ERROR);
        if (strm->avail_out == 0 || strm->avail_in != 0)
            return err_return(strm, Z_BUF_ERROR);
        return r->phase == PENDING ? serve_pending(r, strm) : Z_STREAM_END;
    }
    if (r && r->phase == DRAIN) {
        if (!strm->next_out || (strm->avail_in && !strm->next_in))
            return err_return(strm, Z_STREAM_ERROR);
        size_t moved = drain(r, strm);
        if (r->phase == DRAIN)
            return moved ? Z_OK : err_return(strm, Z_BUF_ERROR); /* (no room) */
        int ret = deflate_on(r, strm, flush);
        /* Progress was made in this call even if zlib made none. */
        return ret == Z_BUF_ERROR && moved ? Z_OK : ret;
    }
    if (r && r->phase == PIECES) {
        if (!strm->next_out || (strm->avail_in && !strm->next_in))
            return err_return(strm, Z_STREAM_ERROR);
        z_const Bytef *in = strm->next_in;
        Bytef *out = strm->next_out;
        int ret = strm->avail_out ? deflate_pieces(r, strm, flush) : err_return(strm, Z_BUF_ERROR);
        if (ret != HAND_OVER)
            return ret;
        ret = pieces_to_zrs(r, strm);
        if (ret != Z_OK)
            return ret;
        ret = deflate(strm, flush);
        /* The pieces may have taken input and written output before the
         * handover: progress, even if none came after it (zlib's Z_OK). */
        return ret == Z_BUF_ERROR && (strm->next_in != in || strm->next_out != out) ? Z_OK : ret;
    }
    /* (zlib's state may exist: a stream reset for its next message.) */
    size_t brought = r ? r->gather_len + strm->avail_in : 0;
    int open = r && (r->phase == FRESH || r->phase == GATHER) && r->eligible &&
               (!r->dict || drops_dict(r, brought)) && strm->next_out && strm->avail_out > 0 &&
               (strm->next_in || !strm->avail_in);
    if (open && flush == Z_NO_FLUSH && !tl_inside && !cfg_disabled &&
        r->gather_len + strm->avail_in <= gather_max(r)) {
        /* No output is owed before a flush: take the input and wait. A
         * first empty call is Z_OK (zlib would have written its header),
         * a later one Z_BUF_ERROR (no progress possible), as zlib answers. */
        if (!strm->avail_in && r->phase == GATHER)
            return err_return(strm, Z_BUF_ERROR);
        if (gather(r, strm) == 0) {
            r->phase = GATHER;
            return Z_OK;
        }
    }
    int flushing = flush == Z_BLOCK || flush == Z_PARTIAL_FLUSH || flush == Z_SYNC_FLUSH ||
                   flush == Z_FULL_FLUSH;
    if (open && r->lazy && !tl_inside && !cfg_disabled &&
        (((flush == Z_NO_FLUSH || (flush == Z_FINISH && r->phase == GATHER)) &&
          brought > gather_max(r)) ||
         (flushing && brought >= FLUSH_PIECE_MIN))) {
        /* Past what one piece holds, or flushed with much: the stream
         * leaves in pieces. */
        drop_dict(r);
        r->phase = PIECES;
        r->pieced = 0;
        r->pieces.check = 0;
        r->pieces.len = 0;
        r->last_flush = Z_NO_FLUSH;
        count(ST_PIECES);
        return deflate(strm, flush);
    }
    if (open && flush == Z_FINISH && strm->total_out == 0 && worth(brought, 1)) {
        int ret = -1;
        /* Nothing taken yet (zlib counts a dictionary as input). */
        int fresh = r->phase == FRESH &&
                    strm->total_in == (r->dict ? dict_counted(r, (uInt)r->dict_len) : 0);
        drop_dict(r);
        if (fresh) {
            ret = deflate_whole(r, strm, strm->next_in, strm->avail_in, strm->avail_in);
        } else if (r->phase == GATHER && r->gather_len + strm->avail_in <= gather_max(r)) {
            size_t used = strm->avail_in;
            z_const Bytef *at = strm->next_in;
            if (gather(r, strm) == 0) {
                /* gather() took the caller's piece; finish_whole() takes it
                 * again from the caller's view. */
                strm->next_in = at;
                strm->avail_in = (uInt)used;
                strm->total_in -= used;
                ret = deflate_whole(r, strm, r->gather, r->gather_len, used);
                if (ret < 0)
                    r->gather_len -= used;
            }
        }
        scratch_trim();
        if (ret >= 0) {
            free(r->gather);
            r->gather = NULL;
            r->gather_len = r->gather_cap = 0;
            count(ST_DEFLATE);
            return ret;
        }
        count(ST_DECLINED);
        r->eligible = 0;
    }
    if (r) {
        int big = r->gather_len + strm->avail_in > gather_max(r);
        Bytef *out = strm->next_out;
        int ret = r->phase == GATHER || r->lazy ? spill(r, strm, big) : ensure_real(strm);
        if (ret != Z_OK)
            return ret;
        /* After ensure_real: zlib's init resets the stream, which
         * marks it fresh. */
        if (r->phase != DRAIN)
            r->phase = ZLIB;
        ret = r->phase == DRAIN ? deflate(strm, flush) : deflate_on(r, strm, flush);
        /* What spill() wrote of the gathered input is this call's
         * progress, even if the room it took leaves none for the rest
         * (zlib's Z_OK). */
        return ret == Z_BUF_ERROR && strm->next_out != out ? Z_OK : ret;
    }
    return deflate_on(r, strm, flush);
}

int deflateEnd(z_streamp strm)
{
    struct record *r = strm ? take(strm) : NULL;
    int ret;
    if (r && r->lazy)
        /* zlib never had it: nothing of zlib's to free. Its answer:
         * data taken and not finished is thrown away. */
        ret = r->phase == GATHER || r->phase == PIECES ? Z_DATA_ERROR : Z_OK;
    else if (r && r->zrs)
        ret = zrs_deflate_drop(r);
    else
        ret = REAL(deflateEnd)(strm);
    free_record(r);
    return ret;
}

static void restart_record(struct record *r)
{
    if (r) {
        drop_pending(r);
        free(r->gather);
        r->gather = NULL;
        r->gather_len = r->gather_cap = 0;
        free(r->dict); /* a reset forgets the dictionary, as zlib's */
        r->dict = NULL;
        r->dict_len = 0;
        free(r->tail);
        r->tail = NULL;
        r->tail_len = 0;
        r->piece_room = 0;
        r->pieced = 0;
        r->cont = 0;
        r->held_in = 0;
        r->handed_flush = 0;
        r->phase = FRESH;
    }
}

static void restart(z_streamp strm) { restart_record(find(strm)); }

/* A reset of a stream with no system zlib's state: lazy (nothing made
 * yet) or on zlib-rs, whose state goes. The next message starts as a new
 * stream would (so its bytes do not depend on the messages before it),
 * the caller's fields as zlib's reset sets them. -1 when the system zlib
 * has the stream. */
static int lazy_reset(z_streamp strm)
{
    struct record *r = strm ? find(strm) : NULL;
    if (!r || !(r->lazy || r->zrs))
        return -1;
    if (r->zrs)
        zrs_deflate_drop(r);
    strm->total_in = strm->total_out = 0;
    strm->msg = Z_NULL;
    strm->data_type = Z_UNKNOWN;
    strm->adler = r->window > 15 ? crc32(0L, Z_NULL, 0) : adler32(0L, Z_NULL, 0);
    restart_record(r);
    return Z_OK;
}

int deflateReset(z_streamp strm)
{
    if (tl_initing)
        return REAL(deflateReset)(strm);
    if (lazy_reset(strm) == Z_OK)
        return Z_OK;
    int ret = ensure_real(strm);
    if (ret == Z_OK)
        ret = REAL(deflateReset)(strm);
    if (ret == Z_OK)
        restart(strm);
    return ret;
}

int deflateResetKeep(z_streamp strm)
{
    if (tl_initing)
        return REAL(deflateResetKeep)(strm);
    if (lazy_reset(strm) == Z_OK)
        return Z_OK;
    int ret = ensure_real(strm);
    if (ret == Z_OK)
        ret = REAL(deflateResetKeep)(strm);
    if (ret == Z_OK)
        restart(strm);
    return ret;
}

/* The stream was given something the offload path does not honour:
 * zlib has it from now on. Z_OK, or zlib's error making its state. */
static int zlib_only(z_streamp strm)
{
    struct record *r = strm ? find(strm) : NULL;
    if (!r)
        return Z_OK;
    r->eligible = 0;
    r->no_zrs = 1;
    r->zlib_used = 1;
    int bare = r->phase == PIECES && r->pieced && r->gather_len == 0;
    int ret = r->phase == PIECES   ? pieces_to_zrs(r, strm)
              : r->phase == GATHER ? spill(r, strm, 0)
                                   : ensure_real(strm);
    if (ret == Z_OK && bare && r->cont)
        r->handed_flush = 1;
    if (ret == Z_OK && r->phase == DRAIN) {
        /* zlib may write now: what waits must be out first. What does not
         * fit leaves zlib no room (or no buffer), so it writes nothing
         * and answers as with its own output pending: deflateParams
         * refuses only a flush that cannot complete, as zlib's does, and
         * the calls that write nothing answer as they would anyway. */
        drain(r, strm);
    }
    return ret;
}

/* Forward `call` once zlib has the stream (its error otherwise). */
#define ZLIB_ONLY(strm, call)                                                            \
    do {                                                                                 \
        int ret_ = zlib_only(strm);                                                      \
        return ret_ != Z_OK ? ret_ : (call);                                             \
    } while (0)

int deflateCopy(z_streamp dest, z_streamp source)
{
    struct record *r = source ? find(source) : NULL;
    if (r && r->lazy && dest) {
        /* Nothing of zlib's to copy yet: the copy is lazy too. */
        memcpy(dest, source, sizeof *dest);
        return remember_copy(dest, r) ? Z_OK : Z_MEM_ERROR;
    }
    if (r && r->zrs && dest) {
        z_stream *z = calloc(1, sizeof *z);
        if (!z || wd__zrs_deflateCopy(z, r->zrs) != Z_OK) {
            free(z);
            return Z_MEM_ERROR;
        }
        memcpy(dest, source, sizeof *dest);
        struct record *d = remember_copy(dest, r);
        if (!d) {
            wd__zrs_deflateEnd(z);
            free(z);
            return Z_MEM_ERROR;
        }
        d->zrs = z;
        return Z_OK;
    }
    int ret = REAL(deflateCopy)(dest, source);
    if (ret == Z_OK && r && !remember_copy(dest, r)) {
        REAL(deflateEnd)(dest);
        return Z_MEM_ERROR;
    }
    return ret;
}

/* Forward a deflate call once a zlib (zlib-rs, or the system's) has the
 * stream. */
#define DEFLATE_ONLY(strm, zrs_call, real_call)                                          \
    do {                                                                                 \
        int ret_ = zlib_only(strm);                                                      \
        struct record *r = ret_ == Z_OK && (strm) ? find(strm) : NULL;                   \
        return ret_ != Z_OK ? ret_ : DEFLATE_CALL(r, (strm), (zrs_call), (real_call));   \
    } while (0)

/* Whether r is a lazy deflate stream that has taken nothing yet: its
 * engine (zlib-rs or the system zlib, by the size of what comes; see
 * ZRS_DEFLATE_MIN) is not chosen yet, so parameters and a dictionary
 * given now wait in the record, as pigz gives them for each block. */
static struct record *held(z_streamp strm)
{
    struct record *r = strm && !tl_inside ? find(strm) : NULL;
    return r && r->deflating && r->lazy && !r->zrs && r->phase == FRESH ? r : NULL;
}

/* Whether r is a lazy deflate stream the shim finished (whole or in
 * pieces; its output may still wait): zlib's state for it was never made,
 * and making it now would start the stream anew (zlib's init resets it),
 * the output that waits lost. The calls that need zlib's state answer
 * instead as zlib's do on a finished stream, which has written its
 * trailer (1.2.13: deflate refuses any flush but Z_FINISH, the framing
 * no longer counts as one, nothing is pending). */
static struct record *finished(z_streamp strm)
{
    struct record *r = strm ? find(strm) : NULL;
    return r && r->deflating && r->lazy && !r->zrs && (r->phase == PENDING || r->phase == DONE)
               ? r
               : NULL;
}

/* zlib's compression function for a level (its configuration table):
 * deflateParams flushes when it changes. */
static int level_func(int level)
{
    level = level == Z_DEFAULT_COMPRESSION ? 6 : level;
    return level == 0 ? 0 : level <= 3 ? 1 : 2;
}

int deflateParams(z_streamp strm, int level, int strategy)
{
    struct record *f = finished(strm);
    if (f) {
        int l = level == Z_DEFAULT_COMPRESSION ? 6 : level;
        if (l < 0 || l > 9 || strategy < 0 || strategy > Z_FIXED)
            return Z_STREAM_ERROR;
        /* A change of function or strategy flushes with Z_BLOCK, which
         * zlib refuses on a finished stream. */
        if (strategy != f->strategy || level_func(level) != level_func(f->level))
            return err_return(strm, Z_STREAM_ERROR);
        f->level = level;
        return Z_OK;
    }
    struct record *h = held(strm);
    if (h) {
        /* zlib's checks; with nothing taken it owes no output. */
        int l = level == Z_DEFAULT_COMPRESSION ? 6 : level;
        if (l < 0 || l > 9 || strategy < 0 || strategy > Z_FIXED)
            return Z_STREAM_ERROR;
        h->level = level;
        h->strategy = strategy;
        if (l == 0 || strategy != Z_DEFAULT_STRATEGY)
            h->eligible = 0; /* not for the whole path */
        return Z_OK;
    }
    /* zlib flushes (deflate(Z_BLOCK), Z_BUF_ERROR without room) only when
     * its compression function (0 stored, 1-3 fast, 4-9 slow) or the
     * strategy changes; else it only sets the level, whatever the room.
     * Input the shim gathered has no output yet (a stream in pieces
     * compresses its next piece at the new level); zlib-rs's table is
     * zlib-ng's (1 quick, 2 fast, 3-6 medium, 7-9 slow) and its
     * deflateParams would flush where that changes: its function stays,
     * tuned as its table tunes the new level. */
    struct record *q = strm && !tl_inside ? find(strm) : NULL;
    int lv = level == Z_DEFAULT_COMPRESSION ? 6 : level;
    if (q && q->deflating && (q->zrs || (q->lazy && (q->phase == GATHER || q->phase == PIECES))) &&
        lv >= 0 && lv <= 9 &&
        strategy == q->strategy && level_func(level) == level_func(q->level)) {
        static const int tune[10][4] = {{0, 0, 0, 0},      {0, 0, 0, 0},      {4, 4, 8, 4},
                                        {4, 6, 16, 6},     {4, 12, 32, 24},   {8, 16, 32, 32},
                                        {8, 16, 128, 128}, {8, 32, 128, 256}, {32, 128, 258, 1024},
                                        {32, 258, 258, 4096}};
        const int *t = tune[zrs_level(lv)];
        int ret = q->zrs && lv ? wd__zrs_deflateTune(q->zrs, t[0], t[1], t[2], t[3]) : Z_OK;
        if (ret == Z_OK)
            q->level = level;
        return ret;
    }
    int ret = zlib_only(strm);
    struct record *r = ret == Z_OK && strm ? find(strm) : NULL;
    if (ret != Z_OK || !r || !r->zrs)
        return ret != Z_OK ? ret : REAL(deflateParams)(strm, level, strategy);
    uInt room = strm->avail_out;
    /* Here zlib flushes (the cases where it does not took the path above)
     * and refuses the change (Z_BUF_ERROR, nothing changed) when the
     * flush does not complete. zlib-rs flushes only where its own table's
     * function changes (3 to 4 is no change there) or the strategy does:
     * with the strategy unchanged it is told a passing one, so that it
     * flushes and refuses as zlib does; the second call, with nothing
     * left to flush, puts the strategy back, its flush's complaint of no
     * progress (which zlib's single flush did not make) unsaid. */
    int via = strategy == r->strategy;
    ret = ZRS_CALL(r, strm,
                   wd__zrs_deflateParams(r->zrs, zrs_level(level),
                                         !via                     ? strategy
                                         : strategy == Z_FILTERED ? Z_DEFAULT_STRATEGY
                                                                  : Z_FILTERED));
    if (ret == Z_OK && via) {
        char *said = strm->msg, *zrs_said = r->zrs->msg;
        ret = ZRS_CALL(r, strm, wd__zrs_deflateParams(r->zrs, zrs_level(level), strategy));
        strm->msg = said;
        r->zrs->msg = zrs_said;
    }
    if (r->handed_flush && room)
        r->last_flush = Z_BLOCK; /* (zlib's deflateParams flushed with it) */
    if (ret == Z_OK) {
        /* Kept across a reset, as zlib keeps them: the reset drops
         * zlib-rs's state, and the next one is made from the record. */
        r->level = level;
        r->strategy = strategy;
    }
    return ret;
}

/* Whether r is a stream in pieces, or one zlib-rs carries on from them. */
static int in_pieces(const struct record *r) { return r && (r->phase == PIECES || r->cont); }

int deflateSetDictionary(z_streamp strm, const Bytef *dictionary, uInt dictLength)
{
    struct record *f = finished(strm);
    if (f) {
        /* zlib takes one after the end (its framing's part is over), and
         * counts it as input; it is never used. */
        if (!dictionary)
            return Z_STREAM_ERROR;
        strm->total_in += dict_counted(f, dictLength);
        return Z_OK;
    }
    struct record *p = strm ? find(strm) : NULL;
    if (p && p->deflating && p->lazy && p->phase == GATHER && p->window > 0)
        return Z_STREAM_ERROR; /* as zlib: its header is written at the first call */
    if (in_pieces(p) && p->window > 0)
        return Z_STREAM_ERROR; /* as zlib: not after data, never for gzip */
    struct record *h = held(strm);
    if (h && dictionary && !h->dict) {
        /* As zlib answers: no dictionary in a gzip stream; a zlib
         * stream's check value starts from it. */
        if (h->window > 15)
            return Z_STREAM_ERROR;
        unsigned char *d = malloc(dictLength ? dictLength : 1);
        if (d) {
            memcpy(d, dictionary, dictLength);
            h->dict = d;
            h->dict_len = dictLength;
            /* (Taken over only where it may go unused: see drops_dict.) */
            if (h->window > 0)
                strm->adler = adler32(strm->adler, dictionary, dictLength);
            /* Counted as zlib counts it. The system zlib taking the stream
             * over counts it again from its init, which zeroes the count. */
            strm->total_in += dict_counted(h, dictLength);
            return Z_OK;
        }
    }
    int ret = zlib_only(strm);
    if (ret != Z_OK)
        return ret;
    struct record *r = strm ? find(strm) : NULL;
    if (!r || !r->zrs)
        return REAL(deflateSetDictionary)(strm, dictionary, dictLength);
    ret = ZRS_CALL(r, strm, wd__zrs_deflateSetDictionary(r->zrs, dictionary, dictLength));
    if (ret == Z_OK)
        strm->total_in += dict_counted(r, dictLength); /* (zlib-rs moves no input) */
    return ret;
}

int deflateSetHeader(z_streamp strm, gz_headerp head)
{
    if (finished(strm))
        return Z_STREAM_ERROR; /* (zlib's: the gzip framing is over) */
    struct record *p = strm ? find(strm) : NULL;
    if (in_pieces(p))
        return p->window > 15 ? Z_OK : Z_STREAM_ERROR; /* zlib's answers, too late to matter */
    DEFLATE_ONLY(strm, wd__zrs_deflateSetHeader(r->zrs, head), REAL(deflateSetHeader)(strm, head));
}

int deflatePrime(z_streamp strm, int bits, int value)
{
    /* zlib's answers; the bits, which it would put after the trailer,
     * are dropped. */
    if (finished(strm))
        return bits < 0 || bits > 16 ? Z_BUF_ERROR : Z_OK;
    DEFLATE_ONLY(strm, wd__zrs_deflatePrime(r->zrs, bits, value),
                 REAL(deflatePrime)(strm, bits, value));
}

int deflateTune(z_streamp strm, int good_length, int max_lazy, int nice_length, int max_chain)
{
    if (finished(strm))
        return Z_OK; /* (too late to matter) */
    DEFLATE_ONLY(strm, wd__zrs_deflateTune(r->zrs, good_length, max_lazy, nice_length, max_chain),
                 REAL(deflateTune)(strm, good_length, max_lazy, nice_length, max_chain));
}

int deflatePending(z_streamp strm, unsigned *pending, int *bits)
{
    struct record *r = strm ? find(strm) : NULL;
    if (r && (r->phase == PENDING || r->phase == PIECES)) {
        if (pending)
            *pending = (unsigned)(r->pend_len - r->pend_pos);
        if (bits)
            *bits = 0;
        return Z_OK;
    }
    if (r && r->phase == DRAIN) {
        int ret = DEFLATE_CALL(r, strm, wd__zrs_deflatePending(r->zrs, pending, bits),
                               REAL(deflatePending)(strm, pending, bits));
        if (ret == Z_OK && pending)
            *pending += (unsigned)(r->pend_len - r->pend_pos);
        return ret;
    }
    if (r && r->lazy) {
        /* Nothing of zlib's yet: nothing pending. */
        if (pending)
            *pending = 0;
        if (bits)
            *bits = 0;
        return Z_OK;
    }
    return DEFLATE_CALL(r, strm, wd__zrs_deflatePending(r->zrs, pending, bits),
                        REAL(deflatePending)(strm, pending, bits));
}

uLong deflateBound(z_streamp strm, uLong sourceLen)
{
    /* zlib's bound for a stream it does not know is its most cautious. */
    struct record *r = strm ? find(strm) : NULL;
    if (r && r->zrs) {
        unsigned char t[8];
        return wd__zrs_deflateBound(r->zrs, sourceLen) + (r->cont ? pieces_trailer(r, t) : 0);
    }
    /* (a held dictionary: a zlib stream's header carries its check value) */
    /* zlib's bound for an unknown stream counts a zlib wrapper (6 bytes):
     * a gzip stream's is 18. */
    return REAL(deflateBound)(r && r->lazy ? Z_NULL : strm, sourceLen) + (r && r->dict ? 4 : 0) +
           (r && r->lazy && r->window > 15 ? 18 - 6 : 0);
}

int deflateGetDictionary(z_streamp strm, Bytef *dictionary, uInt *dictLength)
{
    struct record *f = finished(strm);
    if (f) {
        /* zlib's: the last 32 KiB of input. A stream in pieces kept them;
         * a whole stream's input was the caller's, not kept: none. */
        size_t len = f->pieced ? f->tail_len : 0;
        if (dictionary && len)
            memcpy(dictionary, f->tail, len);
        if (dictLength)
            *dictLength = (uInt)len;
        return Z_OK;
    }
    DEFLATE_ONLY(strm, wd__zrs_deflateGetDictionary(r->zrs, dictionary, dictLength),
                 REAL(deflateGetDictionary)(strm, dictionary, dictLength));
}

/* ---- inflate ------------------------------------------------------------ */

/* Windows libdeflate's decoder honours exactly: 32 KiB (and 0, "as the
 * zlib header says"); the rest stay with zlib, which refuses streams
 * wider than the window it was given. */
static int inflate_window_eligible(int windowBits)
{
    return windowBits == 15 || windowBits == 0 || windowBits == -15 || windowBits == 31 ||
           windowBits == 47;
}

/* Made in place (cleared, then its fields set) rather than built beside
 * it and copied, as remember does: python's zlib.decompress opens a
 * stream per message. */
static struct record *inflate_opened(z_streamp s, int windowBits, int lazy)
{
    struct record *r = new_record();
    if (!r)
        return NULL;
    memset(r, 0, sizeof *r);
    r->window = windowBits;
    r->phase = FRESH;
    r->lazy = lazy;
    r->eligible = inflate_window_eligible(windowBits);
    return keep_record(s, r);
}

int inflateInit_(z_streamp strm, const char *version, int stream_size)
{
    return inflateInit2_(strm, MAX_WBITS, version, stream_size);
}

int inflateInit2_(z_streamp strm, int windowBits, const char *version, int stream_size)
{
    cfg_load();
    /* A stream the offload path may take whole gets no zlib state of its
     * own (7 KiB, and a 32 KiB window) until a call needs one: one taken
     * whole never does. What zlib's init checks and sets, checked and
     * set as it does. */
    if (inflate_window_eligible(windowBits) && !cfg_disabled && !tl_inside && !tl_initing &&
        strm && version && version[0] == ZLIB_VERSION[0] &&
        stream_size == (int)sizeof(z_stream) && inflate_opened(strm, windowBits, 1)) {
        strm->msg = Z_NULL;
        strm->total_in = strm->total_out = 0;
        if (windowBits >= 0)
            strm->adler = windowBits & 16 ? 0 : 1; /* as zlib's reset: gzip 0, zlib 1 */
        return Z_OK;
    }
    tl_initing++;
    int ret = REAL(inflateInit2_)(strm, windowBits, version, stream_size);
    tl_initing--;
    if (ret == Z_OK && !tl_initing)
        inflate_opened(strm, windowBits, 0);
    return ret;
}

/* A small whole stream, as inflate_whole takes one, on the kept state:
 * into the caller's buffer, declined unless it ends there. */
static int small_whole(struct record *r, z_streamp s)
{
    z_stream *z = kept_inflate(r->window, s->next_in, s->avail_in, s->next_out, s->avail_out);
    if (!z)
        return -1;
    s->data_type = z->data_type;
    /* (A raw stream's `adler` is the caller's: zlib leaves it.) */
    return finish_whole(r, s, s->avail_in - z->avail_in, s->next_out,
                        s->avail_out - z->avail_out, r->window < 0 ? s->adler : z->adler);
}

/* Decompress a whole stream from the stream's input; as deflate_whole. */
static int inflate_whole(struct record *r, z_streamp s)
{
    struct wd_comp *c = comp();
    if (!c)
        return -1;
    int alg;
    if (r->window == -15)
        alg = WD_COMP_DEFLATE;
    else if (r->window == 31)
        alg = WD_COMP_GZIP;
    else if (r->window == 47)
        alg = s->avail_in >= 2 && s->next_in[0] == 0x1f && s->next_in[1] == 0x8b ? WD_COMP_GZIP
                                                                                 : WD_COMP_ZLIB;
    else
        alg = WD_COMP_ZLIB;
    /* libdeflate skips a gzip header's CRC (FHCRC) without checking it,
     * which zlib checks ("header crc mismatch"): such a member is left to
     * zlib's semantics. */
    if (alg == WD_COMP_GZIP && (s->avail_in < 4 || (s->next_in[3] & 0x02)))
        return -1;
    /* The most set aside for this stream: the input is untrusted (a few
     * hundred bytes may decode to gigabytes, a gzip trailer may claim any
     * size), and a stream the aside cannot hold is declined, to zlib-rs,
     * which decodes as much as the caller's room takes. */
    size_t limit = (size_t)s->avail_in * ASIDE_PER_IN;
    if (limit < SCRATCH_FIRST)
        limit = SCRATCH_FIRST;
    if (limit > MAX_ASIDE)
        limit = MAX_ASIDE;
    /* A guess of the output: a gzip member ends with its size (when the
     * input is exactly one member), believed within the bound or the
     * caller's room; otherwise text's usual ratio. */
    size_t guess = (size_t)s->avail_in * 4;
    int exact = 0;
    if (alg == WD_COMP_GZIP && s->avail_in >= 18) {
        size_t isize = le32(s->next_in + s->avail_in - 4);
        if (isize > 0 && (isize <= limit || isize <= s->avail_out)) {
            guess = isize;
            exact = 1;
        }
    }
    size_t used = 0, room = s->avail_out;
    unsigned char *out = s->next_out;
    int ret = -ENOBUFS;
    if (s->avail_out >= guess)
        ret = wd_comp_decompress(c, alg, s->next_in, s->avail_in, &used, out, &room, 0);
    /* Aside, room well beyond a guess: a stream that does not fit is
     * decoded again from the start, which costs as much as the first
     * time (18% of the 64 KiB blocks of 18 MB of /usr/share/doc,
     * /usr/bin and this project's sources compress more than 4 to 1 at
     * level 1), while the scratch buffer is kept and its size paid for
     * once. */
    size_t size = guess > s->avail_out ? guess : 2 * (size_t)s->avail_out;
    if (!exact) {
        size_t roomy = (size_t)s->avail_in * 16;
        if (roomy < SCRATCH_FIRST)
            roomy = SCRATCH_FIRST;
        if (size < roomy)
            size = roomy;
    }
    if (size > limit)
        size = limit;
    /* (An aside no larger than the caller's room would hold no more.) */
    while (ret == -ENOBUFS && size > s->avail_out) {
        out = scratch(size);
        if (!out)
            return -1;
        room = size;
        ret = wd_comp_decompress(c, alg, s->next_in, s->avail_in, &used, out, &room, 0);
        if (size == limit)
            break;
        size = size <= limit / 2 ? size * 2 : limit;
    }
    if (ret != 0)
        return -1;
    /* As zlib leaves it at the end: the last block seen (64), plus the
     * bits left unused in the last byte, none after a trailer (a raw
     * stream's, which the decoder does not say, are taken as none). */
    int done = finish_whole(r, s, used, out, room, trailer_check(alg, s->next_in, used, s->adler));
    if (done >= 0)
        s->data_type = 64;
    return done;
}

/* ---- inflate streams in pieces: zlib-rs ---------------------------------- */

/* The stream's zlib-rs state, made when first needed (NULL: out of memory
 * or refused, and the system zlib serves the stream). */
static z_stream *zrs_state(struct record *r)
{
    if (r->zrs)
        return r->zrs;
    z_stream *z = calloc(1, sizeof *z);
    if (!z)
        return NULL;
    if (wd__zrs_inflateInit2_(z, r->window, ZLIB_VERSION, (int)sizeof *z) != Z_OK) {
        free(z);
        return NULL;
    }
    r->zrs = z;
    return z;
}

/* Whether zlib-rs may decode the stream: only with a 32 KiB window.
 * zlib-rs keeps 32 KiB of history whatever the window, so with a smaller
 * one (windowBits 8-14, raw or gzip, or 0 and a zlib header naming one)
 * it decodes distances past the window that zlib refuses ("invalid
 * distance too far back"), as with inflateBack. */
static int zrs_window(const struct record *r, z_streamp s)
{
    int w = r->window;
    if (w == 15 || w == -15 || w == 31 || w == 47)
        return 1;
    /* (the zlib header's CINFO: 7 is 32 KiB) */
    return w == 0 && s->next_in && s->avail_in >= 1 && (s->next_in[0] >> 4) == 7;
}

/* The record of a stream zlib-rs serves, else NULL. */
static struct record *on_zrs(z_streamp strm)
{
    struct record *r = strm ? find(strm) : NULL;
    return r && r->phase == ZRS ? r : NULL;
}

/* inflate on zlib-rs. zlib returns Z_NEED_DICT from inside its decoding
 * loop, past the accounting that ends its other returns: the header bytes
 * that call read leave next_in and avail_in but never reach total_in, and
 * data_type stays as it was; zlib-rs counts them, as its other returns. */
static int zrs_inflate(struct record *r, z_streamp strm, int flush)
{
    uLong total_in = strm->total_in;
    int data_type = strm->data_type;
    int ret = ZRS_CALL(r, strm, wd__zrs_inflate(r->zrs, flush));
    if (ret == Z_NEED_DICT) {
        strm->total_in = total_in;
        strm->data_type = data_type;
    }
    return ret;
}

int inflate(z_streamp strm, int flush)
{
    struct record *r = strm ? find(strm) : NULL;
    if (r && r->phase == ZRS)
        return zrs_inflate(r, strm, flush);
    if (r && (r->phase == PENDING || r->phase == DONE)) {
        if (!strm->next_out || (!strm->next_in && strm->avail_in != 0))
            return Z_STREAM_ERROR;
        int ret = r->phase == PENDING ? serve_pending(r, strm) : Z_STREAM_END;
        /* zlib's rule: with Z_FINISH, a call that does not reach the end
         * is Z_BUF_ERROR. */
        return ret == Z_OK && flush == Z_FINISH ? Z_BUF_ERROR : ret;
    }
    /* (Z_BLOCK and Z_TREES stop at block boundaries, which a stream
     * decoded whole has no answer for.) */
    if (r && r->phase == FRESH && r->eligible && strm->total_in == 0 && strm->total_out == 0 &&
        strm->next_in && strm->next_out && flush != Z_BLOCK && flush != Z_TREES &&
        worth(strm->avail_in, 0)) {
        int ret = strm->avail_in < SMALL_WHOLE ? small_whole(r, strm) : inflate_whole(r, strm);
        scratch_trim();
        if (ret >= 0) {
            count(ST_INFLATE);
            return ret == Z_OK && flush == Z_FINISH ? Z_BUF_ERROR : ret;
        }
        count(ST_DECLINED);
        /* Not whole, not valid, or not for us: zlib reads it from the
         * start (nothing was consumed) and says what it finds. */
        r->eligible = 0;
    }
    /* Input in pieces (or declined whole): zlib-rs decodes it, unless a
     * call only the system zlib serves came first, or the first piece is
     * small (see ZRS_MIN_IN). */
    if (r && r->phase == FRESH && !r->no_zrs && strm->avail_in >= ZRS_MIN_IN &&
        zrs_window(r, strm) && zrs_state(r)) {
        r->phase = ZRS;
        count(ST_ZRS);
        return zrs_inflate(r, strm, flush);
    }
    if (r) {
        int ret = ensure_real_record(r, strm);
        if (ret != Z_OK)
            return ret;
        r->phase = ZLIB;
        r->zlib_used = 1;
    }
    return REAL(inflate)(strm, flush);
}

int inflateEnd(z_streamp strm)
{
    struct record *r = strm ? take(strm) : NULL;
    int ret = Z_OK;
    if (!r || !r->lazy)
        ret = REAL(inflateEnd)(strm); /* (take left a lazy stream's state NULL, as zlib's End) */
    free_record(r);
    return ret;
}

/* Reset a stream for its next message: zlib-rs's state when it has one,
 * the system zlib's when that was used (else it is still as initialised:
 * a message read through zlib-rs costs no reset of it); the stream may be
 * taken over again. */
static int inflate_reset(z_streamp strm, int (*zrs_reset)(z_streamp),
                         int (*zlib_reset)(z_streamp))
{
    if (tl_initing)
        return zlib_reset(strm);
    struct record *r = strm ? find(strm) : NULL;
    int ret = Z_OK;
    if (!r || (!r->lazy && (!r->zrs || r->zlib_used))) {
        ret = zlib_reset(strm);
        if (r)
            r->zlib_used = 0;
    } else {
        strm->total_in = strm->total_out = 0;
        strm->msg = Z_NULL;
        if (r->window >= 0)
            strm->adler = r->window & 16 ? 0 : 1; /* as zlib's reset: gzip 0, zlib 1 */
    }
    if (ret == Z_OK && r && r->zrs && zrs_reset(r->zrs) != Z_OK) {
        wd__zrs_inflateEnd(r->zrs);
        free(r->zrs);
        r->zrs = NULL;
    }
    if (ret == Z_OK)
        restart_record(r);
    return ret;
}

int inflateReset(z_streamp strm)
{
    return inflate_reset(strm, wd__zrs_inflateReset, REAL(inflateReset));
}

int inflateResetKeep(z_streamp strm)
{
    return inflate_reset(strm, wd__zrs_inflateResetKeep, REAL(inflateResetKeep));
}

int inflateReset2(z_streamp strm, int windowBits)
{
    if (tl_initing)
        return REAL(inflateReset2)(strm, windowBits);
    /* zlib checks the new window against its state. */
    int ret = ensure_real(strm);
    if (ret == Z_OK)
        ret = REAL(inflateReset2)(strm, windowBits);
    if (ret == Z_OK)
        inflate_opened(strm, windowBits, 0); /* a new record: zlib-rs's state is made anew */
    return ret;
}

int inflateCopy(z_streamp dest, z_streamp source)
{
    struct record *src = source ? find(source) : NULL;
    int lazy = src && src->lazy && dest;
    if (lazy) {
        /* Nothing of zlib's to copy: the copy is lazy too. */
        memcpy(dest, source, sizeof *dest);
    } else {
        int ret = REAL(inflateCopy)(dest, source);
        if (ret != Z_OK)
            return ret;
    }
    struct record *r = src ? remember_copy(dest, src) : NULL;
    if (src && !r) {
        if (lazy)
            dest->state = Z_NULL; /* not the source's record */
        else
            REAL(inflateEnd)(dest);
        return Z_MEM_ERROR;
    }
    if (src && src->zrs) {
        z_stream *z = calloc(1, sizeof *z);
        if (!z || wd__zrs_inflateCopy(z, src->zrs) != Z_OK) {
            free(z);
            if (!lazy)
                REAL(inflateEnd)(dest);
            forget(dest);
            return Z_MEM_ERROR;
        }
        r->zrs = z;
    }
    return Z_OK;
}

int inflateSetDictionary(z_streamp strm, const Bytef *dictionary, uInt dictLength)
{
    struct record *r = on_zrs(strm);
    if (r)
        return ZRS_CALL(r, strm, wd__zrs_inflateSetDictionary(r->zrs, dictionary, dictLength));
    ZLIB_ONLY(strm, REAL(inflateSetDictionary)(strm, dictionary, dictLength));
}

int inflateGetHeader(z_streamp strm, gz_headerp head)
{
    /* Asked before the first inflate (as zlib requires): the system zlib
     * fills the caller's header. */
    ZLIB_ONLY(strm, REAL(inflateGetHeader)(strm, head));
}

int inflatePrime(z_streamp strm, int bits, int value)
{
    struct record *r = on_zrs(strm);
    if (r)
        return ZRS_CALL(r, strm, wd__zrs_inflatePrime(r->zrs, bits, value));
    ZLIB_ONLY(strm, REAL(inflatePrime)(strm, bits, value));
}

int inflateSync(z_streamp strm)
{
    struct record *r = on_zrs(strm);
    if (r)
        return ZRS_CALL(r, strm, wd__zrs_inflateSync(r->zrs));
    ZLIB_ONLY(strm, REAL(inflateSync)(strm));
}

int inflateUndermine(z_streamp strm, int subvert)
{
    struct record *r = on_zrs(strm);
    if (r)
        return ZRS_CALL(r, strm, wd__zrs_inflateUndermine(r->zrs, subvert));
    ZLIB_ONLY(strm, REAL(inflateUndermine)(strm, subvert));
}

int inflateValidate(z_streamp strm, int check)
{
    struct record *r = on_zrs(strm);
    if (r)
        return ZRS_CALL(r, strm, wd__zrs_inflateValidate(r->zrs, check));
    ZLIB_ONLY(strm, REAL(inflateValidate)(strm, check));
}

int inflateGetDictionary(z_streamp strm, Bytef *dictionary, uInt *dictLength)
{
    struct record *r = on_zrs(strm);
    if (r)
        return ZRS_CALL(r, strm, wd__zrs_inflateGetDictionary(r->zrs, dictionary, dictLength));
    int ret = ensure_real(strm);
    return ret != Z_OK ? ret : REAL(inflateGetDictionary)(strm, dictionary, dictLength);
}

int inflateSyncPoint(z_streamp strm)
{
    struct record *r = on_zrs(strm);
    if (r)
        return ZRS_CALL(r, strm, wd__zrs_inflateSyncPoint(r->zrs));
    int ret = ensure_real(strm);
    return ret != Z_OK ? ret : REAL(inflateSyncPoint)(strm);
}

long inflateMark(z_streamp strm)
{
    struct record *r = on_zrs(strm);
    if (r)
        return ZRS_CALL(r, strm, wd__zrs_inflateMark(r->zrs));
    /* (zlib's answer for a stream it cannot use) */
    return ensure_real(strm) != Z_OK ? -(1L << 16) : REAL(inflateMark)(strm);
}

unsigned long inflateCodesUsed(z_streamp strm)
{
    struct record *r = on_zrs(strm);
    if (r)
        return ZRS_CALL(r, strm, wd__zrs_inflateCodesUsed(r->zrs));
    return ensure_real(strm) != Z_OK ? (unsigned long)-1 : REAL(inflateCodesUsed)(strm);
}

/* ---- inflateBack: on zlib-rs's inflate --------------------------------- */

/* An inflateBack stream with zlib's default window (pigz -d decodes
 * everything through one) runs on zlib-rs's inflate, whose decoding loop
 * is about 1.5 times the system zlib's speed; zlib-rs's own inflateBack
 * has no fast loop and runs at the system zlib's. The caller's window is
 * the output buffer handed to `out` when full and at the end, as zlib's
 * inflateBack hands it. Other windows stay with the system zlib: with a
 * smaller window zlib's inflateBack refuses distances past it, which
 * zlib-rs's inflate, keeping its own 32 KiB of history, would not. */
struct back {
    struct back *next; /* in its bucket of backs[] */
    unsigned char *window;
    z_stream z; /* zlib-rs's raw inflate state */
};

/* The states the shim made, by address. A stream's `state` is looked up
 * here rather than recognised by a mark inside it: the system zlib's
 * inflateBack state begins with a field its init leaves unset, so
 * reading it would read memory nobody wrote; and zlib's inflateBack,
 * unlike inflate, does not check that a state is its own, so it must
 * never be handed one of these. A copy of the z_stream shares the state,
 * as with zlib. Under the table's lock (one lookup per inflateBack
 * call). */
#define BACK_BUCKETS 64
static struct back *backs[BACK_BUCKETS];

static size_t back_bucket(const void *p) { return ((uintptr_t)p >> 6) % BACK_BUCKETS; }

/* s's state, if it is one of them; with `take`, out of the table. */
static struct back *back_find(z_streamp s, int take)
{
    void *p = s ? (void *)s->state : NULL;
    if (!p)
        return NULL;
    table_take();
    struct back **at = &backs[back_bucket(p)];
    while (*at && (void *)*at != p)
        at = &(*at)->next;
    struct back *b = *at;
    if (b && take)
        *at = b->next;
    table_give();
    return b;
}

int inflateBackInit_(z_streamp strm, int windowBits, unsigned char *window, const char *version,
                     int stream_size)
{
    cfg_load();
    if (cfg_disabled || tl_inside || tl_initing || !strm || !window || windowBits != MAX_WBITS)
        return REAL(inflateBackInit_)(strm, windowBits, window, version, stream_size);
    struct back *b = calloc(1, sizeof *b);
    if (!b)
        return Z_MEM_ERROR;
    /* zlib-rs checks the version and the structure's size as zlib does. */
    int ret = wd__zrs_inflateInit2_(&b->z, -MAX_WBITS, version, stream_size);
    if (ret != Z_OK) {
        free(b);
        return ret;
    }
    b->window = window;
    table_take();
    b->next = backs[back_bucket(b)];
    backs[back_bucket(b)] = b;
    table_give();
    strm->state = (struct internal_state *)b;
    strm->msg = Z_NULL;
    return Z_OK;
}

/* One raw stream, as zlib's inflateBack decodes it: input from `next_in`
 * and then from `in` whenever the decoder has nothing left to read
 * (`in` returning nothing ends the call: Z_BUF_ERROR, `next_in` NULL);
 * output through the window to `out` (non-zero from `out`: Z_BUF_ERROR);
 * what is left of the input goes back in `next_in`/`avail_in`; `msg` as
 * zlib's. zlib's inflateBack sets no other field. */
int inflateBack(z_streamp strm, in_func in, void *in_desc, out_func out, void *out_desc)
{
    struct back *b = back_find(strm, 0);
    if (!b)
        return REAL(inflateBack)(strm, in, in_desc, out, out_desc);
    if (!in || !out)
        return Z_STREAM_ERROR;
    z_stream *z = &b->z;
    strm->msg = Z_NULL;
    int ret = wd__zrs_inflateReset(z);
    if (ret != Z_OK)
        return ret;
    z_const unsigned char *next = strm->next_in;
    unsigned have = next ? strm->avail_in : 0;
    const unsigned wsize = 1u << MAX_WBITS;
    z->next_out = b->window;
    z->avail_out = wsize;
    for (;;) {
        z->next_in = next;
        z->avail_in = have;
        ret = wd__zrs_inflate(z, Z_NO_FLUSH);
        next = z->next_in;
        have = z->avail_in;
        if (ret == Z_STREAM_END)
            break;
        if (ret != Z_OK && ret != Z_BUF_ERROR) {
            strm->msg = zrs_msg(z->msg, Z_NULL);
            break;
        }
        if (z->avail_out == 0) {
            /* The window is full: out it goes, and the decoder goes on
             * (it may have what it needs without more input). */
            z->next_out = b->window;
            z->avail_out = wsize;
            if (out(out_desc, b->window, wsize)) {
                strm->next_in = next;
                strm->avail_in = have;
                return Z_BUF_ERROR;
            }
            continue;
        }
        if (have != 0) { /* room and input, yet no end: cannot happen */
            ret = Z_STREAM_ERROR;
            break;
        }
        /* Room left and the input used up: the decoder needs more. */
        have = in(in_desc, (unsigned char **)&next);
        if (have == 0) {
            next = Z_NULL;
            ret = Z_BUF_ERROR;
            break;
        }
    }
    /* What is in the window goes out, whatever ended the call. */
    unsigned left = wsize - z->avail_out;
    if (left && out(out_desc, b->window, left) && ret == Z_STREAM_END)
        ret = Z_BUF_ERROR;
    strm->next_in = next;
    strm->avail_in = have;
    return ret;
}

int inflateBackEnd(z_streamp strm)
{
    struct back *b = back_find(strm, 1);
    if (!b)
        return REAL(inflateBackEnd)(strm);
    wd__zrs_inflateEnd(&b->z);
    free(b);
    strm->state = Z_NULL;
    return Z_OK;
}

/* ---- everything else: zlib's own ---------------------------------------- */

/* A gz* call that may open or write a deflate stream, marked (tl_gz). */
#define GZ(call)                                                                         \
    ({                                                                                   \
        tl_gz++;                                                                         \
        __typeof__(call) gz_ret_ = (call);                                               \
        tl_gz--;                                                                         \
        gz_ret_;                                                                         \
    })

const char *zlibVersion(void) { return REAL(zlibVersion)(); }
uLong zlibCompileFlags(void) { return REAL(zlibCompileFlags)(); }
const char *zError(int err) { return REAL(zError)(err); }
uLong compressBound(uLong sourceLen) { return REAL(compressBound)(sourceLen); }

uLong adler32(uLong adler, const Bytef *buf, uInt len) { return REAL(adler32)(adler, buf, len); }
uLong adler32_z(uLong adler, const Bytef *buf, z_size_t len)
{
    return REAL(adler32_z)(adler, buf, len);
}
uLong adler32_combine(uLong a, uLong b, z_off_t len2) { return REAL(adler32_combine)(a, b, len2); }
uLong adler32_combine64(uLong a, uLong b, z_off64_t len2)
{
    return REAL(adler32_combine64)(a, b, len2);
}
uLong crc32(uLong crc, const Bytef *buf, uInt len) { return REAL(crc32)(crc, buf, len); }
uLong crc32_z(uLong crc, const Bytef *buf, z_size_t len) { return REAL(crc32_z)(crc, buf, len); }
uLong crc32_combine(uLong a, uLong b, z_off_t len2) { return REAL(crc32_combine)(a, b, len2); }
uLong crc32_combine64(uLong a, uLong b, z_off64_t len2)
{
    return REAL(crc32_combine64)(a, b, len2);
}
uLong crc32_combine_gen(z_off_t len2) { return REAL(crc32_combine_gen)(len2); }
uLong crc32_combine_gen64(z_off64_t len2) { return REAL(crc32_combine_gen64)(len2); }
uLong crc32_combine_op(uLong a, uLong b, uLong op) { return REAL(crc32_combine_op)(a, b, op); }
const z_crc_t *get_crc_table(void) { return REAL(get_crc_table)(); }

gzFile gzopen(const char *path, const char *mode) { return REAL(gzopen)(path, mode); }
gzFile gzopen64(const char *path, const char *mode) { return REAL(gzopen64)(path, mode); }
gzFile gzdopen(int fd, const char *mode) { return REAL(gzdopen)(fd, mode); }
int gzbuffer(gzFile file, unsigned size) { return REAL(gzbuffer)(file, size); }
int gzsetparams(gzFile file, int level, int strategy)
{
    return GZ(REAL(gzsetparams)(file, level, strategy));
}
int gzread(gzFile file, voidp buf, unsigned len) { return REAL(gzread)(file, buf, len); }
z_size_t gzfread(voidp buf, z_size_t size, z_size_t nitems, gzFile file)
{
    return REAL(gzfread)(buf, size, nitems, file);
}
int gzwrite(gzFile file, voidpc buf, unsigned len) { return GZ(REAL(gzwrite)(file, buf, len)); }
z_size_t gzfwrite(voidpc buf, z_size_t size, z_size_t nitems, gzFile file)
{
    return GZ(REAL(gzfwrite)(buf, size, nitems, file));
}
int gzvprintf(gzFile file, const char *format, va_list va)
{
    return GZ(REAL(gzvprintf)(file, format, va));
}
int gzprintf(gzFile file, const char *format, ...)
{
    va_list va;
    va_start(va, format);
    int ret = gzvprintf(file, format, va);
    va_end(va);
    return ret;
}
int gzputs(gzFile file, const char *s) { return GZ(REAL(gzputs)(file, s)); }
char *gzgets(gzFile file, char *buf, int len) { return REAL(gzgets)(file, buf, len); }
int gzputc(gzFile file, int c) { return GZ(REAL(gzputc)(file, c)); }
int gzgetc(gzFile file) { return REAL(gzgetc)(file); }
int gzgetc_(gzFile file) { return REAL(gzgetc_)(file); }
int gzungetc(int c, gzFile file) { return REAL(gzungetc)(c, file); }
int gzflush(gzFile file, int flush) { return GZ(REAL(gzflush)(file, flush)); }
z_off_t gzseek(gzFile file, z_off_t offset, int whence)
{
    return GZ(REAL(gzseek)(file, offset, whence));
}
z_off64_t gzseek64(gzFile file, z_off64_t offset, int whence)
{
    return GZ(REAL(gzseek64)(file, offset, whence));
}
int gzrewind(gzFile file) { return REAL(gzrewind)(file); }
z_off_t gztell(gzFile file) { return REAL(gztell)(file); }
z_off64_t gztell64(gzFile file) { return REAL(gztell64)(file); }
z_off_t gzoffset(gzFile file) { return REAL(gzoffset)(file); }
z_off64_t gzoffset64(gzFile file) { return REAL(gzoffset64)(file); }
int gzeof(gzFile file) { return REAL(gzeof)(file); }
int gzdirect(gzFile file) { return REAL(gzdirect)(file); }
int gzclose(gzFile file) { return GZ(REAL(gzclose)(file)); }
int gzclose_r(gzFile file) { return REAL(gzclose_r)(file); }
int gzclose_w(gzFile file) { return GZ(REAL(gzclose_w)(file)); }
const char *gzerror(gzFile file, int *errnum) { return REAL(gzerror)(file, errnum); }
void gzclearerr(gzFile file) { REAL(gzclearerr)(file); }
