/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * libwdz.so against stock zlib, in one process: this program links -lz
 * and runs with LD_PRELOAD=libwdz.so, so its zlib calls reach the shim;
 * a pristine copy of the system zlib, loaded with dlmopen into its own
 * namespace, is the reference. Every stream the shim writes must decode
 * with stock zlib to the same bytes, every stock stream must decode
 * through the shim, and return codes must be zlib's.
 *
 * Exit 77 (skip) when the shim is not preloaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "wd_comp.h"

/* This program links no WrapDrive library (the shim is preloaded), so it
 * has its own assertion: the first failure ends it, naming the line. */
#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);              \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* The library's piece compressor, as the shim reaches it: through this
 * program (linked -rdynamic, so its definition comes first), which makes
 * call number `fail_piece` fail as the library fails without a host when
 * it may not fall back (WD_COMP_FALLBACK=0). `piece_calls` shows the
 * shim's calls came here. */
static int fail_piece, piece_calls;
int wd_comp_compress_piece(struct wd_comp *c, int alg, int level, struct wd_comp_pieces *p,
                           const void *src, size_t src_len, void *dst, size_t *dst_len,
                           int flags)
{
    static int (*next)(struct wd_comp *, int, int, struct wd_comp_pieces *, const void *,
                       size_t, void *, size_t *, int);
    if (!next)
        *(void **)&next = dlsym(RTLD_NEXT, "wd_comp_compress_piece");
    if (!next)
        abort();
    __atomic_fetch_add(&piece_calls, 1, __ATOMIC_RELAXED);
    if (fail_piece > 0 && __atomic_sub_fetch(&fail_piece, 1, __ATOMIC_RELAXED) == 0)
        return -ENOTCONN;
    return next(c, alg, level, p, src, src_len, dst, dst_len, flags);
}

/* The reference zlib's functions. */
static struct {
    int (*compress2)(Bytef *, uLongf *, const Bytef *, uLong, int);
    int (*uncompress)(Bytef *, uLongf *, const Bytef *, uLong);
    int (*uncompress2)(Bytef *, uLongf *, const Bytef *, uLong *);
    int (*deflateInit2_)(z_streamp, int, int, int, int, int, const char *, int);
    int (*deflate)(z_streamp, int);
    int (*deflateEnd)(z_streamp);
    int (*inflateInit2_)(z_streamp, int, const char *, int);
    int (*inflate)(z_streamp, int);
    int (*inflateEnd)(z_streamp);
    int (*inflateSync)(z_streamp);
    int (*inflateReset)(z_streamp);
    int (*inflateReset2)(z_streamp, int);
    long (*inflateMark)(z_streamp);
    unsigned long (*inflateCodesUsed)(z_streamp);
    int (*inflateSyncPoint)(z_streamp);
    int (*inflateGetDictionary)(z_streamp, Bytef *, uInt *);
    int (*inflateSetDictionary)(z_streamp, const Bytef *, uInt);
    int (*deflateSetDictionary)(z_streamp, const Bytef *, uInt);
    int (*deflateGetDictionary)(z_streamp, Bytef *, uInt *);
    int (*deflateParams)(z_streamp, int, int);
    int (*deflatePrime)(z_streamp, int, int);
    int (*deflateTune)(z_streamp, int, int, int, int);
    int (*deflateSetHeader)(z_streamp, gz_headerp);
    int (*inflateBackInit_)(z_streamp, int, unsigned char *, const char *, int);
    int (*inflateBack)(z_streamp, in_func, void *, out_func, void *);
    int (*inflateBackEnd)(z_streamp);
} ref;

static void load_reference(void)
{
    void *h = dlmopen(LM_ID_NEWLM, "libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cannot load a reference zlib: %s\n", dlerror());
        exit(1);
    }
#define SYM(n) CHECK((*(void **)&ref.n = dlsym(h, #n)) != NULL)
    SYM(compress2);
    SYM(uncompress);
    SYM(uncompress2);
    SYM(deflateInit2_);
    SYM(deflate);
    SYM(deflateEnd);
    SYM(inflateInit2_);
    SYM(inflate);
    SYM(inflateEnd);
    SYM(inflateSync);
    SYM(inflateReset);
    SYM(inflateReset2);
    SYM(inflateMark);
    SYM(inflateCodesUsed);
    SYM(inflateSyncPoint);
    SYM(inflateGetDictionary);
    SYM(inflateSetDictionary);
    SYM(deflateSetDictionary);
    SYM(deflateGetDictionary);
    SYM(deflateSetHeader);
    SYM(deflateParams);
    SYM(deflatePrime);
    SYM(deflateTune);
    SYM(inflateBackInit_);
    SYM(inflateBack);
    SYM(inflateBackEnd);
#undef SYM
}

/* Text-like data with some noise: compressible, not trivially. */
static unsigned char *make_data(size_t n, unsigned seed)
{
    static const char *words[] = {"queue ", "domain ", "IOVA ", "PASID ", "engine ", "session\n"};
    unsigned char *d = malloc(n + 16);
    size_t at = 0;
    uint32_t x = seed * 2654435761u + 1;
    while (at < n) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        if (x % 7 == 0) {
            d[at++] = (unsigned char)x;
        } else {
            const char *w = words[x % 6];
            size_t l = strlen(w);
            memcpy(d + at, w, l);
            at += l;
        }
    }
    return d;
}

/* The shim's message for damage zlib-rs's fast loop finds (zlib-rs
 * loses which it was; see zlib/wdz.c): zlib's is then one of the three. */
static int same_msg(const char *shim, const char *zlib)
{
    if (strcmp(shim, "invalid literal/length code, invalid distance code or invalid distance "
                     "too far back") == 0)
        return strcmp(zlib, "invalid literal/length code") == 0 ||
               strcmp(zlib, "invalid distance code") == 0 ||
               strcmp(zlib, "invalid distance too far back") == 0;
    return strcmp(shim, zlib) == 0;
}

/* Decode a whole stream with the reference (windowBits as given). */
static size_t ref_inflate(int wbits, const unsigned char *in, size_t len, unsigned char *out,
                          size_t room)
{
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(ref.inflateInit2_(&s, wbits, ZLIB_VERSION, (int)sizeof s) == Z_OK);
    s.next_in = (Bytef *)in;
    s.avail_in = (uInt)len;
    s.next_out = out;
    s.avail_out = (uInt)room;
    CHECK(ref.inflate(&s, Z_FINISH) == Z_STREAM_END);
    size_t n = s.total_out;
    ref.inflateEnd(&s);
    return n;
}

/* Encode with the reference. */
static size_t ref_deflate(int level, int wbits, const unsigned char *in, size_t len,
                          unsigned char *out, size_t room)
{
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(ref.deflateInit2_(&s, level, Z_DEFLATED, wbits, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                            (int)sizeof s) == Z_OK);
    s.next_in = (Bytef *)in;
    s.avail_in = (uInt)len;
    s.next_out = out;
    s.avail_out = (uInt)room;
    CHECK(ref.deflate(&s, Z_FINISH) == Z_STREAM_END);
    size_t n = s.total_out;
    ref.deflateEnd(&s);
    return n;
}

/* The check value zlib leaves after `n` bytes of `d` in a stream of
 * window bits `wbits`: adler32 for zlib framing, crc32 for gzip, none to
 * check for a raw stream (its `adler` is the caller's). */
static void check_value_is(int wbits, uLong got, const unsigned char *d, size_t n)
{
    if (wbits == 15)
        CHECK(got == adler32(adler32(0, NULL, 0), d, (uInt)n));
    if (wbits == 31)
        CHECK(got == crc32(crc32(0, NULL, 0), d, (uInt)n));
}

/* Compress `len` bytes at `in` into `out` in one deflate(Z_FINISH) call
 * on an opened stream: the stream's output size. */
static size_t deflate_all(z_stream *s, const unsigned char *in, size_t len, unsigned char *out,
                          size_t room)
{
    s->next_in = (Bytef *)in;
    s->avail_in = (uInt)len;
    s->next_out = out;
    s->avail_out = (uInt)room;
    CHECK(deflate(s, Z_FINISH) == Z_STREAM_END);
    return s->total_out;
}

/* One-shot calls: compress2 output decodes with stock zlib; stock output
 * decodes through uncompress; too little room is Z_BUF_ERROR. */
static void one_shot(void)
{
    static const size_t sizes[] = {0, 1, 1023, 1024, 4096, 100000, 3 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *d = make_data(n, (unsigned)i + 1);
        uLong bound = compressBound(n);
        unsigned char *c = malloc(bound), *back = malloc(n + 1);
        for (int level = -1; level <= 9; level++) {
            uLongf clen = bound;
            CHECK(compress2(c, &clen, d, n, level) == Z_OK);
            CHECK(ref_inflate(15, c, clen, back, n + 1) == n);
            CHECK(n == 0 || memcmp(back, d, n) == 0);
            uLongf blen = n + 1;
            CHECK(uncompress(back, &blen, c, clen) == Z_OK);
            CHECK(blen == n && (n == 0 || memcmp(back, d, n) == 0));
            /* Stock zlib's stream through the shim. */
            uLongf slen = bound;
            CHECK(ref.compress2(c, &slen, d, n, level) == Z_OK);
            blen = n + 1;
            CHECK(uncompress(back, &blen, c, slen) == Z_OK);
            CHECK(blen == n && (n == 0 || memcmp(back, d, n) == 0));
            if (n > 16) {
                /* Too little room, truncated input: zlib's codes. */
                blen = n / 2;
                uLongf rlen = n / 2;
                CHECK(uncompress(back, &blen, c, slen) == ref.uncompress(back, &rlen, c, slen));
                blen = n + 1;
                rlen = n + 1;
                int got = uncompress(back, &blen, c, slen - 1);
                CHECK(got == ref.uncompress(back, &rlen, c, slen - 1));
                CHECK(got == Z_BUF_ERROR || got == Z_DATA_ERROR);
                uLongf tiny = 8;
                CHECK(compress2(c, &tiny, d, n, level) == Z_BUF_ERROR);
            }
        }
        free(d);
        free(c);
        free(back);
    }
}

/* uncompress2 of a small stream (the shim's kept zlib state, whose room
 * is at most 4 GiB) into a destination said to be larger: the length
 * decoded, as zlib's. Only the decoded bytes are written. */
static void uncompress_huge_room(void)
{
    if (sizeof(uLongf) <= 4)
        return; /* (no such room) */
    unsigned char d[50], c[128], a[64], b[64];
    memset(d, 'a', sizeof d);
    uLongf clen = sizeof c;
    CHECK(ref.compress2(c, &clen, d, sizeof d, 6) == Z_OK && clen < 128);
    uLongf la = (uLongf)5 << 30, lb = la;
    uLong sa = clen, sb = clen;
    int ra = uncompress2(a, &la, c, &sa), rb = ref.uncompress2(b, &lb, c, &sb);
    CHECK(ra == Z_OK && ra == rb && la == lb && la == sizeof d && sa == sb && sa == clen);
    CHECK(memcmp(a, d, sizeof d) == 0);
}

/* A stream opened again without its End, the second time with
 * parameters the shim leaves to zlib (a strategy): zlib's init runs
 * whole (its reset is not answered by the shim's record of the first
 * open), and the stream compresses as zlib's. */
static void reopened_without_end(void)
{
    size_t n = 200000;
    unsigned char *d = make_data(n, 81), *c = malloc(2 * n), *back = malloc(n + 1);
    for (int wipe = 0; wipe < 2; wipe++) {
        z_stream *s = calloc(1, sizeof *s);
        CHECK(deflateInit(s, 6) == Z_OK);
        if (wipe)
            memset(s, 0, sizeof *s); /* (memory reused) */
        CHECK(deflateInit2(s, 6, Z_DEFLATED, 15, 8, Z_FILTERED) == Z_OK);
        size_t clen = deflate_all(s, d, n, c, 2 * n);
        CHECK(ref_inflate(15, c, clen, back, n + 1) == n && memcmp(back, d, n) == 0);
        CHECK(deflateEnd(s) == Z_OK);
        free(s);
    }
    free(d);
    free(c);
    free(back);
}

/* deflate with every framing, all input at once, output taken in pieces
 * of `piece` bytes (the shim's pending output when small). */
static void deflate_framings(void)
{
    static const int wbits[] = {15, -15, 31, 9, -9};
    size_t n = 300000;
    unsigned char *d = make_data(n, 42);
    unsigned char *c = malloc(2 * n), *back = malloc(n + 1);
    static const size_t pieces[] = {100, 65536, 1 << 22, 1};
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++) {
        for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
            z_stream s;
            memset(&s, 0, sizeof s);
            CHECK(deflateInit2(&s, 1, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY) == Z_OK);
            s.next_in = d;
            s.avail_in = (uInt)n;
            size_t got = 0;
            int ret;
            size_t piece = pieces[p];
            do {
                s.next_out = c + got;
                s.avail_out = (uInt)piece;
                ret = deflate(&s, Z_FINISH);
                CHECK(ret == Z_OK || ret == Z_STREAM_END);
                got = s.total_out;
            } while (ret != Z_STREAM_END);
            CHECK(s.total_in == n && s.avail_in == 0);
            /* A finished stream answers as zlib's does. */
            s.avail_out = 10;
            CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
            CHECK(deflate(&s, Z_NO_FLUSH) == Z_STREAM_ERROR);
            uLong check = s.adler;
            CHECK(deflateEnd(&s) == Z_OK);
            CHECK(ref_inflate(wbits[w], c, got, back, n + 1) == n);
            CHECK(memcmp(back, d, n) == 0);
            check_value_is(wbits[w], check, d, n);
        }
    }
    free(d);
    free(c);
    free(back);
}

/* inflate of stock streams: every framing, whole input, output in
 * pieces; concatenated gzip members through inflateReset; a truncated
 * stream and a corrupted one behave as in zlib. */
static void inflate_framings(void)
{
    static const int wbits[] = {15, -15, 31, 47, 0};
    size_t n = 200000;
    unsigned char *d = make_data(n, 7);
    unsigned char *c = malloc(2 * n + 64), *back = malloc(2 * n + 1);
    static const size_t pieces[] = {7, 4096, 1 << 22};
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++) {
        int enc = wbits[w] == 47 ? 31 : wbits[w] == 0 ? 15 : wbits[w];
        size_t clen = ref_deflate(6, enc, d, n, c, 2 * n);
        for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
            z_stream s;
            memset(&s, 0, sizeof s);
            CHECK(inflateInit2(&s, wbits[w]) == Z_OK);
            s.next_in = c;
            s.avail_in = (uInt)clen;
            int ret;
            do {
                s.next_out = back + s.total_out;
                s.avail_out = (uInt)pieces[p];
                ret = inflate(&s, Z_NO_FLUSH);
                CHECK(ret == Z_OK || ret == Z_STREAM_END);
            } while (ret != Z_STREAM_END);
            CHECK(s.total_out == n && s.total_in == clen && memcmp(back, d, n) == 0);
            check_value_is(enc, s.adler, d, n);
            s.avail_out = 10;
            CHECK(inflate(&s, Z_NO_FLUSH) == Z_STREAM_END);
            CHECK(inflateEnd(&s) == Z_OK);
        }
    }
    /* Two gzip members: one stream each, the second after inflateReset. */
    size_t a = ref_deflate(6, 31, d, n / 2, c, 2 * n);
    size_t b = ref_deflate(1, 31, d + n / 2, n - n / 2, c + a, 2 * n - a);
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(inflateInit2(&s, 31) == Z_OK);
    s.next_in = c;
    s.avail_in = (uInt)(a + b);
    s.next_out = back;
    s.avail_out = (uInt)(2 * n);
    CHECK(inflate(&s, Z_NO_FLUSH) == Z_STREAM_END);
    CHECK(s.total_out == n / 2 && s.avail_in == b);
    CHECK(inflateReset(&s) == Z_OK);
    CHECK(inflate(&s, Z_NO_FLUSH) == Z_STREAM_END);
    CHECK(s.avail_in == 0 && memcmp(back, d, n) == 0);
    inflateEnd(&s);
    /* Truncated: zlib's answer (Z_BUF_ERROR with Z_FINISH, output so far). */
    size_t clen = ref_deflate(6, 15, d, n, c, 2 * n);
    memset(&s, 0, sizeof s);
    CHECK(inflateInit(&s) == Z_OK);
    s.next_in = c;
    s.avail_in = (uInt)(clen - 10);
    s.next_out = back;
    s.avail_out = (uInt)(2 * n);
    CHECK(inflate(&s, Z_FINISH) == Z_BUF_ERROR);
    CHECK(s.total_out > 0 && memcmp(back, d, s.total_out) == 0);
    inflateEnd(&s);
    /* Corrupt: Z_DATA_ERROR with zlib's message. */
    c[clen / 2] ^= 0xff;
    memset(&s, 0, sizeof s);
    CHECK(inflateInit(&s) == Z_OK);
    s.next_in = c;
    s.avail_in = (uInt)clen;
    s.next_out = back;
    s.avail_out = (uInt)(2 * n);
    int ret = inflate(&s, Z_FINISH);
    CHECK(ret == Z_DATA_ERROR || ret == Z_BUF_ERROR);
    if (ret == Z_DATA_ERROR)
        CHECK(s.msg != NULL);
    inflateEnd(&s);
    free(d);
    free(c);
    free(back);
}

/* Point the stream's output at what follows its output so far. */
static void out_at(z_stream *s, unsigned char *c, size_t cap, size_t room)
{
    s->next_out = c + s->total_out;
    size_t left = cap - s->total_out;
    s->avail_out = (uInt)(left < room ? left : room);
}

/* Feed d[from..to) with Z_NO_FLUSH in `chunk`-byte calls. */
static void feed(z_stream *s, const unsigned char *d, size_t from, size_t to, size_t chunk,
                 unsigned char *c, size_t cap, size_t room)
{
    while (from < to) {
        size_t k = to - from < chunk ? to - from : chunk;
        s->next_in = (Bytef *)d + from;
        s->avail_in = (uInt)k;
        out_at(s, c, cap, room);
        int ret = deflate(s, Z_NO_FLUSH);
        CHECK(ret == Z_OK || ret == Z_BUF_ERROR);
        from += k - s->avail_in;
    }
}

/* Z_SYNC_FLUSH until all the stream owes is out (output in `room`-byte
 * pieces after what it wrote). */
static void sync_flush(z_stream *s, unsigned char *c, size_t cap, size_t room)
{
    s->avail_in = 0;
    int ret;
    do {
        out_at(s, c, cap, room);
        ret = deflate(s, Z_SYNC_FLUSH);
        CHECK(ret == Z_OK || ret == Z_BUF_ERROR);
    } while (s->avail_out == 0);
}

/* deflateParams to level 9 mid-stream, given room until it is done. */
static void params_to_9(z_stream *s, unsigned char *c, size_t cap, size_t room)
{
    int ret;
    do {
        out_at(s, c, cap, room);
        ret = deflateParams(s, 9, Z_DEFAULT_STRATEGY);
        CHECK(ret == Z_OK || ret == Z_BUF_ERROR);
    } while (ret == Z_BUF_ERROR);
}

/* A level 1 reference stream of framing `wbits` fed 100000 bytes of d
 * with Z_NO_FLUSH: what zlib answers after data. */
static void ref_after_data(z_stream *r, int wbits, const unsigned char *d, unsigned char *c,
                           size_t cap)
{
    memset(r, 0, sizeof *r);
    CHECK(ref.deflateInit2_(r, 1, Z_DEFLATED, wbits, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                            (int)sizeof *r) == Z_OK);
    r->next_in = (Bytef *)d;
    r->avail_in = 100000;
    r->next_out = c;
    r->avail_out = (uInt)cap;
    CHECK(ref.deflate(r, Z_NO_FLUSH) == Z_OK && r->avail_in == 0);
}

/* A level 1 zlib stream fed `n` bytes of d in `chunk`-byte calls with
 * `room`-byte output, then ended unfinished: deflateEnd's answer is
 * zlib's for data thrown away (the reference's, fed the same). */
static void end_unfinished(const unsigned char *d, size_t n, size_t chunk, size_t room,
                           unsigned char *c, unsigned char *c2, size_t cap)
{
    z_stream s, r;
    memset(&s, 0, sizeof s);
    CHECK(deflateInit(&s, 1) == Z_OK);
    feed(&s, d, 0, n, chunk, c, cap, room);
    ref_after_data(&r, 15, d, c2, cap);
    CHECK(deflateEnd(&s) == ref.deflateEnd(&r));
}

/* Z_FINISH until the end, then check the stream against stock zlib: the
 * data, the totals, the check value zlib would leave. */
static void finish_and_check(z_stream *s, int wbits, const unsigned char *d, size_t n,
                             unsigned char *c, size_t cap, size_t room, unsigned char *back)
{
    s->next_in = (Bytef *)d + n;
    s->avail_in = 0;
    int ret;
    do {
        out_at(s, c, cap, room);
        ret = deflate(s, Z_FINISH);
        CHECK(ret == Z_OK || ret == Z_STREAM_END || ret == Z_BUF_ERROR);
    } while (ret != Z_STREAM_END);
    CHECK(s->total_in == n);
    size_t clen = s->total_out;
    CHECK(ref_inflate(wbits, c, clen, back, n + 1) == n);
    CHECK(n == 0 || memcmp(back, d, n) == 0);
    check_value_is(wbits, s->adler, d, n);
    CHECK(deflateEnd(s) == Z_OK);
}

/* Decode a whole stream with the reference given `dict`: a zlib stream
 * must ask for it (Z_NEED_DICT: it was used), a raw stream has it first. */
static size_t ref_inflate_dict(int wbits, const unsigned char *in, size_t len,
                               const unsigned char *dict, size_t dict_len, unsigned char *out,
                               size_t room)
{
    z_stream r;
    memset(&r, 0, sizeof r);
    CHECK(ref.inflateInit2_(&r, wbits, ZLIB_VERSION, (int)sizeof r) == Z_OK);
    if (wbits < 0)
        CHECK(ref.inflateSetDictionary(&r, dict, (uInt)dict_len) == Z_OK);
    r.next_in = (Bytef *)in;
    r.avail_in = (uInt)len;
    r.next_out = out;
    r.avail_out = (uInt)room;
    if (wbits > 0) {
        CHECK(ref.inflate(&r, Z_FINISH) == Z_NEED_DICT);
        CHECK(ref.inflateSetDictionary(&r, dict, (uInt)dict_len) == Z_OK);
    }
    CHECK(ref.inflate(&r, Z_FINISH) == Z_STREAM_END);
    size_t n = r.total_out;
    ref.inflateEnd(&r);
    return n;
}

/* Flushes that bring 64 KiB or more (Z_BLOCK, Z_PARTIAL_FLUSH,
 * Z_SYNC_FLUSH, Z_FULL_FLUSH; the shim makes each a piece) in every
 * framing, output in small rooms and in one: a sync or full flush's
 * output ends in 00 00 FF FF; zlib's answers to a flush asked again with
 * nothing new and to one out of range; then a small flush (zlib-rs takes
 * the stream on), more data and the end, decoded by the reference with
 * zlib's check value. A raw stream's dictionary may go unused on a large
 * flush or end (the reference given it decodes the stream), a zlib
 * stream's is used (its header names it). */
static void deflate_flushed_in_pieces(void)
{
    static const int wbits[] = {15, -15, 31};
    static const int flushes[] = {Z_BLOCK, Z_PARTIAL_FLUSH, Z_SYNC_FLUSH, Z_FULL_FLUSH};
    size_t n = 400000, first = 100000, small = 1000;
    unsigned char *d = make_data(n, 71);
    size_t cap = 2 * n;
    unsigned char *c = malloc(cap), *c2 = malloc(cap), *back = malloc(n + 1);
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++)
        for (size_t f = 0; f < sizeof flushes / sizeof flushes[0]; f++)
            for (size_t room = 1000; room <= cap; room += cap - 1000) {
                int flush = flushes[f];
                z_stream s, r;
                memset(&s, 0, sizeof s);
                memset(&r, 0, sizeof r);
                CHECK(deflateInit2(&s, 1, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY) == Z_OK);
                CHECK(ref.deflateInit2_(&r, 1, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY,
                                        ZLIB_VERSION, (int)sizeof r) == Z_OK);
                s.next_in = d;
                s.avail_in = (uInt)first;
                do {
                    out_at(&s, c, cap, room);
                    CHECK(deflate(&s, flush) == Z_OK);
                } while (s.avail_out == 0);
                CHECK(s.avail_in == 0 && s.total_in == first);
                if (flush == Z_SYNC_FLUSH || flush == Z_FULL_FLUSH)
                    CHECK(memcmp(c + s.total_out - 4, "\0\0\377\377", 4) == 0);
                r.next_in = d;
                r.avail_in = (uInt)first;
                r.next_out = c2;
                r.avail_out = (uInt)cap;
                CHECK(ref.deflate(&r, flush) == Z_OK && r.avail_out > 0);
                out_at(&s, c, cap, room);
                CHECK(deflate(&s, flush) == ref.deflate(&r, flush));
                CHECK(deflate(&s, Z_BLOCK + 1) == ref.deflate(&r, Z_BLOCK + 1));
                ref.deflateEnd(&r);
                /* A small flush, then the rest. */
                s.next_in = d + first;
                s.avail_in = (uInt)small;
                do {
                    out_at(&s, c, cap, room);
                    CHECK(deflate(&s, Z_SYNC_FLUSH) == Z_OK);
                } while (s.avail_out == 0);
                CHECK(s.total_in == first + small);
                feed(&s, d, first + small, n, 65536, c, cap, room);
                finish_and_check(&s, wbits[w], d, n, c, cap, room, back);
            }

    /* Dictionaries: a raw stream's, on a large end and on a large sync
     * flush; a zlib stream's on a large flush. */
    const unsigned char *dict = d + 300000;
    for (int mode = 0; mode < 3; mode++) {
        z_stream s;
        memset(&s, 0, sizeof s);
        CHECK(deflateInit2(&s, 1, Z_DEFLATED, mode == 2 ? 15 : -15, 8, Z_DEFAULT_STRATEGY) ==
              Z_OK);
        CHECK(deflateSetDictionary(&s, dict, 20000) == Z_OK);
        CHECK(s.total_in == 20000); /* (zlib counts a dictionary as input) */
        s.next_in = d;
        s.avail_in = (uInt)first;
        s.next_out = c;
        s.avail_out = (uInt)cap;
        if (mode == 0) {
            CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
        } else {
            CHECK(deflate(&s, Z_SYNC_FLUSH) == Z_OK);
            CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
        }
        size_t clen = s.total_out;
        CHECK(s.total_in == 20000 + first);
        CHECK(deflateEnd(&s) == Z_OK);
        size_t got = ref_inflate_dict(mode == 2 ? 15 : -15, c, clen, dict, 20000, back, n);
        CHECK(got == first && memcmp(back, d, first) == 0);
    }
    free(d);
    free(c);
    free(c2);
    free(back);
}

/* deflate fed in pieces with Z_NO_FLUSH and then Z_FINISH: the shim
 * gathers the input and compresses it whole; past 4 MiB, at another
 * flush, or at a call only zlib serves (deflateParams), zlib takes the
 * stream over with what was gathered; a copy or a reset in the middle.
 * Every stream must decode with stock zlib to the data. */
static void deflate_gathered(void)
{
    static const int wbits[] = {15, -15, 31};
    static const size_t sizes[] = {0, 100, 5000, 300000, (16 << 20) + 12345};
    static const size_t chunks[] = {1, 777, 65536};
    static const size_t rooms[] = {64, (size_t)1 << 26};
    enum { PLAIN, SYNC, PARAMS, COPY, RESET, MODES };
    size_t most = sizes[sizeof sizes / sizeof sizes[0] - 1];
    unsigned char *d = make_data(most, 77);
    size_t cap = most + most / 8 + 4096;
    unsigned char *c = malloc(cap), *c2 = malloc(cap), *back = malloc(most + 1);
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++)
                for (size_t r = 0; r < sizeof rooms / sizeof rooms[0]; r++)
                    for (int mode = 0; mode < MODES; mode++) {
                        size_t n = sizes[i], chunk = chunks[k], room = rooms[r];
                        if (n > 1000000 && (chunk == 1 || mode != PLAIN))
                            continue;
                        z_stream s;
                        memset(&s, 0, sizeof s);
                        CHECK(deflateInit2(&s, 1, Z_DEFLATED, wbits[w], 8,
                                           Z_DEFAULT_STRATEGY) == Z_OK);
                        feed(&s, d, 0, n / 2, chunk, c, cap, room);
                        if (mode == SYNC) {
                            sync_flush(&s, c, cap, room);
                        } else if (mode == PARAMS) {
                            params_to_9(&s, c, cap, room);
                        } else if (mode == COPY) {
                            z_stream t;
                            CHECK(deflateCopy(&t, &s) == Z_OK);
                            /* The copy writes its own stream, from the start. */
                            size_t done = t.total_out;
                            memcpy(c2, c, done);
                            feed(&t, d, n / 2, n, chunk, c2, cap, room);
                            finish_and_check(&t, wbits[w], d, n, c2, cap, room, back);
                        } else if (mode == RESET) {
                            CHECK(deflateReset(&s) == Z_OK);
                            CHECK(s.total_in == 0 && s.total_out == 0);
                            feed(&s, d, 0, n / 2, chunk, c, cap, room);
                        }
                        feed(&s, d, n / 2, n, chunk, c, cap, room);
                        finish_and_check(&s, wbits[w], d, n, c, cap, room, back);
                        if (n >= 1024 && n <= (4 << 20) && mode != SYNC && mode != PARAMS) {
                            /* Taken over (libdeflate's bytes, not zlib's),
                             * after a reset too. */
                            size_t zlen = ref_deflate(1, wbits[w], d, n, c2, cap);
                            CHECK(zlen != s.total_out || memcmp(c, c2, zlen) != 0);
                        }
                    }
    /* Past 4 MiB a stream leaves in pieces, whose bytes depend on its
     * input alone: the same from a new stream, from one reset after
     * another message, and from a copy taken past the limit. */
    size_t big = most, len0 = 0;
    unsigned char *c3 = malloc(cap);
    for (int how = 0; how < 3; how++) {
        z_stream a, b;
        memset(&a, 0, sizeof a);
        CHECK(deflateInit2(&a, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) == Z_OK);
        if (how == 1) {
            feed(&a, d, 0, 5000, 777, c3, cap, 1 << 20);
            CHECK(deflateReset(&a) == Z_OK);
        }
        feed(&a, d, 0, big, 65536, how ? c2 : c, cap, (size_t)1 << 26);
        if (how == 2) {
            CHECK(deflateCopy(&b, &a) == Z_OK);
            memcpy(c3, c2, b.total_out);
            finish_and_check(&b, 31, d, big, c3, cap, (size_t)1 << 26, back);
        }
        finish_and_check(&a, 31, d, big, how ? c2 : c, cap, (size_t)1 << 26, back);
        if (how == 0)
            len0 = a.total_out;
        else
            CHECK(a.total_out == len0 && memcmp(c, c2, len0) == 0);
        if (how == 2)
            CHECK(b.total_out == len0 && memcmp(c, c3, len0) == 0);
    }
    free(c3);
    /* A stream ended while it gathers frees what it gathered (valgrind
     * and ASan runs would say otherwise). */
    end_unfinished(d, 100000, 4096, 1 << 20, c, c2, cap);
    free(d);
    free(c);
    free(c2);
    free(back);
}

/* A Z_NO_FLUSH stream past 4 MiB leaves in pieces (each ending at a
 * full flush point) as its input comes; a call the pieces cannot serve
 * hands it to zlib-rs, which carries on from the last piece with the
 * shim writing the trailer. Every stream decodes with stock zlib to its
 * data and leaves zlib's check value; the answers zlib gives after data
 * (a dictionary, a gzip header) are the shim's too. */
static void deflate_in_pieces(void)
{
    static const int wbits[] = {15, -15, 31};
    enum { PLAIN, SMALL_ROOM, SYNC, PARAMS, GETDICT, COPY, COPY_CONT, RESET, REFUSED, MODES };
    size_t most = (40 << 20) + 777, mid = (20 << 20) + 3;
    unsigned char *d = make_data(most, 5);
    size_t cap = most + most / 8 + 4096;
    unsigned char *c = malloc(cap), *c2 = malloc(cap), *back = malloc(most + 1);
    unsigned char dict[32768];
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++)
        for (int mode = 0; mode < MODES; mode++) {
            size_t n = mode == PLAIN ? most : mid;
            size_t room = mode == SMALL_ROOM ? 4096 : (size_t)1 << 27;
            z_stream s;
            memset(&s, 0, sizeof s);
            CHECK(deflateInit2(&s, 1, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY) == Z_OK);
            /* Past the first piece, with input gathered for the next. */
            size_t at = (16 << 20) + 5000;
            feed(&s, d, 0, at, 65536, c, cap, room);
            unsigned pending = 1;
            int bits = 1;
            CHECK(deflatePending(&s, &pending, &bits) == Z_OK && bits == 0);
            CHECK(s.total_out > 0 && s.total_in == at);
            if (mode == SYNC) {
                sync_flush(&s, c, cap, room);
                /* All that was given is out, ending at a flush point. */
                CHECK(s.total_out >= 4 && memcmp(c + s.total_out - 4, "\0\0\xff\xff", 4) == 0);
                CHECK(deflateBound(&s, 1000) >= 1000);
            } else if (mode == PARAMS) {
                params_to_9(&s, c, cap, room);
            } else if (mode == GETDICT) {
                uInt len = sizeof dict;
                CHECK(deflateGetDictionary(&s, dict, &len) == Z_OK);
                CHECK(len == sizeof dict && memcmp(dict, d + at - len, len) == 0);
            } else if (mode == COPY || mode == COPY_CONT) {
                if (mode == COPY_CONT) {
                    out_at(&s, c, cap, room);
                    CHECK(deflate(&s, Z_FULL_FLUSH) == Z_OK);
                }
                z_stream t;
                CHECK(deflateCopy(&t, &s) == Z_OK);
                memcpy(c2, c, t.total_out);
                feed(&t, d, at, n, 65536, c2, cap, room);
                finish_and_check(&t, wbits[w], d, n, c2, cap, room, back);
            } else if (mode == RESET) {
                CHECK(deflateReset(&s) == Z_OK);
                CHECK(s.total_in == 0 && s.total_out == 0);
                at = 0;
            } else if (mode == REFUSED) {
                /* zlib's answers after data, from the reference itself. */
                z_stream r;
                ref_after_data(&r, wbits[w], d, c2, cap);
                gz_header h;
                memset(&h, 0, sizeof h);
                CHECK(deflateSetHeader(&s, &h) == ref.deflateSetHeader(&r, &h));
                if (wbits[w] > 0)
                    CHECK(deflateSetDictionary(&s, dict, 100) ==
                          ref.deflateSetDictionary(&r, dict, 100));
                ref.deflateEnd(&r);
            }
            feed(&s, d, at, n, 65536, c, cap, room);
            finish_and_check(&s, wbits[w], d, n, c, cap, room, back);
        }
    /* Ended in pieces: what waits is freed (valgrind and ASan runs). */
    end_unfinished(d, (16 << 20) + 100, 1 << 20, 1000, c, c2, cap);
    free(d);
    free(c);
    free(c2);
    free(back);
}

/* deflateParams given input on a stream zlib-rs carries on from its
 * pieces: zlib-rs deflates the input (zlib's Z_BLOCK), which goes into
 * the check value the shim keeps (the trailer, `adler` right after the
 * call). And a level set by deflateParams on zlib-rs stays across a
 * reset, as zlib's. */
static void params_after_pieces(void)
{
    static const int wbits[] = {15, -15, 31};
    size_t n = (5 << 20) + 300000, first = 5 << 20;
    unsigned char *d = make_data(n, 83);
    size_t cap = n + n / 2;
    unsigned char *c = malloc(cap), *back = malloc(n + 1);
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++) {
        z_stream s;
        memset(&s, 0, sizeof s);
        CHECK(deflateInit2(&s, 6, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY) == Z_OK);
        s.next_in = d;
        s.avail_in = (uInt)first;
        s.next_out = c;
        s.avail_out = (uInt)cap;
        CHECK(deflate(&s, Z_NO_FLUSH) == Z_OK && s.avail_in == 0);
        uLong before = s.adler;
        s.avail_in = 200000;
        CHECK(deflateParams(&s, 1, Z_DEFAULT_STRATEGY) == Z_OK);
        size_t took = first + 200000 - s.avail_in;
        CHECK(s.total_in == took && took > first);
        check_value_is(wbits[w], s.adler, d, took);
        if (wbits[w] < 0)
            CHECK(s.adler == before);
        feed(&s, d, took, n, 1 << 20, c, cap, cap);
        /* A call with no input buffer at all leaves the check value. */
        s.next_in = NULL;
        s.avail_in = 0;
        out_at(&s, c, cap, cap);
        CHECK(deflate(&s, Z_FULL_FLUSH) == Z_OK);
        finish_and_check(&s, wbits[w], d, n, c, cap, cap, back);
    }
    /* Level 0 set on zlib-rs (a stream flushed with 8000 bytes), then a
     * reset: the next stream is stored too, larger than its input. */
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(deflateInit(&s, 6) == Z_OK);
    for (int round = 0; round < 2; round++) {
        s.next_in = d;
        s.avail_in = 8000;
        s.next_out = c;
        s.avail_out = (uInt)cap;
        CHECK(deflate(&s, Z_SYNC_FLUSH) == Z_OK);
        if (round == 0)
            CHECK(deflateParams(&s, 0, Z_DEFAULT_STRATEGY) == Z_OK);
        CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
        CHECK(ref_inflate(15, c, s.total_out, back, n) == 8000 && memcmp(back, d, 8000) == 0);
        if (round == 1)
            CHECK(s.total_out > 8000);
        CHECK(deflateReset(&s) == Z_OK);
    }
    CHECK(deflateEnd(&s) == Z_OK);
    free(d);
    free(c);
    free(back);
}

/* The errors deflate answers itself on a stream the shim has (gathering,
 * in pieces, finished): zlib's codes and messages (its own strings; none
 * for a flush out of range), the reference's stream in the same place. */
static void deflate_error_messages(void)
{
    size_t n = 100000;
    unsigned char *d = make_data(n, 99);
    size_t cap = 2 * n;
    unsigned char *c = malloc(cap), *c2 = malloc(cap);
    for (int where = 0; where < 3; where++) {
        z_stream s, r;
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        CHECK(deflateInit(&s, 1) == Z_OK);
        CHECK(ref.deflateInit2_(&r, 1, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                                (int)sizeof r) == Z_OK);
        /* 0: gathering; 1: in pieces (a large flush); 2: finished. */
        int flush = where == 0 ? Z_NO_FLUSH : where == 1 ? Z_SYNC_FLUSH : Z_FINISH;
        s.next_in = r.next_in = d;
        s.avail_in = r.avail_in = (uInt)n;
        s.next_out = c;
        r.next_out = c2;
        s.avail_out = r.avail_out = (uInt)cap;
        int a = deflate(&s, flush), b = ref.deflate(&r, flush);
        CHECK(a == b && s.avail_in == 0 && r.avail_in == 0);
        /* Nothing new: the same flush again (a finished stream: another). */
        int again = where == 2 ? Z_NO_FLUSH : flush;
        s.msg = r.msg = NULL;
        a = deflate(&s, again);
        b = ref.deflate(&r, again);
        CHECK(a == b && a < 0 && s.msg && r.msg && strcmp(s.msg, r.msg) == 0);
        /* No room. */
        s.msg = r.msg = NULL;
        s.avail_out = r.avail_out = 0;
        a = deflate(&s, Z_FINISH);
        b = ref.deflate(&r, Z_FINISH);
        CHECK(a == b && a == Z_BUF_ERROR && s.msg && r.msg && strcmp(s.msg, r.msg) == 0);
        /* A flush out of range: no message. */
        s.msg = r.msg = NULL;
        s.avail_out = r.avail_out = 100;
        CHECK(deflate(&s, Z_BLOCK + 1) == ref.deflate(&r, Z_BLOCK + 1));
        CHECK(s.msg == NULL && r.msg == NULL);
        deflateEnd(&s);
        ref.deflateEnd(&r);
    }
    free(d);
    free(c);
    free(c2);
}

/* A flush on a stream in pieces that hands it to zlib-rs (it brings
 * little) after handing out, to the last byte of the caller's room, the
 * output that waited and taking the call's input: progress, zlib's Z_OK.
 * The stream then ends right. */
static void flush_hands_over_full(void)
{
    size_t n = (5 << 20) + 5000, first = 5 << 20;
    unsigned char *d = make_data(n, 97);
    size_t cap = n + n / 2;
    unsigned char *c = malloc(cap), *back = malloc(n + 1);
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(deflateInit(&s, 1) == Z_OK);
    s.next_in = d;
    s.avail_in = (uInt)first;
    s.next_out = c;
    s.avail_out = 1000;
    CHECK(deflate(&s, Z_NO_FLUSH) == Z_OK && s.total_out == 1000 && s.avail_in > 0);
    unsigned waiting = 0;
    CHECK(deflatePending(&s, &waiting, NULL) == Z_OK && waiting > 0);
    size_t in_before = s.total_in;
    s.avail_in = 1000;
    out_at(&s, c, cap, waiting);
    CHECK(deflate(&s, Z_SYNC_FLUSH) == Z_OK);
    CHECK(s.avail_out == 0 && s.total_in == in_before + 1000);
    sync_flush(&s, c, cap, 4096);
    feed(&s, d, s.total_in, n, 65536, c, cap, cap);
    finish_and_check(&s, 15, d, n, c, cap, cap, back);
    free(d);
    free(c);
    free(back);
}

/* A stream in pieces whose first or second piece cannot be made (the
 * library failed it): zlib-rs takes the stream on with the input that
 * piece had, its history the input before it, and the stream decodes to
 * the data; in a small room too (the output set aside; valgrind and ASan
 * runs see nothing lost). */
static void piece_fails(void)
{
    static const int wbits[] = {15, -15, 31};
    size_t n = 10 << 20;
    unsigned char *d = make_data(n, 85);
    size_t cap = n + n / 2;
    unsigned char *c = malloc(cap), *back = malloc(n + 1);
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++)
        for (int which = 1; which <= 4; which++) {
            size_t room = which > 2 ? 1000 : cap;
            z_stream s;
            memset(&s, 0, sizeof s);
            CHECK(deflateInit2(&s, 6, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY) == Z_OK);
            int calls = piece_calls;
            fail_piece = which > 2 ? which - 2 : which;
            feed(&s, d, 0, n, n, c, cap, room);
            CHECK(piece_calls - calls >= (which > 2 ? which - 2 : which) && fail_piece == 0);
            finish_and_check(&s, wbits[w], d, n, c, cap, room, back);
        }
    free(d);
    free(c);
    free(back);
}

/* Calls that need zlib's state on a deflate stream the shim finished
 * (whole, or in pieces), its output still waiting or all out: the
 * answers zlib gives a finished stream (the reference's, finished too),
 * and then the output that waited, the stream decoding to its data. */
static void calls_after_finish(void)
{
    static const int wbits[] = {15, -15, 31};
    size_t most = (4 << 20) + 100000, small = 300000;
    unsigned char *d = make_data(most, 87);
    size_t cap = most + most / 2;
    unsigned char *c = malloc(cap), *c2 = malloc(cap), *back = malloc(most + 1);
    unsigned char dict[32768];
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++)
        for (int big = 0; big < 2; big++)
            for (int waiting = 0; waiting < 2; waiting++)
                for (int call = 0; call < 7; call++) {
                    size_t n = big ? most : small;
                    z_stream s, r;
                    memset(&s, 0, sizeof s);
                    memset(&r, 0, sizeof r);
                    CHECK(deflateInit2(&s, 6, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY) ==
                          Z_OK);
                    s.next_in = d;
                    s.avail_in = (uInt)n;
                    s.next_out = c;
                    s.avail_out = (uInt)cap;
                    if (big)
                        CHECK(deflate(&s, Z_NO_FLUSH) == Z_OK && s.avail_in == 0);
                    s.avail_out = waiting ? 1000 : (uInt)cap;
                    CHECK(deflate(&s, Z_FINISH) == (waiting ? Z_OK : Z_STREAM_END));
                    CHECK(ref.deflateInit2_(&r, 6, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY,
                                            ZLIB_VERSION, (int)sizeof r) == Z_OK);
                    r.next_in = d;
                    r.avail_in = (uInt)small;
                    r.next_out = c2;
                    r.avail_out = (uInt)cap;
                    CHECK(ref.deflate(&r, Z_FINISH) == Z_STREAM_END);
                    uLong in_s = s.total_in, in_r = r.total_in;
                    s.msg = r.msg = NULL;
                    gz_header h;
                    memset(&h, 0, sizeof h);
                    uInt len = 0;
                    int a, b;
                    switch (call) {
                    case 0: /* the same compression function: only the level */
                        a = deflateParams(&s, 7, Z_DEFAULT_STRATEGY);
                        b = ref.deflateParams(&r, 7, Z_DEFAULT_STRATEGY);
                        break;
                    case 1: /* another: a flush zlib refuses */
                        a = deflateParams(&s, 1, Z_DEFAULT_STRATEGY);
                        b = ref.deflateParams(&r, 1, Z_DEFAULT_STRATEGY);
                        break;
                    case 2:
                        a = deflatePrime(&s, 17, 0);
                        b = ref.deflatePrime(&r, 17, 0);
                        CHECK(a == b);
                        a = deflatePrime(&s, 0, 0);
                        b = ref.deflatePrime(&r, 0, 0);
                        break;
                    case 3:
                        a = deflateTune(&s, 8, 16, 128, 128);
                        b = ref.deflateTune(&r, 8, 16, 128, 128);
                        break;
                    case 4:
                        a = deflateGetDictionary(&s, dict, &len);
                        b = ref.deflateGetDictionary(&r, NULL, NULL);
                        /* (zlib's: the input's last 32 KiB; a stream in
                         * pieces has them, a whole one does not) */
                        if (big)
                            CHECK(len == sizeof dict && memcmp(dict, d + n - len, len) == 0);
                        break;
                    case 5:
                        a = deflateSetDictionary(&s, d, 100);
                        b = ref.deflateSetDictionary(&r, d, 100);
                        CHECK(s.total_in - in_s == r.total_in - in_r);
                        break;
                    default:
                        a = deflateSetHeader(&s, &h);
                        b = ref.deflateSetHeader(&r, &h);
                        break;
                    }
                    CHECK(a == b && (s.msg == NULL) == (r.msg == NULL));
                    ref.deflateEnd(&r);
                    int ret;
                    do {
                        out_at(&s, c, cap, 65536);
                        ret = deflate(&s, Z_FINISH);
                    } while (ret == Z_OK);
                    CHECK(ret == Z_STREAM_END);
                    CHECK(ref_inflate(wbits[w], c, s.total_out, back, n + 1) == n);
                    CHECK(memcmp(back, d, n) == 0);
                    check_value_is(wbits[w], s.adler, d, n);
                    CHECK(deflateEnd(&s) == Z_OK);
                }
    free(d);
    free(c);
    free(c2);
    free(back);
}

/* Streams the shim leaves to zlib still work: every flush mode, split at
 * every point of a small stream, a dictionary. */
static void zlib_streams(void)
{
    size_t n = 3000;
    unsigned char *d = make_data(n, 3);
    unsigned char c[8192], back[4096];
    static const int flushes[] = {Z_NO_FLUSH, Z_SYNC_FLUSH, Z_FULL_FLUSH, Z_PARTIAL_FLUSH,
                                  Z_BLOCK};
    for (size_t cut = 0; cut <= n; cut += 97) {
        for (size_t f = 0; f < sizeof flushes / sizeof flushes[0]; f++) {
            z_stream s;
            memset(&s, 0, sizeof s);
            CHECK(deflateInit(&s, 6) == Z_OK);
            s.next_in = d;
            s.avail_in = (uInt)cut;
            s.next_out = c;
            s.avail_out = sizeof c;
            CHECK(deflate(&s, flushes[f]) == Z_OK);
            s.avail_in = (uInt)(n - cut);
            CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
            size_t clen = s.total_out;
            deflateEnd(&s);
            CHECK(ref_inflate(15, c, clen, back, sizeof back) == n);
            CHECK(memcmp(back, d, n) == 0);
            /* And back through the shim, fed in two parts. */
            memset(&s, 0, sizeof s);
            CHECK(inflateInit(&s) == Z_OK);
            s.next_in = c;
            s.avail_in = (uInt)(clen / 2);
            s.next_out = back;
            s.avail_out = sizeof back;
            int ret = inflate(&s, Z_NO_FLUSH);
            CHECK(ret == Z_OK || ret == Z_BUF_ERROR);
            s.avail_in = (uInt)(clen - (size_t)(s.next_in - c));
            CHECK(inflate(&s, Z_NO_FLUSH) == Z_STREAM_END);
            CHECK(s.total_out == n && memcmp(back, d, n) == 0);
            inflateEnd(&s);
        }
    }
    /* A dictionary: Z_NEED_DICT, then the data. */
    const char *dict = "queue domain IOVA PASID engine session";
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(deflateInit(&s, 9) == Z_OK);
    CHECK(deflateSetDictionary(&s, (const Bytef *)dict, (uInt)strlen(dict)) == Z_OK);
    s.next_in = d;
    s.avail_in = (uInt)n;
    s.next_out = c;
    s.avail_out = sizeof c;
    CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
    size_t clen = s.total_out;
    deflateEnd(&s);
    memset(&s, 0, sizeof s);
    CHECK(inflateInit(&s) == Z_OK);
    s.next_in = c;
    s.avail_in = (uInt)clen;
    s.next_out = back;
    s.avail_out = sizeof back;
    CHECK(inflate(&s, Z_NO_FLUSH) == Z_NEED_DICT);
    CHECK(inflateSetDictionary(&s, (const Bytef *)dict, (uInt)strlen(dict)) == Z_OK);
    CHECK(inflate(&s, Z_NO_FLUSH) == Z_STREAM_END);
    CHECK(s.total_out == n && memcmp(back, d, n) == 0);
    inflateEnd(&s);
    free(d);
}

/* One inflate call on the shim's stream and the reference's, the same input
 * and room: the same answer, the same bytes, the same counts. */
static int inflate_both(z_stream *s, z_stream *r, const unsigned char *in, size_t in_len,
                        unsigned char *out_s, unsigned char *out_r, size_t room, int flush)
{
    s->next_in = r->next_in = (Bytef *)in;
    s->avail_in = r->avail_in = (uInt)in_len;
    s->next_out = out_s;
    r->next_out = out_r;
    s->avail_out = r->avail_out = (uInt)room;
    int a = inflate(s, flush), b = ref.inflate(r, flush);
    CHECK(a == b);
    CHECK(s->avail_in == r->avail_in && s->avail_out == r->avail_out);
    CHECK(s->total_in == r->total_in && s->total_out == r->total_out);
    CHECK(memcmp(out_s, out_r, room - s->avail_out) == 0);
    /* strm->adler: zlib's at the end and at Z_NEED_DICT (in between
     * zlib-rs updates it later than zlib: a documented difference). */
    if (a == Z_STREAM_END || a == Z_NEED_DICT)
        CHECK(s->adler == r->adler);
    if (a == Z_DATA_ERROR)
        CHECK(s->msg != NULL && r->msg != NULL && same_msg(s->msg, r->msg));
    return a;
}

/* Inflate streams fed in pieces (zlib-rs in the shim) against stock zlib,
 * call by call: random pieces and rooms, every framing, truncated and
 * corrupted streams; then a copy taken mid-stream, a reset and reuse,
 * inflateSync past damage, and a gzip header asked for before the first
 * call (the system zlib's to fill). */
static void inflate_in_pieces(void)
{
    size_t n = 100000;
    unsigned char *d = make_data(n, 11);
    unsigned char *c = malloc(2 * n + 64), *os = malloc(n + 64), *orf = malloc(n + 64);
    static const int wbits[] = {15, -15, 31, 47};
    uint32_t x = 12345;
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++) {
        int enc = wbits[w] == 47 ? 31 : wbits[w];
        size_t clen = ref_deflate(6, enc, d, n, c, 2 * n);
        for (int damage = 0; damage < 3; damage++) {
            size_t len = clen;
            if (damage == 1)
                len = clen / 3; /* truncated */
            if (damage == 2)
                c[clen / 2] ^= 0x5a; /* corrupted */
            z_stream s, r;
            memset(&s, 0, sizeof s);
            memset(&r, 0, sizeof r);
            CHECK(inflateInit2(&s, wbits[w]) == Z_OK);
            CHECK(ref.inflateInit2_(&r, wbits[w], ZLIB_VERSION, (int)sizeof r) == Z_OK);
            size_t at = 0;
            int ret = Z_OK;
            for (int calls = 0; ret == Z_OK && calls < 100000; calls++) {
                x = x * 1103515245u + 12345u;
                size_t piece = 1 + (x >> 8) % 9000, room = 1 + (x >> 4) % 20000;
                if (piece > len - at)
                    piece = len - at;
                int flush = at + piece == len && (x & 1) ? Z_FINISH : Z_NO_FLUSH;
                ret = inflate_both(&s, &r, c + at, piece, os, orf, room, flush);
                at += piece - s.avail_in;
                if (ret == Z_BUF_ERROR && at == len)
                    break;
                if (ret == Z_BUF_ERROR)
                    ret = Z_OK;
            }
            if (damage == 0)
                CHECK(ret == Z_STREAM_END && s.total_out == n);
            else if (damage == 1 || wbits[w] != -15) /* raw: no check value */
                CHECK(ret != Z_STREAM_END);
            inflateEnd(&s);
            ref.inflateEnd(&r);
            if (damage == 2)
                c[clen / 2] ^= 0x5a;
        }
    }
    /* A copy mid-stream: both finish to the data. */
    size_t clen = ref_deflate(6, 15, d, n, c, 2 * n);
    z_stream s, t;
    memset(&s, 0, sizeof s);
    CHECK(inflateInit(&s) == Z_OK);
    s.next_in = c;
    s.avail_in = (uInt)(clen / 2);
    s.next_out = os;
    s.avail_out = (uInt)n;
    CHECK(inflate(&s, Z_NO_FLUSH) == Z_OK);
    CHECK(inflateCopy(&t, &s) == Z_OK);
    size_t made = s.total_out;
    s.avail_in = t.avail_in = (uInt)(clen - clen / 2);
    CHECK(inflate(&s, Z_FINISH) == Z_STREAM_END);
    CHECK(s.total_out == n && memcmp(os, d, n) == 0);
    t.next_out = orf + made;
    memcpy(orf, d, made);
    CHECK(inflate(&t, Z_FINISH) == Z_STREAM_END);
    CHECK(t.total_out == n && memcmp(orf, d, n) == 0);
    inflateEnd(&t);
    /* Reset and reuse, in pieces again: the counts and check value as
     * zlib's reset leaves them. */
    CHECK(inflateReset(&s) == Z_OK);
    CHECK(s.total_in == 0 && s.total_out == 0 && s.adler == 1 && s.msg == NULL);
    s.next_in = c;
    s.next_out = os;
    s.avail_out = (uInt)n;
    int ret = Z_OK;
    for (size_t at = 0; ret == Z_OK; at += 1000) {
        s.avail_in = (uInt)(at + 1000 <= clen ? 1000 : clen - at);
        ret = inflate(&s, Z_NO_FLUSH);
    }
    CHECK(ret == Z_STREAM_END && s.total_out == n && memcmp(os, d, n) == 0);
    inflateEnd(&s);
    /* inflateSync past damage, as stock zlib does it: a stream of full
     * flush points, its second block damaged. */
    memset(&s, 0, sizeof s);
    CHECK(deflateInit2(&s, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    s.next_out = c;
    s.avail_out = (uInt)(2 * n);
    for (size_t at = 0; at < n; at += 10000) {
        s.next_in = d + at;
        s.avail_in = 10000;
        CHECK(deflate(&s, at + 10000 >= n ? Z_FINISH : Z_FULL_FLUSH) >= 0);
    }
    clen = s.total_out;
    deflateEnd(&s);
    c[clen / 10] ^= 0xff;
    z_stream r;
    memset(&s, 0, sizeof s);
    memset(&r, 0, sizeof r);
    CHECK(inflateInit2(&s, -15) == Z_OK);
    CHECK(ref.inflateInit2_(&r, -15, ZLIB_VERSION, (int)sizeof r) == Z_OK);
    size_t at = 0;
    for (int round = 0; round < 40 && at < clen; round++) {
        ret = inflate_both(&s, &r, c + at, clen - at, os, orf, n, Z_NO_FLUSH);
        at += (clen - at) - s.avail_in;
        if (ret == Z_STREAM_END)
            break;
        if (ret == Z_DATA_ERROR) {
            s.next_in = r.next_in = c + at;
            s.avail_in = r.avail_in = (uInt)(clen - at);
            int a = inflateSync(&s), b = ref.inflateSync(&r);
            CHECK(a == b && s.avail_in == r.avail_in && s.total_in == r.total_in);
            at = clen - s.avail_in;
        }
    }
    inflateEnd(&s);
    ref.inflateEnd(&r);
    /* A gzip header asked for first: filled in, the data right. */
    memset(&s, 0, sizeof s);
    CHECK(deflateInit2(&s, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    gz_header h;
    memset(&h, 0, sizeof h);
    h.name = (Bytef *)"wd.txt";
    CHECK(deflateSetHeader(&s, &h) == Z_OK);
    s.next_in = d;
    s.avail_in = (uInt)n;
    s.next_out = c;
    s.avail_out = (uInt)(2 * n);
    CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
    clen = s.total_out;
    deflateEnd(&s);
    unsigned char name[32] = {0};
    gz_header got;
    memset(&got, 0, sizeof got);
    got.name = name;
    got.name_max = sizeof name;
    memset(&s, 0, sizeof s);
    CHECK(inflateInit2(&s, 31) == Z_OK);
    CHECK(inflateGetHeader(&s, &got) == Z_OK);
    s.next_in = c;
    s.next_out = os;
    s.avail_out = (uInt)n;
    ret = Z_OK;
    for (size_t at2 = 0; ret == Z_OK; at2 += 777) {
        s.avail_in = (uInt)(at2 + 777 <= clen ? 777 : clen - at2);
        ret = inflate(&s, Z_NO_FLUSH);
    }
    CHECK(ret == Z_STREAM_END && memcmp(os, d, n) == 0);
    CHECK(got.done == 1 && strcmp((char *)name, "wd.txt") == 0);
    inflateEnd(&s);
    free(d);
    free(c);
    free(os);
    free(orf);
}

/* Whole streams from untrusted input: one that decodes to far more than
 * its input and the caller's room (64 MiB of zeros) is declined, not set
 * aside: zlib-rs decodes it as zlib does, call by call (the whole path
 * would take all the input at the first call); a gzip member whose
 * trailer claims 200 MiB makes no aside of that size (the thread's
 * scratch buffer would stay mapped); an ordinary block read as python
 * reads it (a 64 KiB block, 16 KiB of room) is still taken whole. */
static void inflate_bounded(void)
{
    size_t n = 64 << 20, cap = n / 100;
    unsigned char *zeros = calloc(1, n), *c = malloc(cap);
    unsigned char *os = malloc(4096), *orf = malloc(4096);
    static const int wbits[] = {15, 31};
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++) {
        size_t clen = ref_deflate(9, wbits[w], zeros, n, c, cap);
        z_stream s, r;
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        CHECK(inflateInit2(&s, wbits[w]) == Z_OK);
        CHECK(ref.inflateInit2_(&r, wbits[w], ZLIB_VERSION, (int)sizeof r) == Z_OK);
        size_t at = 0;
        int ret;
        do {
            ret = inflate_both(&s, &r, c + at, clen - at, os, orf, 4096, Z_NO_FLUSH);
            at = clen - s.avail_in;
        } while (ret == Z_OK);
        CHECK(ret == Z_STREAM_END && s.total_out == n);
        inflateEnd(&s);
        ref.inflateEnd(&r);
    }
    /* The forged size. */
    size_t m = 100000;
    unsigned char *d = make_data(m, 93), *back = malloc(m);
    size_t glen = ref_deflate(6, 31, d, m, c, cap);
    uint32_t claim = 200u << 20;
    memcpy(c + glen - 4, &claim, 4); /* (little-endian, as gzip's) */
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(inflateInit2(&s, 31) == Z_OK);
    s.next_in = c;
    s.avail_in = (uInt)glen;
    int ret;
    do {
        s.next_out = back;
        s.avail_out = 65536;
        ret = inflate(&s, Z_NO_FLUSH);
    } while (ret == Z_OK);
    CHECK(ret == Z_DATA_ERROR);
    CHECK(mallinfo2().hblkhd < (100 << 20));
    inflateEnd(&s);
    /* A block as python reads it. */
    size_t blen = ref_deflate(6, 15, d, 65536, c, cap);
    memset(&s, 0, sizeof s);
    CHECK(inflateInit(&s) == Z_OK);
    s.next_in = c;
    s.avail_in = (uInt)blen;
    s.next_out = back;
    s.avail_out = 16384;
    CHECK(inflate(&s, Z_NO_FLUSH) == Z_OK && s.avail_in <= 1);
    do {
        s.avail_out = (uInt)(m - s.total_out);
        ret = inflate(&s, Z_NO_FLUSH);
    } while (ret == Z_OK);
    CHECK(ret == Z_STREAM_END && s.total_out == 65536 && memcmp(back, d, 65536) == 0);
    inflateEnd(&s);
    free(zeros);
    free(c);
    free(os);
    free(orf);
    free(d);
    free(back);
}

/* Whole streams (large, and small: the kept state) as zlib answers them:
 * with Z_FINISH every call that does not reach the end is Z_BUF_ERROR;
 * data_type at the end is zlib's (a raw stream decoded by libdeflate
 * aside: the unused bits of its last byte are not known); Z_BLOCK and
 * Z_TREES stop at each block as zlib stops, data_type telling where. */
static void inflate_whole_as_zlib(void)
{
    static const int wbits[] = {15, -15, 31};
    size_t n = 100000;
    unsigned char *d = make_data(n, 95), *c = malloc(2 * n);
    unsigned char *a = malloc(n + 1), *b = malloc(n + 1);
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++)
        for (size_t len = n; len > 0; len = len == n ? 40 : 0)
            for (int mode = 0; mode < 4; mode++) {
                /* mode 0: Z_FINISH in 1000-byte rooms; 1: Z_FINISH, room
                 * enough; 2: Z_BLOCK; 3: Z_TREES. */
                size_t clen = ref_deflate(6, wbits[w], d, len, c, 2 * n);
                z_stream s, r;
                memset(&s, 0, sizeof s);
                memset(&r, 0, sizeof r);
                s.data_type = r.data_type = 12345;
                CHECK(inflateInit2(&s, wbits[w]) == Z_OK);
                CHECK(ref.inflateInit2_(&r, wbits[w], ZLIB_VERSION, (int)sizeof r) == Z_OK);
                int flush = mode < 2 ? Z_FINISH : mode == 2 ? Z_BLOCK : Z_TREES;
                size_t room = mode == 0 ? (len == n ? 1000 : 10) : n + 1;
                s.next_in = r.next_in = c;
                s.avail_in = r.avail_in = (uInt)clen;
                int x, y, calls = 0;
                do {
                    s.next_out = a + s.total_out;
                    r.next_out = b + r.total_out;
                    s.avail_out = (uInt)(room < n + 1 - s.total_out ? room : n + 1 - s.total_out);
                    r.avail_out = (uInt)(room < n + 1 - r.total_out ? room : n + 1 - r.total_out);
                    x = inflate(&s, flush);
                    y = ref.inflate(&r, flush);
                    CHECK(x == y && s.total_out == r.total_out);
                    if (flush != Z_FINISH) /* (the whole path takes all input at once) */
                        CHECK(s.total_in == r.total_in && s.data_type == r.data_type);
                    calls++;
                } while ((x == Z_OK || x == Z_BUF_ERROR) && calls < 100000);
                CHECK(x == Z_STREAM_END && s.total_out == len && memcmp(a, d, len) == 0);
                CHECK(memcmp(a, b, len) == 0);
                if (wbits[w] > 0 || len < 128)
                    CHECK(s.data_type == r.data_type);
                inflateEnd(&s);
                ref.inflateEnd(&r);
            }
    free(d);
    free(c);
    free(a);
    free(b);
}

/* The stream's fields a program sees, as the reference left its own. */
static void same_fields(const z_stream *s, const z_stream *r)
{
    CHECK(s->total_in == r->total_in && s->total_out == r->total_out);
    CHECK(s->adler == r->adler && (s->msg == NULL) == (r->msg == NULL));
}

/* An inflate stream the shim opened without zlib's state (it makes it
 * when a call needs it): every call before the first inflate answers as
 * stock zlib's does, a copy and a new window work, and the init refuses
 * what zlib's refuses. */
static void inflate_before_first_call(void)
{
    size_t n = 3000;
    unsigned char *d = make_data(n, 21);
    unsigned char *c = malloc(2 * n + 64), *out = malloc(n + 64), *dict = malloc(32768);
    static const int wbits[] = {15, 0, -15, 31, 47, 12, -9};
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++) {
        z_stream s, r;
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        s.adler = r.adler = 77; /* a raw stream's init leaves it */
        CHECK(inflateInit2(&s, wbits[w]) == Z_OK);
        CHECK(ref.inflateInit2_(&r, wbits[w], ZLIB_VERSION, (int)sizeof r) == Z_OK);
        same_fields(&s, &r);
        CHECK(inflateMark(&s) == ref.inflateMark(&r));
        CHECK(inflateCodesUsed(&s) == ref.inflateCodesUsed(&r));
        CHECK(inflateSyncPoint(&s) == ref.inflateSyncPoint(&r));
        uInt a = 99, b = 99;
        CHECK(inflateGetDictionary(&s, dict, &a) == ref.inflateGetDictionary(&r, dict, &b));
        CHECK(a == b);
        CHECK(inflateReset(&s) == ref.inflateReset(&r));
        same_fields(&s, &r);
        CHECK(inflateEnd(&s) == Z_OK && ref.inflateEnd(&r) == Z_OK);
        CHECK(s.state == NULL);
    }
    /* A copy before the first call, and a new window: each decodes a
     * whole stream of its framing. */
    size_t zlen = ref_deflate(6, 15, d, n, c, 2 * n);
    z_stream s, t;
    memset(&s, 0, sizeof s);
    CHECK(inflateInit(&s) == Z_OK);
    CHECK(inflateCopy(&t, &s) == Z_OK);
    s.next_in = t.next_in = c;
    s.avail_in = t.avail_in = (uInt)zlen;
    s.next_out = out;
    s.avail_out = (uInt)n;
    CHECK(inflate(&s, Z_FINISH) == Z_STREAM_END);
    CHECK(s.total_out == n && memcmp(out, d, n) == 0);
    /* A call that needs zlib's state after the whole path: the counts and
     * check value stay. */
    uLong check = s.adler;
    CHECK(inflateSyncPoint(&s) == 0);
    CHECK(s.total_in == zlen && s.total_out == n && s.adler == check && s.msg == NULL);
    memset(out, 0, n);
    t.next_out = out;
    t.avail_out = (uInt)n;
    CHECK(inflate(&t, Z_FINISH) == Z_STREAM_END);
    CHECK(t.total_out == n && memcmp(out, d, n) == 0);
    CHECK(inflateEnd(&t) == Z_OK);
    size_t glen = ref_deflate(6, 31, d, n, c, 2 * n);
    CHECK(inflateReset2(&s, 31) == Z_OK);
    CHECK(s.total_in == 0 && s.total_out == 0 && s.adler == 0);
    s.next_in = c;
    s.avail_in = (uInt)glen;
    s.next_out = out;
    s.avail_out = (uInt)n;
    CHECK(inflate(&s, Z_FINISH) == Z_STREAM_END);
    CHECK(s.total_out == n && memcmp(out, d, n) == 0);
    CHECK(inflateReset2(&s, 99) == Z_STREAM_ERROR);
    CHECK(inflateEnd(&s) == Z_OK);
    /* Refused as zlib refuses: a wrong version, a wrong size, no stream,
     * a window it does not take. */
    memset(&s, 0, sizeof s);
    z_stream r;
    memset(&r, 0, sizeof r);
    CHECK(inflateInit2_(&s, 15, "0.9", (int)sizeof s) == Z_VERSION_ERROR);
    CHECK(inflateInit2_(&s, 15, ZLIB_VERSION, (int)sizeof s - 8) == Z_VERSION_ERROR);
    CHECK(inflateInit2_(NULL, 15, ZLIB_VERSION, (int)sizeof s) == Z_STREAM_ERROR);
    CHECK(inflateInit2(&s, 7) == ref.inflateInit2_(&r, 7, ZLIB_VERSION, (int)sizeof r));
    /* A small stream on the first call, a stream in two pieces (the
     * first too short to be whole): zlib's answers and bytes. */
    zlen = ref_deflate(1, 15, d, 40, c, 2 * n);
    for (size_t first = 0; first <= zlen; first++) {
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        CHECK(inflateInit(&s) == Z_OK);
        CHECK(ref.inflateInit2_(&r, 15, ZLIB_VERSION, (int)sizeof r) == Z_OK);
        unsigned char o2[64];
        int a1 = inflate_both(&s, &r, c, first, out, o2, 64, Z_NO_FLUSH);
        if (a1 == Z_OK || a1 == Z_BUF_ERROR) {
            size_t took = first - s.avail_in;
            size_t made = 64 - s.avail_out;
            inflate_both(&s, &r, c + took, zlen - took, out + made, o2 + made, 64 - made,
                         Z_NO_FLUSH);
        }
        CHECK(s.total_out == 40 && memcmp(out, d, 40) == 0);
        same_fields(&s, &r);
        CHECK(inflateEnd(&s) == Z_OK && ref.inflateEnd(&r) == Z_OK);
    }
    free(d);
    free(c);
    free(out);
    free(dict);
}

/* Small whole streams (the shim decodes them with a zlib state it keeps)
 * in one call against stock zlib: every framing, sizes around the
 * boundary, room enough, exactly enough and one byte short, truncated
 * and with a byte flipped; then the same stream again on the same
 * stream after a reset. */
static void small_streams(void)
{
    unsigned char *d = make_data(400, 31);
    unsigned char c[1024], a[512], b[512];
    static const int wbits[] = {15, -15, 31, 47, 0};
    for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++) {
        int enc = wbits[w] == 47 ? 31 : wbits[w] == 0 ? 15 : wbits[w];
        for (size_t n = 0; n <= 400; n += 13) {
            size_t clen = ref_deflate(n % 2 ? 1 : 6, enc, d, n, c, sizeof c);
            for (int variant = 0; variant < 5; variant++) {
                size_t len = variant == 3 ? clen - 1 - n % (clen - 1) : clen;
                size_t room = variant == 1 ? n : variant == 2 && n ? n - 1 : sizeof a;
                if (variant == 4)
                    c[n % clen] ^= 0x10;
                for (int flush = 0; flush < 2; flush++) {
                    z_stream s, r;
                    memset(&s, 0, sizeof s);
                    memset(&r, 0, sizeof r);
                    CHECK(inflateInit2(&s, wbits[w]) == Z_OK);
                    CHECK(ref.inflateInit2_(&r, wbits[w], ZLIB_VERSION, (int)sizeof r) == Z_OK);
                    int f = flush ? Z_FINISH : Z_NO_FLUSH;
                    if (variant == 2 && n) {
                        /* One byte short: the whole path takes all the
                         * input at once and keeps the byte (documented),
                         * zlib leaves input: the same data, end and
                         * counts once the rest of the room comes. */
                        s.next_in = c;
                        s.avail_in = (uInt)len;
                        s.next_out = a;
                        s.avail_out = (uInt)room;
                        int first = inflate(&s, f);
                        CHECK(first == Z_OK || first == Z_BUF_ERROR);
                        s.avail_out = 1;
                        int ret = inflate(&s, f);
                        while (ret == Z_OK && s.avail_in)
                            ret = inflate(&s, f);
                        CHECK(ret == Z_STREAM_END && s.total_out == n && s.total_in == len);
                        CHECK(memcmp(a, d, n) == 0);
                        inflateEnd(&s);
                        ref.inflateEnd(&r);
                        continue;
                    }
                    int ret = inflate_both(&s, &r, c, len, a, b, room, f);
                    if (ret == Z_STREAM_END) {
                        /* (a flipped byte of a raw stream may still decode) */
                        CHECK(variant == 4 || (s.total_out == n && memcmp(a, d, n) == 0));
                        /* Again after a reset: the same answer. */
                        CHECK(inflateReset(&s) == Z_OK && ref.inflateReset(&r) == Z_OK);
                        CHECK(inflate_both(&s, &r, c, len, a, b, room, f) == Z_STREAM_END);
                    } else if (ret == Z_OK || ret == Z_BUF_ERROR) {
                        /* The rest of the room: the same end. */
                        size_t got = room - s.avail_out, took = len - s.avail_in;
                        inflate_both(&s, &r, c + took, len - took, a + got, b + got,
                                     sizeof a - got, f);
                    }
                    inflateEnd(&s);
                    ref.inflateEnd(&r);
                }
                if (wbits[w] == 15) {
                    /* uncompress2 on the same bytes and room: zlib's
                     * answer, lengths and data. */
                    uLongf la = room, lb = room;
                    uLong sa = len, sb = len;
                    int ra = uncompress2(a, &la, c, &sa), rb = ref.uncompress2(b, &lb, c, &sb);
                    CHECK(ra == rb && la == lb && sa == sb);
                    if (ra == Z_OK)
                        CHECK(memcmp(a, b, la) == 0);
                }
                if (variant == 4)
                    c[n % clen] ^= 0x10;
            }
        }
    }
    free(d);
}

/* Small whole streams whose framing changes from one stream to the next
 * (the thread's kept inflate state is reset to each stream's window, or
 * only reset when the window is the one it had), some framed otherwise
 * than the stream was opened for, some truncated or with a byte flipped
 * (a failed stream leaves the kept state mid-stream), and uncompress
 * calls in between: stock zlib's answers throughout. */
static void small_streams_mixed(void)
{
    unsigned char *d = make_data(100, 37);
    unsigned char c[256], a[128], b[128];
    static const int wbits[] = {15, 15, -15, 31, 47, 0, -15};
    for (unsigned i = 0; i < 700; i++) {
        int w = wbits[i % 7], enc = w == 47 ? (i % 2 ? 31 : 15) : w == 0 ? 15 : w;
        /* Now and then another framing than the stream was opened for:
         * a state left with the wrong window would take it. */
        if (i % 3 == 1)
            enc = wbits[(i / 3) % 4];
        size_t n = i % 101;
        size_t clen = ref_deflate(1 + i % 9, enc, d, n, c, sizeof c);
        int damage = i % 5 == 3 ? 1 : i % 5 == 4 ? 2 : 0;
        size_t len = damage == 1 ? clen / 2 : clen;
        if (damage == 2)
            c[i % clen] ^= 0x40;
        z_stream s, r;
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        CHECK(inflateInit2(&s, w) == Z_OK);
        CHECK(ref.inflateInit2_(&r, w, ZLIB_VERSION, (int)sizeof r) == Z_OK);
        int ret = inflate_both(&s, &r, c, len, a, b, sizeof a, Z_FINISH);
        int framed_so = w == 47 ? enc == 15 || enc == 31 : enc == (w == 0 ? 15 : w);
        if (!damage && framed_so)
            CHECK(ret == Z_STREAM_END && s.total_out == n && memcmp(a, d, n) == 0);
        inflateEnd(&s);
        ref.inflateEnd(&r);
        if (i % 11 == 0) {
            uLongf la = sizeof a, lb = sizeof b;
            CHECK(uncompress(a, &la, c, len) == ref.uncompress(b, &lb, c, len));
            CHECK(la == lb && memcmp(a, b, la) == 0);
        }
    }
    free(d);
}

/* Small whole deflate streams and compress2 calls (the shim compresses
 * them with zlib states it keeps, reset between streams): byte for byte
 * stock zlib's output, counts and check values, for every level in turn
 * (the kept state changes level between streams), every framing, and
 * too little room (zlib's own answer). */
static void small_deflates(void)
{
    unsigned char *d = make_data(200, 41);
    unsigned char a[512], b[512];
    static const int wbits[] = {15, -15, 31};
    static const int levels[] = {1, 9, -1, 2, 6, 3, 8, 4, 7, 5};
    for (size_t n = 0; n < 128; n += 7) { /* (below the size libdeflate takes) */
        for (size_t l = 0; l < sizeof levels / sizeof levels[0]; l++) {
            int level = levels[l];
            for (size_t w = 0; w < sizeof wbits / sizeof wbits[0]; w++) {
                z_stream s, r;
                memset(&s, 0, sizeof s);
                memset(&r, 0, sizeof r);
                CHECK(deflateInit2(&s, level, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY) ==
                      Z_OK);
                CHECK(ref.deflateInit2_(&r, level, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY,
                                        ZLIB_VERSION, (int)sizeof r) == Z_OK);
                s.next_in = r.next_in = d + l;
                s.avail_in = r.avail_in = (uInt)n;
                s.next_out = a;
                r.next_out = b;
                s.avail_out = r.avail_out = sizeof a;
                CHECK(deflate(&s, Z_FINISH) == Z_STREAM_END);
                CHECK(ref.deflate(&r, Z_FINISH) == Z_STREAM_END);
                CHECK(s.total_out == r.total_out && memcmp(a, b, s.total_out) == 0);
                CHECK(s.total_in == n && s.adler == r.adler && s.data_type == r.data_type);
                CHECK(deflateEnd(&s) == Z_OK);
                ref.deflateEnd(&r);
            }
            uLongf la = sizeof a, lb = sizeof b;
            CHECK(compress2(a, &la, d + l, (uLong)n, level) == Z_OK);
            CHECK(ref.compress2(b, &lb, d + l, (uLong)n, level) == Z_OK);
            CHECK(la == lb && memcmp(a, b, la) == 0);
            /* One byte short: zlib's answer, and the stream still ends
             * right once it has room. */
            uLongf shorter = lb - 1;
            CHECK(compress2(a, &shorter, d + l, (uLong)n, level) == Z_BUF_ERROR);
            z_stream s;
            memset(&s, 0, sizeof s);
            CHECK(deflateInit(&s, level) == Z_OK);
            s.next_in = d + l;
            s.avail_in = (uInt)n;
            s.next_out = a;
            s.avail_out = (uInt)(lb - 1);
            int ret = deflate(&s, Z_FINISH);
            CHECK(ret == Z_OK || ret == Z_BUF_ERROR);
            s.avail_out = 64;
            while ((ret = deflate(&s, Z_FINISH)) == Z_OK)
                s.avail_out = 64;
            CHECK(ret == Z_STREAM_END && s.total_out >= lb - 1);
            uLongf back = 200;
            unsigned char o[200];
            CHECK(ref.uncompress(o, &back, a, s.total_out) == Z_OK);
            CHECK(back == n && memcmp(o, d + l, n) == 0);
            deflateEnd(&s);
        }
    }
    free(d);
}

/* Threads, each with its own kept states and records, small and large
 * streams in every framing, then ending (the shim frees what it kept). */
static void *thread_work(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    unsigned char *d = make_data(70000, seed);
    unsigned char *c = malloc(80000), *o = malloc(70000);
    static const int wbits[] = {15, -15, 31};
    for (int round = 0; round < 200; round++) {
        size_t n = round % 3 == 0 ? 60000 + (size_t)round : (size_t)(round * 37) % 300;
        int w = wbits[round % 3], level = 1 + round % 9;
        z_stream s;
        memset(&s, 0, sizeof s);
        CHECK(deflateInit2(&s, level, Z_DEFLATED, w, 8, Z_DEFAULT_STRATEGY) == Z_OK);
        size_t clen = deflate_all(&s, d, n, c, 80000);
        deflateEnd(&s);
        CHECK(ref_inflate(w, c, clen, o, 70000) == n && memcmp(o, d, n) == 0);
        memset(&s, 0, sizeof s);
        CHECK(inflateInit2(&s, w) == Z_OK);
        s.next_in = c;
        s.avail_in = (uInt)clen;
        s.next_out = o;
        s.avail_out = 70000;
        CHECK(inflate(&s, Z_NO_FLUSH) == Z_STREAM_END && s.total_out == n);
        CHECK(memcmp(o, d, n) == 0);
        inflateEnd(&s);
    }
    free(d);
    free(c);
    free(o);
    return NULL;
}

/* Streams made and ended over and over, until told to stop: the shim's
 * table of streams is taken and given back all the time. */
static volatile int churn_stop;

static void *churn(void *arg)
{
    (void)arg;
    static unsigned char window[32768];
    while (!churn_stop) {
        /* inflateBack streams live in the shim's table: their init and
         * end take its lock. */
        z_stream s;
        memset(&s, 0, sizeof s);
        if (inflateBackInit(&s, 15, window) == Z_OK)
            inflateBackEnd(&s);
    }
    return NULL;
}

/* fork while another thread is inside the shim: the child's own zlib
 * calls must not wait for a lock the other thread held at the fork (that
 * thread does not exist in the child, so it waited for ever). */
static void fork_while_busy(void)
{
    pthread_t t;
    churn_stop = 0;
    CHECK(pthread_create(&t, NULL, churn, NULL) == 0);
    int hung = 0;
    for (int i = 0; i < 200 && !hung; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            unsigned char in[4096], out[8192], back[4096];
            memset(in, 'b', sizeof in);
            z_stream s;
            memset(&s, 0, sizeof s);
            int ok = deflateInit(&s, 6) == Z_OK;
            s.next_in = in;
            s.avail_in = sizeof in;
            s.next_out = out;
            s.avail_out = sizeof out;
            ok = ok && deflate(&s, Z_FINISH) == Z_STREAM_END;
            uLongf n = sizeof back;
            ok = ok && uncompress(back, &n, out, s.total_out) == Z_OK && n == sizeof in;
            deflateEnd(&s);
            static unsigned char window[32768];
            z_stream b;
            memset(&b, 0, sizeof b);
            ok = ok && inflateBackInit(&b, 15, window) == Z_OK && inflateBackEnd(&b) == Z_OK;
            _exit(ok ? 0 : 1);
        }
        int status = 0;
        struct timespec nap = {0, 1000000};
        int waited = 0;
        while (waitpid(pid, &status, WNOHANG) == 0) {
            if (++waited > 5000) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                hung = 1;
                break;
            }
            nanosleep(&nap, NULL);
        }
        CHECK(!hung && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    churn_stop = 1;
    pthread_join(t, NULL);
}

static void threads(void)
{
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, thread_work, (void *)(i + 50)) == 0);
    for (int i = 0; i < 4; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
}

/* zlib called by a thread-specific destructor that runs after the
 * shim's own (its key made later): the thread's compressor, scratch
 * buffer and kept states are gone, and the calls still work (valgrind
 * and ASan runs see no use of what was freed, nor a leak). */
static pthread_key_t late_key;
static int late_done;

static void late_calls(void)
{
    size_t n = 100000;
    unsigned char *d = make_data(n, 91), *c = malloc(2 * n), *o = malloc(n + 1);
    /* One-shot calls, large and small (libwd_comp, kept states). */
    for (size_t len = n; len > 0; len = len == n ? 50 : 0) {
        uLongf clen = 2 * n, olen = n + 1;
        CHECK(compress2(c, &clen, d, len, 6) == Z_OK);
        CHECK(uncompress(o, &olen, c, clen) == Z_OK && olen == len && memcmp(o, d, len) == 0);
    }
    /* Whole streams whose output waits (the scratch buffer). */
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(deflateInit(&s, 6) == Z_OK);
    s.next_in = d;
    s.avail_in = (uInt)n;
    int ret;
    do {
        out_at(&s, c, 2 * n, 1000);
        ret = deflate(&s, Z_FINISH);
    } while (ret == Z_OK);
    CHECK(ret == Z_STREAM_END);
    size_t clen = s.total_out;
    CHECK(deflateEnd(&s) == Z_OK);
    memset(&s, 0, sizeof s);
    CHECK(inflateInit(&s) == Z_OK);
    s.next_in = c;
    s.avail_in = (uInt)clen;
    do {
        out_at(&s, o, n + 1, 1000);
        ret = inflate(&s, Z_NO_FLUSH);
    } while (ret == Z_OK);
    CHECK(ret == Z_STREAM_END && s.total_out == n && memcmp(o, d, n) == 0);
    CHECK(inflateEnd(&s) == Z_OK);
    free(d);
    free(c);
    free(o);
}

static void late_destructor(void *arg)
{
    (void)arg;
    late_calls();
    late_done = 1;
}

static void *late_thread(void *arg)
{
    (void)arg;
    late_calls(); /* (the thread's compressor, scratch and kept states made) */
    CHECK(pthread_setspecific(late_key, (void *)1) == 0);
    return NULL;
}

static void zlib_at_thread_exit(void)
{
    late_calls(); /* (the shim's keys made first: their destructors run first) */
    CHECK(pthread_key_create(&late_key, late_destructor) == 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, late_thread, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(late_done);
    pthread_key_delete(late_key);
}

/* Parameters and a dictionary given before any data (held by the shim
 * until the stream's size picks zlib-rs or the system zlib): pigz's
 * blocks (reset, level, the last 32 KiB as dictionary, Z_BLOCK then
 * Z_SYNC_FLUSH) decode to the data; a zlib stream's check value and
 * Z_NEED_DICT are zlib's; zlib's refusals; the bound; a copy; a reset
 * forgets the dictionary; the dictionary reads back. */
static void held_params_and_dictionary(void)
{
    size_t n = 600000;
    unsigned char *d = make_data(n, 61);
    unsigned char *c = malloc(2 * n), *o = malloc(n + 64);
    static const size_t blocks[] = {131072, 5000, 700, 131072, 3000, 131072, 65536};
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(deflateInit2(&s, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    size_t at = 0, out = 0;
    for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
        int last = b + 1 == sizeof blocks / sizeof blocks[0];
        CHECK(deflateReset(&s) == Z_OK);
        CHECK(deflateParams(&s, 1, Z_DEFAULT_STRATEGY) == Z_OK);
        if (at)
            CHECK(deflateSetDictionary(&s, d + at - (at < 32768 ? at : 32768),
                                       at < 32768 ? (uInt)at : 32768) == Z_OK);
        s.next_in = d + at;
        s.avail_in = (uInt)blocks[b];
        s.next_out = c + out;
        s.avail_out = (uInt)(2 * n - out);
        CHECK(deflate(&s, last ? Z_FINISH : Z_BLOCK) == (last ? Z_STREAM_END : Z_OK));
        if (!last) {
            unsigned pending;
            int bits;
            CHECK(deflatePending(&s, &pending, &bits) == Z_OK && pending == 0);
            CHECK(deflate(&s, Z_SYNC_FLUSH) == Z_OK);
        }
        at += blocks[b];
        out = 2 * n - s.avail_out;
    }
    CHECK(deflateEnd(&s) == Z_OK);
    CHECK(ref_inflate(-15, c, out, o, n + 64) == at && memcmp(o, d, at) == 0);

    /* A zlib stream with a dictionary, large (zlib-rs) and small (zlib). */
    const unsigned char *dict = d + 500000;
    for (size_t len = 1000; len <= 64000; len += 63000) {
        z_stream r;
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        CHECK(deflateInit(&s, 1) == Z_OK);
        CHECK(ref.deflateInit2_(&r, 1, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                                (int)sizeof r) == Z_OK);
        CHECK(deflateSetDictionary(&s, dict, 20000) == Z_OK);
        CHECK(ref.deflateSetDictionary(&r, dict, 20000) == Z_OK);
        CHECK(s.adler == r.adler);
        CHECK(s.total_in == r.total_in); /* (zlib counts a dictionary as input) */
        unsigned char back[32768];
        uInt bl = 0, rl = 0;
        CHECK(deflateGetDictionary(&s, back, &bl) == Z_OK);
        CHECK(ref.deflateGetDictionary(&r, o, &rl) == Z_OK);
        CHECK(bl == rl && memcmp(back, o, bl) == 0);
        ref.deflateEnd(&r);
        size_t clen = deflate_all(&s, d, len, c, 2 * n);
        CHECK(deflateEnd(&s) == Z_OK);
        CHECK(ref_inflate_dict(15, c, clen, dict, 20000, o, n) == len && memcmp(o, d, len) == 0);
    }
    /* The same before any use of zlib's state (GetDictionary above made
     * it): held, then copied, each copy finishing on its own. */
    memset(&s, 0, sizeof s);
    CHECK(deflateInit(&s, 1) == Z_OK);
    CHECK(deflateSetDictionary(&s, dict, 20000) == Z_OK);
    CHECK(deflateBound(&s, 0) >= 6 + 4 + 5);
    z_stream t;
    CHECK(deflateCopy(&t, &s) == Z_OK);
    for (z_stream *x = &s; x; x = x == &s ? &t : NULL) {
        size_t clen = deflate_all(x, d, 50000, c, 2 * n);
        CHECK(ref_inflate_dict(15, c, clen, dict, 20000, o, n) == 50000);
        CHECK(memcmp(o, d, 50000) == 0);
        CHECK(deflateEnd(x) == Z_OK);
    }
    /* A reset forgets the dictionary: no Z_NEED_DICT after it. */
    memset(&s, 0, sizeof s);
    CHECK(deflateInit(&s, 1) == Z_OK);
    CHECK(deflateSetDictionary(&s, dict, 20000) == Z_OK);
    CHECK(deflateReset(&s) == Z_OK);
    CHECK(s.adler == 1);
    size_t clen = deflate_all(&s, d, 30000, c, 2 * n);
    CHECK(ref_inflate(15, c, clen, o, n) == 30000 && memcmp(o, d, 30000) == 0);
    deflateEnd(&s);
    /* zlib's refusals: no dictionary for gzip, levels and strategies out
     * of range; a strategy other than the default is honoured. */
    z_stream r;
    memset(&s, 0, sizeof s);
    memset(&r, 0, sizeof r);
    CHECK(deflateInit2(&s, 1, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    CHECK(ref.deflateInit2_(&r, 1, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                            (int)sizeof r) == Z_OK);
    CHECK(deflateSetDictionary(&s, dict, 100) == ref.deflateSetDictionary(&r, dict, 100));
    CHECK(deflateParams(&s, 10, 0) == ref.deflateParams(&r, 10, 0));
    CHECK(deflateParams(&s, 1, 9) == ref.deflateParams(&r, 1, 9));
    CHECK(deflateParams(&s, 2, Z_HUFFMAN_ONLY) == ref.deflateParams(&r, 2, Z_HUFFMAN_ONLY));
    ref.deflateEnd(&r);
    clen = deflate_all(&s, d, 40000, c, 2 * n);
    CHECK(ref_inflate(31, c, clen, o, n) == 40000 && memcmp(o, d, 40000) == 0);
    deflateEnd(&s);
    free(d);
    free(c);
    free(o);
}

/* gz files: written and read through the shim, read by stock zlib. */
/* inflateBack's callbacks: input in pieces of `piece` bytes from `in`
 * (after what next_in held), output gathered with the length of each
 * call, `out` failing at its call number `fail_at` (0: never). */
struct back_io {
    const unsigned char *in;
    size_t len, at, piece;
    unsigned in_calls;
    unsigned char *out;
    size_t out_len, out_cap;
    unsigned out_calls, fail_at;
    unsigned lens[64];
};

static unsigned back_in(void *desc, unsigned char **buf)
{
    struct back_io *io = desc;
    io->in_calls++;
    size_t n = io->len - io->at < io->piece ? io->len - io->at : io->piece;
    *buf = (unsigned char *)io->in + io->at;
    io->at += n;
    return (unsigned)n;
}

static int back_out(void *desc, unsigned char *buf, unsigned len)
{
    struct back_io *io = desc;
    io->out_calls++;
    if (io->out_calls < 64)
        io->lens[io->out_calls - 1] = len;
    if (io->fail_at && io->out_calls == io->fail_at)
        return 1;
    CHECK(io->out_len + len <= io->out_cap);
    memcpy(io->out + io->out_len, buf, len);
    io->out_len += len;
    return 0;
}

/* What one inflateBack call came to. */
struct back_run {
    int ret;
    struct back_io io;
    long left_at; /* next_in's offset in the input on return; -1: NULL */
    unsigned left;
    char msg[128];
};

static struct back_run back_run(int use_ref, int wbits, const unsigned char *in, size_t len,
                                size_t given, size_t piece, unsigned fail_at, unsigned char *out,
                                size_t cap)
{
    static unsigned char window[1 << 15];
    struct back_run r;
    memset(&r, 0, sizeof r);
    r.io = (struct back_io){.in = in, .len = len, .at = given, .piece = piece, .out = out,
                            .out_cap = cap, .fail_at = fail_at};
    z_stream s;
    memset(&s, 0, sizeof s);
    int (*init)(z_streamp, int, unsigned char *, const char *, int) =
        use_ref ? ref.inflateBackInit_ : inflateBackInit_;
    CHECK(init(&s, wbits, window, ZLIB_VERSION, (int)sizeof s) == Z_OK);
    s.next_in = given ? (Bytef *)in : Z_NULL;
    s.avail_in = (uInt)given;
    r.ret = (use_ref ? ref.inflateBack : inflateBack)(&s, back_in, &r.io, back_out, &r.io);
    r.left_at = s.next_in ? (long)(s.next_in - in) : -1;
    r.left = s.avail_in;
    snprintf(r.msg, sizeof r.msg, "%s", s.msg ? s.msg : "");
    CHECK((use_ref ? ref.inflateBackEnd : inflateBackEnd)(&s) == Z_OK);
    return r;
}

/* inflateBack (pigz -d decodes through it; the shim runs it on
 * zlib-rs's inflate): for raw streams whole, in pieces, truncated,
 * damaged, followed by other bytes, with `out` failing, the same return,
 * output (and the length of each `out` call), input left and message as
 * stock zlib's. */
static void inflate_back(void)
{
    static const size_t sizes[] = {0, 1, 100, 32768, 40000, 300000};
    static const size_t pieces[] = {1, 7, 4096, (size_t)-1};
    size_t cap = 400000;
    unsigned char *c = malloc(cap), *o1 = malloc(cap), *o2 = malloc(cap);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *d = make_data(sizes[i], (unsigned)i + 50);
        for (int level = 0; level <= 9; level += 3) {
            size_t n = ref_deflate(level, -15, d, sizes[i], c, cap - 16);
            memcpy(c + n, "TRAILER-BYTES", 13); /* what follows, as a gzip trailer does */
            for (int damage = 0; damage < 4; damage++) {
                size_t len = n + 13;
                unsigned char saved = 0;
                size_t at = n * (size_t)damage / 4;
                if (damage == 1)
                    len = n / 2; /* truncated */
                if (damage >= 2 && n > 2) {
                    saved = c[at];
                    c[at] ^= damage == 2 ? 0x10 : 0xff; /* damaged */
                }
                for (size_t p = 0; p < sizeof pieces / sizeof *pieces; p++) {
                    for (size_t given = 0; given <= 5; given += 5) {
                        for (unsigned fail = 0; fail < 3; fail += 2) {
                            size_t g = given < len ? given : len;
                            struct back_run a =
                                back_run(0, 15, c, len, g, pieces[p], fail, o1, cap);
                            struct back_run b =
                                back_run(1, 15, c, len, g, pieces[p], fail, o2, cap);
                            if (a.ret != b.ret || a.io.out_len != b.io.out_len ||
                                (a.left_at != b.left_at && b.ret != Z_BUF_ERROR) ||
                                !same_msg(a.msg, b.msg))
                                fprintf(stderr,
                                        "inflateBack size %zu level %d damage %d piece %zu given "
                                        "%zu fail %u: shim %d out %zu left %ld+%u '%s', zlib %d "
                                        "out %zu left %ld+%u '%s'\n",
                                        sizes[i], level, damage, pieces[p], g, fail, a.ret,
                                        a.io.out_len, a.left_at, a.left, a.msg, b.ret,
                                        b.io.out_len, b.left_at, b.left, b.msg);
                            CHECK(a.ret == b.ret);
                            CHECK(a.io.out_len == b.io.out_len);
                            CHECK(memcmp(o1, o2, a.io.out_len) == 0);
                            CHECK(a.io.out_calls == b.io.out_calls);
                            CHECK(memcmp(a.io.lens, b.io.lens, sizeof a.io.lens) == 0);
                            if (b.ret == Z_BUF_ERROR && b.left_at >= 0)
                                /* out() failed: zlib's contract is a
                                 * next_in that is not NULL (how much input
                                 * a decoder pulled before it wrote the
                                 * window out is its own). */
                                CHECK(a.left_at >= 0);
                            else
                                CHECK(a.left_at == b.left_at && a.left == b.left);
                            CHECK(same_msg(a.msg, b.msg));
                            if (damage == 0 && !fail) {
                                CHECK(a.ret == Z_STREAM_END);
                                CHECK(a.io.out_len == sizes[i] && memcmp(o1, d, sizes[i]) == 0);
                            }
                        }
                    }
                }
                if (damage >= 2 && n > 2)
                    c[at] = saved;
            }
        }
        free(d);
    }

    /* A stream whose last input comes before its last output: all of it
     * given at once, `in` is never asked (it would fail). */
    unsigned char *zeros = calloc(1, 200000);
    size_t n;
    for (size_t len = 32768 - 600; len < 200000; len += len < 33500 ? 1 : 9973) {
        for (int level = 1; level <= 9; level += 8) {
            n = ref_deflate(level, -15, zeros, len, c, cap);
            struct back_run a = back_run(0, 15, c, n, n, 0, 0, o1, cap);
            CHECK(a.ret == Z_STREAM_END && a.io.in_calls == 0 && a.io.out_len == len);
            CHECK(a.left == 0 && a.left_at == (long)n);
        }
    }

    /* One stream after another on the same state, as pigz decodes gzip
     * members, the last through a copy of the stream; a smaller window
     * (left to the system zlib) refuses a distance past it as zlib does. */
    static unsigned char window[1 << 15];
    z_stream s;
    memset(&s, 0, sizeof s);
    CHECK(inflateBackInit(&s, 15, window) == Z_OK);
    for (int k = 0; k < 3; k++) {
        unsigned char *d = make_data(50000, (unsigned)k);
        n = ref_deflate(1 + k, -15, d, 50000, c, cap);
        struct back_io io = {.in = c, .len = n, .piece = 1000, .out = o1, .out_cap = cap};
        s.next_in = Z_NULL;
        s.avail_in = 0;
        /* The last through a copy of the z_stream, which shares the state
         * (as with zlib). */
        z_stream t = s;
        CHECK(inflateBack(k < 2 ? &s : &t, back_in, &io, back_out, &io) == Z_STREAM_END);
        CHECK(io.out_len == 50000 && memcmp(o1, d, 50000) == 0);
        free(d);
    }
    CHECK(inflateBackEnd(&s) == Z_OK);
    unsigned char *d = make_data(100000, 9);
    n = ref_deflate(6, -15, d, 100000, c, cap);
    free(d);
    struct back_run small = back_run(0, 10, c, n, n, 0, 0, o1, cap);
    struct back_run small_ref = back_run(1, 10, c, n, n, 0, 0, o2, cap);
    CHECK(small.ret == Z_DATA_ERROR && small_ref.ret == Z_DATA_ERROR);
    CHECK(same_msg(small.msg, small_ref.msg) && small.io.out_len == small_ref.io.out_len);

    /* zlib's refusals. */
    memset(&s, 0, sizeof s);
    CHECK(inflateBackInit_(&s, 15, window, "0.9", (int)sizeof s) == Z_VERSION_ERROR);
    CHECK(inflateBackInit_(&s, 15, window, ZLIB_VERSION, (int)sizeof s - 8) == Z_VERSION_ERROR);
    CHECK(inflateBackInit(&s, 15, Z_NULL) == Z_STREAM_ERROR);
    CHECK(inflateBackInit(&s, 16, window) == Z_STREAM_ERROR);
    CHECK(inflateBackInit((z_streamp)Z_NULL, 15, window) == Z_STREAM_ERROR);
    CHECK(inflateBackInit(&s, 15, window) == Z_OK);
    CHECK(inflateBack(&s, NULL, NULL, back_out, NULL) == Z_STREAM_ERROR);
    CHECK(inflateBackEnd(&s) == Z_OK);
    CHECK(inflateBackEnd((z_streamp)Z_NULL) == Z_STREAM_ERROR);
    free(zeros);
    free(c);
    free(o1);
    free(o2);
}

/* The gz* functions are zlib's, but their deflate and inflate calls reach
 * the shim (through the system zlib's PLT): files written with flushes,
 * a level change, appended members and a seek decode with the reference
 * zlib, read back with seeks, a rewind and gzungetc, and a damaged file
 * fails. */
static void gz_files(void)
{
    char path[] = "/tmp/wdz-test-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    size_t n = 500000;
    unsigned char *d = make_data(n, 9), *back = malloc(2 * n + 64);
    gzFile g = gzdopen(fd, "wb6");
    CHECK(g != NULL);
    CHECK(gzwrite(g, d, 100000) == 100000);
    CHECK(gzflush(g, Z_SYNC_FLUSH) == Z_OK);
    CHECK(gzsetparams(g, 1, Z_DEFAULT_STRATEGY) == Z_OK);
    CHECK(gzwrite(g, d + 100000, (unsigned)n - 100000) == (int)n - 100000);
    CHECK(gzprintf(g, "%s %d\n", "tail", 42) > 0);
    CHECK(gzclose(g) == Z_OK);
    /* A second member, appended. */
    g = gzopen(path, "ab");
    CHECK(g != NULL);
    CHECK(gzwrite(g, d, 1000) == 1000);
    CHECK(gzclose(g) == Z_OK);

    /* The first member decodes with the reference zlib. */
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    unsigned char *file = malloc(2 * n);
    size_t flen = fread(file, 1, 2 * n, f);
    fclose(f);
    CHECK(ref_inflate(31, file, flen, back, 2 * n) == n + 8);
    CHECK(memcmp(back, d, n) == 0 && memcmp(back + n, "tail 42\n", 8) == 0);

    g = gzopen(path, "rb");
    CHECK(g != NULL);
    CHECK(gzread(g, back, (unsigned)n) == (int)n && memcmp(back, d, n) == 0);
    char line[32];
    CHECK(gzgets(g, line, sizeof line) != NULL && strcmp(line, "tail 42\n") == 0);
    CHECK(gzread(g, back, 2000) == 1000 && memcmp(back, d, 1000) == 0); /* both members */
    CHECK(gzeof(g));
    CHECK(gzseek(g, 12345, SEEK_SET) == 12345); /* back: a rewind and a skip */
    CHECK(gzgetc(g) == d[12345]);
    CHECK(gzungetc('Q', g) == 'Q' && gzgetc(g) == 'Q');
    CHECK(gzread(g, back, 100) == 100 && memcmp(back, d + 12346, 100) == 0);
    CHECK(gzrewind(g) == 0);
    CHECK(gzread(g, back, 64) == 64 && memcmp(back, d, 64) == 0);
    CHECK(gzclose(g) == Z_OK);

    /* Damaged in the middle: a read fails, and says why. */
    file[flen / 3] ^= 0xff;
    file[flen / 3 + 1] ^= 0x55;
    f = fopen(path, "wb");
    CHECK(f != NULL && fwrite(file, 1, flen, f) == flen);
    fclose(f);
    g = gzopen(path, "rb");
    CHECK(g != NULL);
    int got, total = 0;
    while ((got = gzread(g, back, 65536)) > 0)
        total += got;
    int err;
    const char *msg = gzerror(g, &err);
    CHECK(got < 0 && err == Z_DATA_ERROR && msg && *msg);
    CHECK(total < (int)n);
    gzclose(g);
    unlink(path);
    free(file);
    free(d);
    free(back);
}

int main(void)
{
    if (!getenv("LD_PRELOAD") || !strstr(getenv("LD_PRELOAD"), "libwdz")) {
        printf("SKIP: run with LD_PRELOAD=libwdz.so\n");
        return 77;
    }
    load_reference();
    CHECK(strcmp(zlibVersion(), ZLIB_VERSION) == 0);
    one_shot();
    reopened_without_end();
    uncompress_huge_room();
    deflate_framings();
    deflate_gathered();
    deflate_in_pieces();
    deflate_flushed_in_pieces();
    params_after_pieces();
    piece_fails();
    flush_hands_over_full();
    deflate_error_messages();
    calls_after_finish();
    inflate_framings();
    zlib_streams();
    inflate_in_pieces();
    inflate_bounded();
    inflate_whole_as_zlib();
    inflate_before_first_call();
    small_streams();
    small_streams_mixed();
    small_deflates();
    threads();
    fork_while_busy();
    zlib_at_thread_exit();
    held_params_and_dictionary();
    inflate_back();
    gz_files();
    printf("test_wdz: ok\n");
    return 0;
}
