/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The drop-in zlib at its edges: each case runs the same call sequence on
 * the shim (this program's own zlib calls, LD_PRELOAD=libwdz.so) and on
 * a pristine system zlib loaded with dlmopen, and compares what zlib
 * documents. Every failing case is printed; exit 1 if any failed.
 *
 *   cc -std=gnu11 -O1 -g -Wall -Wextra -Iinclude tests/c/test_wdz_edges.c -lz -ldl \
 *      -o target/test_wdz_edges
 *   LD_PRELOAD=$PWD/target/release/libwdz.so target/test_wdz_edges [case]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static int failures;
#define EXPECT(cond, ...)                                                                \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            failures++;                                                                  \
            fprintf(stderr, "FAIL %s:%d [%s]: %s: ", __FILE__, __LINE__, __func__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
        }                                                                                \
    } while (0)

static struct {
    int (*deflateInit2_)(z_streamp, int, int, int, int, int, const char *, int);
    int (*deflate)(z_streamp, int);
    int (*deflateEnd)(z_streamp);
    int (*deflateParams)(z_streamp, int, int);
    uLong (*deflateBound)(z_streamp, uLong);
    int (*inflateInit2_)(z_streamp, int, const char *, int);
    int (*inflate)(z_streamp, int);
    int (*inflateEnd)(z_streamp);
    int (*deflateSetDictionary)(z_streamp, const Bytef *, uInt);
    int (*deflateTune)(z_streamp, int, int, int, int);
    int (*inflateSetDictionary)(z_streamp, const Bytef *, uInt);
    gzFile (*gzopen)(const char *, const char *);
    int (*gzwrite)(gzFile, voidpc, unsigned);
    int (*gzflush)(gzFile, int);
    z_off_t (*gzoffset)(gzFile);
    int (*gzclose)(gzFile);
} ref;

static void load_reference(void)
{
    void *h = dlmopen(LM_ID_NEWLM, "libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "cannot load a reference zlib: %s\n", dlerror());
        exit(2);
    }
#define SYM(n)                                                                           \
    if (!(*(void **)&ref.n = dlsym(h, #n)))                                              \
        exit(2);
    SYM(deflateInit2_);
    SYM(deflate);
    SYM(deflateEnd);
    SYM(deflateParams);
    SYM(deflateBound);
    SYM(inflateInit2_);
    SYM(inflate);
    SYM(inflateEnd);
    SYM(deflateSetDictionary);
    SYM(deflateTune);
    SYM(inflateSetDictionary);
    SYM(gzopen);
    SYM(gzwrite);
    SYM(gzflush);
    SYM(gzoffset);
    SYM(gzclose);
#undef SYM
}

static void random_bytes(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 7;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)(x >> 11);
    }
}

/* Text-like data. */
static void text_bytes(unsigned char *p, size_t n, uint32_t seed)
{
    static const char *w[] = {"alpha ", "beta ", "gamma ", "delta\n", "epsilon ", "zeta "};
    uint32_t x = seed * 2654435761u + 1;
    size_t at = 0;
    while (at < n) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        const char *s = w[x % 6];
        for (; *s && at < n; s++)
            p[at++] = (unsigned char)*s;
    }
}

/* `n` bytes of `in` compressed whole by the reference zlib (level,
 * windowBits) into `out`; its length. The reference failing ends the run
 * (exit 2: the test cannot be made). */
static size_t ref_compress(int level, int bits, const unsigned char *in, size_t n,
                           unsigned char *out, size_t cap)
{
    z_stream d;
    memset(&d, 0, sizeof d);
    if (ref.deflateInit2_(&d, level, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                          (int)sizeof d) != Z_OK)
        exit(2);
    d.next_in = (unsigned char *)in;
    d.avail_in = (uInt)n;
    d.next_out = out;
    d.avail_out = (uInt)cap;
    if (ref.deflate(&d, Z_FINISH) != Z_STREAM_END)
        exit(2);
    size_t len = d.total_out;
    ref.deflateEnd(&d);
    return len;
}

/* deflateBound() is zlib's promise that a buffer of that size takes the
 * whole stream in one deflate(Z_FINISH) call ("used to allocate an
 * output buffer for deflation in a single pass"). For a gzip stream
 * (windowBits 31) the shim answers zlib's bound for an unknown stream,
 * which counts a 6-byte zlib wrapper, not gzip's 18 bytes: incompressible
 * input of up to ~100 bytes does not fit, and deflate returns Z_OK. */
static void gzip_deflate_bound_single_pass(void)
{
    static const size_t sizes[] = {0, 1, 10, 50, 100};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i];
        unsigned char in[128], out[512], rout[512];
        random_bytes(in, n, (uint32_t)n + 1);
        z_stream s, r;
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        if (deflateInit2(&s, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) != Z_OK ||
            ref.deflateInit2_(&r, 6, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                              (int)sizeof r) != Z_OK)
            exit(2);
        uLong bound = deflateBound(&s, n), rbound = ref.deflateBound(&r, n);
        s.next_in = in;
        s.avail_in = (uInt)n;
        s.next_out = out;
        s.avail_out = (uInt)bound;
        r.next_in = in;
        r.avail_in = (uInt)n;
        r.next_out = rout;
        r.avail_out = (uInt)rbound;
        int ret = deflate(&s, Z_FINISH), rret = ref.deflate(&r, Z_FINISH);
        EXPECT(ret == Z_STREAM_END && rret == Z_STREAM_END,
               "n=%zu: shim deflateBound %lu, deflate(Z_FINISH) -> %d (total_out %lu); "
               "zlib deflateBound %lu, deflate -> %d (total_out %lu)",
               n, bound, ret, s.total_out, rbound, rret, r.total_out);
        deflateEnd(&s);
        ref.deflateEnd(&r);
    }
}

/* A gzip member whose header CRC (FHCRC) is wrong: zlib refuses it
 * ("header crc mismatch", Z_DATA_ERROR); through the shim, a member of
 * 128 compressed bytes or more goes whole to libdeflate, which skips
 * the header CRC without checking it, and decodes. */
static void gzip_header_crc_checked(void)
{
    enum { N = 4000 };
    static unsigned char data[N], raw[N + 64], gz[N + 128], out[N + 64];
    random_bytes(data, 300, 5);
    text_bytes(data + 300, N - 300, 9);
    /* raw deflate of the data with the reference */
    size_t rawlen = ref_compress(6, -15, data, N, raw, sizeof raw);
    /* header: ID1 ID2 CM FLG(FHCRC) MTIME(4) XFL OS, then a wrong CRC16 */
    size_t at = 0;
    const unsigned char hdr[10] = {0x1f, 0x8b, 8, 0x02, 0, 0, 0, 0, 0, 3};
    memcpy(gz, hdr, 10);
    at = 10;
    uLong hc = crc32(0, hdr, 10) & 0xffff;
    hc ^= 0x5a5a; /* wrong */
    gz[at++] = (unsigned char)hc;
    gz[at++] = (unsigned char)(hc >> 8);
    memcpy(gz + at, raw, rawlen);
    at += rawlen;
    uLong c = crc32(0, data, N);
    for (int i = 0; i < 4; i++)
        gz[at++] = (unsigned char)(c >> (8 * i));
    for (int i = 0; i < 4; i++)
        gz[at++] = (unsigned char)((uLong)N >> (8 * i));
    static const int wbits[] = {31, 47};
    for (int k = 0; k < 2; k++) {
        z_stream s, r;
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        if (inflateInit2(&s, wbits[k]) != Z_OK ||
            ref.inflateInit2_(&r, wbits[k], ZLIB_VERSION, (int)sizeof r) != Z_OK)
            exit(2);
        s.next_in = gz;
        s.avail_in = (uInt)at;
        s.next_out = out;
        s.avail_out = sizeof out;
        r.next_in = gz;
        r.avail_in = (uInt)at;
        r.next_out = out;
        r.avail_out = sizeof out;
        int ret = inflate(&s, Z_FINISH);
        const char *msg = s.msg ? s.msg : "(null)";
        int rret = ref.inflate(&r, Z_FINISH);
        const char *rmsg = r.msg ? r.msg : "(null)";
        EXPECT(ret == rret && strcmp(msg, rmsg) == 0,
               "windowBits %d, %zu-byte member with a wrong header CRC: shim %d \"%s\" "
               "(total_out %lu), zlib %d \"%s\"",
               wbits[k], at, ret, msg, s.total_out, rret, rmsg);
        inflateEnd(&s);
        ref.inflateEnd(&r);
    }
}

/* deflateParams changing the level within zlib's same compression
 * function (6 -> 7: both deflate_slow) owes no flush: zlib answers Z_OK
 * whatever the output room. After input the shim gathered (Z_NO_FLUSH),
 * a call with avail_out 0 made the shim hand the stream to zlib with the
 * header left waiting, and answer Z_BUF_ERROR. */
static void params_same_function_no_room(void)
{
    static unsigned char in[2000], out[4096], rout[4096];
    text_bytes(in, sizeof in, 3);
    z_stream s, r;
    memset(&s, 0, sizeof s);
    memset(&r, 0, sizeof r);
    if (deflateInit2(&s, 6, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY) != Z_OK ||
        ref.deflateInit2_(&r, 6, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                          (int)sizeof r) != Z_OK)
        exit(2);
    s.next_in = in;
    s.avail_in = sizeof in;
    s.next_out = out;
    s.avail_out = 100;
    r.next_in = in;
    r.avail_in = sizeof in;
    r.next_out = rout;
    r.avail_out = 100;
    int ret = deflate(&s, Z_NO_FLUSH), rret = ref.deflate(&r, Z_NO_FLUSH);
    EXPECT(ret == rret, "deflate(Z_NO_FLUSH): shim %d, zlib %d", ret, rret);
    s.avail_out = 0;
    r.avail_out = 0;
    ret = deflateParams(&s, 7, Z_DEFAULT_STRATEGY);
    rret = ref.deflateParams(&r, 7, Z_DEFAULT_STRATEGY);
    EXPECT(ret == rret, "deflateParams(7) with avail_out 0: shim %d, zlib %d", ret, rret);
    deflateEnd(&s);
    ref.deflateEnd(&r);
}


/* gzread of a small gzip file (compressed under gzread's 8 KiB input
 * buffer, decoded larger than its 16 KiB output buffer), read in small
 * pieces: zlib's gz_decomp asks for more input whenever inflate has
 * none left, and at end of file calls that "unexpected end of file".
 * The shim's whole path takes all the input (trailer included) at the
 * first call and keeps the output that did not fit: gzread then finds
 * no input, at EOF, while output still waits. */
static void gzread_small_file_in_pieces(void)
{
    enum { N = 200000 };
    static unsigned char data[N], gz[N], back[N + 100];
    for (size_t i = 0; i < N; i++) /* compresses to about 1 KiB */
        data[i] = (unsigned char)("0123456789abcdefghij\n"[i % 21] + (i % 4093 == 0));
    size_t glen = ref_compress(9, 31, data, N, gz, sizeof gz);
    char path[] = "/tmp/wdz-edges-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, gz, glen) != (ssize_t)glen)
        exit(2);
    close(fd);
    /* read 100 bytes at a time, then with one call of a large buffer */
    static const unsigned pieces[] = {100, sizeof back};
    for (int k = 0; k < 2; k++) {
        gzFile g = gzopen(path, "rb");
        if (!g)
            exit(2);
        size_t total = 0;
        int got = -1;
        while (total < sizeof back &&
               (got = gzread(g, back + total,
                             (unsigned)(sizeof back - total < pieces[k] ? sizeof back - total
                                                                         : pieces[k]))) > 0)
            total += (size_t)got;
        int err = 0;
        const char *msg = gzerror(g, &err);
        EXPECT(got == 0 && total == N && memcmp(back, data, N) == 0,
               "%zu-byte gzip file of %d bytes, gzread(%u) until it returns 0: %zu bytes, "
               "last gzread %d, gzerror %d \"%s\" (stock zlib: all %d bytes)",
               glen, N, pieces[k], total, got, err, msg ? msg : "(null)", N);
        gzclose(g);
    }
    unlink(path);
}

/* deflate() sets strm->data_type (Z_TEXT or Z_BINARY) from the data it
 * compressed (zlib.h: "deflate() may update strm->data_type if it can
 * make a good guess"; zlib always does once a block is written, and zip
 * writers copy it into the archive's text flag). A stream the shim
 * compressed whole with libdeflate (128 bytes or more) keeps Z_UNKNOWN. */
static void deflate_data_type(void)
{
    enum { N = 3000 };
    static unsigned char data[N], out[N + 200], rout[N + 200];
    text_bytes(data, N, 4);
    z_stream s, r;
    memset(&s, 0, sizeof s);
    memset(&r, 0, sizeof r);
    if (deflateInit(&s, 6) != Z_OK ||
        ref.deflateInit2_(&r, 6, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                          (int)sizeof r) != Z_OK)
        exit(2);
    s.next_in = data;
    s.avail_in = N;
    s.next_out = out;
    s.avail_out = sizeof out;
    r.next_in = data;
    r.avail_in = N;
    r.next_out = rout;
    r.avail_out = sizeof rout;
    int ret = deflate(&s, Z_FINISH), rret = ref.deflate(&r, Z_FINISH);
    EXPECT(ret == rret && s.data_type == r.data_type,
           "deflate(Z_FINISH) of %d bytes of text: shim %d data_type %d, zlib %d data_type %d",
           N, ret, s.data_type, rret, r.data_type);
    deflateEnd(&s);
    ref.deflateEnd(&r);
}

/* zlib refuses a dictionary for a zlib-framed stream once deflate() has
 * been called (its header is written): Z_STREAM_ERROR. After a first
 * deflate(Z_NO_FLUSH) call with no input, the shim accepts it. */
static void set_dictionary_after_first_deflate(void)
{
    static unsigned char out[256], rout[256];
    static const unsigned char dict[] = "a dictionary of some words";
    z_stream s, r;
    memset(&s, 0, sizeof s);
    memset(&r, 0, sizeof r);
    if (deflateInit(&s, 6) != Z_OK ||
        ref.deflateInit2_(&r, 6, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                          (int)sizeof r) != Z_OK)
        exit(2);
    s.next_in = (Bytef *)dict;
    s.avail_in = 0;
    s.next_out = out;
    s.avail_out = sizeof out;
    r.next_in = (Bytef *)dict;
    r.avail_in = 0;
    r.next_out = rout;
    r.avail_out = sizeof rout;
    int ret = deflate(&s, Z_NO_FLUSH), rret = ref.deflate(&r, Z_NO_FLUSH);
    EXPECT(ret == rret, "first deflate(Z_NO_FLUSH), no input: shim %d, zlib %d", ret, rret);
    ret = deflateSetDictionary(&s, dict, sizeof dict);
    rret = ref.deflateSetDictionary(&r, dict, sizeof dict);
    EXPECT(ret == rret, "deflateSetDictionary after it: shim %d, zlib %d", ret, rret);
    deflateEnd(&s);
    ref.deflateEnd(&r);
}

/* inflate with a window smaller than 32 KiB (windowBits 9..14, raw or
 * gzip, or 0 with a zlib header naming a small window) refuses a
 * distance past that window ("invalid distance too far back") when the
 * stream comes in pieces. The shim decodes such a stream on zlib-rs,
 * which keeps 32 KiB of history whatever the window, and accepts it.
 * (docs/compression.md keeps inflateBack with small windows off zlib-rs
 * for exactly this reason; inflate was not.) */
static int inflate_pieces_both(int wbits, const unsigned char *c, size_t clen, size_t piece,
                               char *report, size_t report_len)
{
    static unsigned char o1[65536], o2[65536];
    z_stream s, r;
    memset(&s, 0, sizeof s);
    memset(&r, 0, sizeof r);
    if (inflateInit2(&s, wbits) != Z_OK ||
        ref.inflateInit2_(&r, wbits, ZLIB_VERSION, (int)sizeof r) != Z_OK)
        exit(2);
    int x1 = Z_OK, x2 = Z_OK;
    size_t at1 = 0, at2 = 0;
    s.next_out = o1;
    s.avail_out = sizeof o1;
    r.next_out = o2;
    r.avail_out = sizeof o2;
    while (x1 == Z_OK && at1 < clen) {
        size_t k = clen - at1 < piece ? clen - at1 : piece;
        s.next_in = (Bytef *)c + at1;
        s.avail_in = (uInt)k;
        x1 = inflate(&s, Z_NO_FLUSH);
        at1 += k - s.avail_in;
    }
    while (x2 == Z_OK && at2 < clen) {
        size_t k = clen - at2 < piece ? clen - at2 : piece;
        r.next_in = (Bytef *)c + at2;
        r.avail_in = (uInt)k;
        x2 = ref.inflate(&r, Z_NO_FLUSH);
        at2 += k - r.avail_in;
    }
    snprintf(report, report_len, "shim %d \"%s\" (%lu bytes out), zlib %d \"%s\" (%lu bytes out)",
             x1, s.msg ? s.msg : "(null)", s.total_out, x2, r.msg ? r.msg : "(null)",
             r.total_out);
    int same = x1 == x2 && s.total_out == r.total_out;
    inflateEnd(&s);
    ref.inflateEnd(&r);
    return same;
}

static void small_window_inflate_in_pieces(void)
{
    enum { N = 20000 };
    static unsigned char data[N], c[N + 500];
    for (size_t i = 0; i < N; i++)
        data[i] = (unsigned char)("abcdefghij"[(i * 7 + i / 13) % 10] ^ ((i % 97) == 0));
    static const struct {
        int deflate_bits, inflate_bits;
    } cases[] = {{-15, -9}, {-15, -12}, {31, 25}, {31, 28}};
    char report[256];
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        size_t clen = ref_compress(6, cases[k].deflate_bits, data, N, c, sizeof c);
        int same = inflate_pieces_both(cases[k].inflate_bits, c, clen, 100, report, sizeof report);
        EXPECT(same, "written with windowBits %d, inflated with %d in 100-byte pieces: %s",
               cases[k].deflate_bits, cases[k].inflate_bits, report);
    }
    /* windowBits 0: the zlib header's window (here 4 KiB, CINFO 4, on a
     * stream written with 32 KiB). */
    size_t clen = ref_compress(6, 15, data, N, c, sizeof c);
    c[0] = 0x48; /* CM 8, CINFO 4 */
    c[1] = (unsigned char)(c[1] & 0xe0);
    c[1] = (unsigned char)(c[1] + (31 - (c[0] * 256 + c[1]) % 31) % 31);
    int same = inflate_pieces_both(0, c, clen, 100, report, sizeof report);
    EXPECT(same, "zlib header naming a 4 KiB window, windowBits 0, 100-byte pieces: %s", report);
}

/* deflateParams on a stream the shim runs on zlib-rs (one flushed on the
 * way with 4 KiB or more): zlib flushes (Z_BLOCK) only when its
 * compression function changes (levels 1-3 deflate_fast, 4-9
 * deflate_slow) or the strategy does; zlib-rs uses zlib-ng's table (1
 * quick, 2 fast, 3-6 medium, 7-9 slow). 6 -> 9 is no change for zlib,
 * which answers Z_OK even with no output room; the shim's zlib-rs
 * flushes, and with avail_out 0 answers Z_BUF_ERROR. */
static void params_on_zlib_rs_stream(void)
{
    static unsigned char in[6000], out[16384], rout[16384];
    text_bytes(in, sizeof in, 8);
    static const int to[] = {9, 7};
    for (int k = 0; k < 2; k++) {
        z_stream s, r;
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        if (deflateInit2(&s, 6, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY) != Z_OK ||
            ref.deflateInit2_(&r, 6, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                              (int)sizeof r) != Z_OK)
            exit(2);
        /* 5000 bytes with Z_SYNC_FLUSH, then 1000 more with Z_NO_FLUSH */
        s.next_in = in;
        s.avail_in = 5000;
        s.next_out = out;
        s.avail_out = sizeof out;
        r.next_in = in;
        r.avail_in = 5000;
        r.next_out = rout;
        r.avail_out = sizeof rout;
        int ret = deflate(&s, Z_SYNC_FLUSH), rret = ref.deflate(&r, Z_SYNC_FLUSH);
        EXPECT(ret == rret, "deflate(Z_SYNC_FLUSH): shim %d, zlib %d", ret, rret);
        s.avail_in = 1000;
        r.avail_in = 1000;
        ret = deflate(&s, Z_NO_FLUSH);
        rret = ref.deflate(&r, Z_NO_FLUSH);
        EXPECT(ret == rret, "deflate(Z_NO_FLUSH): shim %d, zlib %d", ret, rret);
        s.avail_out = 0;
        r.avail_out = 0;
        ret = deflateParams(&s, to[k], Z_DEFAULT_STRATEGY);
        rret = ref.deflateParams(&r, to[k], Z_DEFAULT_STRATEGY);
        EXPECT(ret == rret, "deflateParams(6 -> %d) with avail_out 0: shim %d, zlib %d", to[k],
               ret, rret);
        deflateEnd(&s);
        ref.deflateEnd(&r);
    }
}

/* zlib answers a flush asked again with no new input and nothing
 * pending Z_BUF_ERROR (no progress possible; zlib.h: "Z_BUF_ERROR if no
 * progress was possible"). A stream in pieces (a flush of 64 KiB or
 * more) that a call hands to zlib-rs (here deflateTune) forgets its last
 * flush: the same flush again is Z_OK, and writes another empty block. */
static void repeated_flush_after_handoff(void)
{
    enum { N = 100000 };
    static unsigned char in[N], out[N + 1000], rout[N + 1000];
    text_bytes(in, N, 12);
    z_stream s, r;
    memset(&s, 0, sizeof s);
    memset(&r, 0, sizeof r);
    if (deflateInit2(&s, 6, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY) != Z_OK ||
        ref.deflateInit2_(&r, 6, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                          (int)sizeof r) != Z_OK)
        exit(2);
    s.next_in = in;
    s.avail_in = N;
    s.next_out = out;
    s.avail_out = sizeof out;
    r.next_in = in;
    r.avail_in = N;
    r.next_out = rout;
    r.avail_out = sizeof rout;
    int ret = deflate(&s, Z_SYNC_FLUSH), rret = ref.deflate(&r, Z_SYNC_FLUSH);
    EXPECT(ret == rret, "deflate(Z_SYNC_FLUSH) of %d bytes: shim %d, zlib %d", N, ret, rret);
    ret = deflateTune(&s, 8, 16, 128, 128);
    rret = ref.deflateTune(&r, 8, 16, 128, 128);
    EXPECT(ret == rret, "deflateTune: shim %d, zlib %d", ret, rret);
    uLong before = s.total_out;
    ret = deflate(&s, Z_SYNC_FLUSH);
    rret = ref.deflate(&r, Z_SYNC_FLUSH);
    EXPECT(ret == rret, "Z_SYNC_FLUSH again, no input: shim %d (%lu bytes written), zlib %d", ret,
           s.total_out - before, rret);
    deflateEnd(&s);
    ref.deflateEnd(&r);
}


/* The reference's decoding of a whole stream into out: its length, or
 * (size_t)-1 when it does not end there. */
static size_t ref_decode(int bits, const unsigned char *c, size_t clen, unsigned char *out,
                         size_t cap)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (ref.inflateInit2_(&z, bits, ZLIB_VERSION, (int)sizeof z) != Z_OK)
        exit(2);
    z.next_in = (Bytef *)c;
    z.avail_in = (uInt)clen;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int ret = ref.inflate(&z, Z_FINISH);
    size_t n = z.total_out;
    ref.inflateEnd(&z);
    return ret == Z_STREAM_END ? n : (size_t)-1;
}

/* deflateParams from a level to one of another compression function (0
 * stored, 1-3 fast, 4-9 slow) flushes with Z_BLOCK first, and when that
 * cannot complete answers Z_BUF_ERROR and keeps the old level (zlib.h:
 * "can be called again with the same parameters and more output
 * space"). On a stream the shim ran on zlib-rs, whose table splits the
 * levels otherwise (3 to 6 is one function there), 3 to 4, 5 or 6 and
 * back answered Z_OK with no room; on a stream in pieces, or one handed
 * over with output waiting in the shim (here by deflateTune, which
 * itself answered Z_BUF_ERROR), a change that owes no flush answered
 * Z_BUF_ERROR. Every pair of levels, on streams gathered (no output
 * yet), on zlib-rs, in pieces and handed over, in zlib and raw framing:
 * with no room, then with room; then the stream is finished and the
 * reference decodes it. */
static void params_function_change_no_room(void)
{
    enum { N = 80000, CAP = N + 4096 };
    static unsigned char in[N], out[CAP], rout[CAP], back[N];
    text_bytes(in, N, 21);
    static const struct {
        const char *what;
        size_t flushed, more; /* Z_SYNC_FLUSH'd, then Z_NO_FLUSH'd */
        int tune;             /* then deflateTune, with no room */
    } stages[] = {{"gathered", 0, 2000, 0},
                  {"on zlib-rs", 5000, 1000, 0},
                  {"in pieces", 70000, 1000, 0},
                  {"gathered, handed over by deflateTune", 0, 2000, 1},
                  {"gathered, handed over by deflateTune", 0, 5000, 1}};
    static const int wbits[] = {15, -15};
    for (size_t st = 0; st < sizeof stages / sizeof *stages; st++)
        for (int w = 0; w < 2; w++)
            for (int from = 0; from <= 9; from++)
                for (int to = 0; to <= 9; to++) {
                    z_stream s, r;
                    memset(&s, 0, sizeof s);
                    memset(&r, 0, sizeof r);
                    if (deflateInit2(&s, from, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY) !=
                            Z_OK ||
                        ref.deflateInit2_(&r, from, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY,
                                          ZLIB_VERSION, (int)sizeof r) != Z_OK)
                        exit(2);
                    s.next_in = r.next_in = in;
                    s.next_out = out;
                    r.next_out = rout;
                    s.avail_out = r.avail_out = CAP;
                    int ret, rret;
                    if (stages[st].flushed) {
                        s.avail_in = r.avail_in = (uInt)stages[st].flushed;
                        ret = deflate(&s, Z_SYNC_FLUSH);
                        rret = ref.deflate(&r, Z_SYNC_FLUSH);
                        EXPECT(ret == rret, "Z_SYNC_FLUSH: shim %d, zlib %d", ret, rret);
                    }
                    s.avail_in = r.avail_in = (uInt)stages[st].more;
                    ret = deflate(&s, Z_NO_FLUSH);
                    rret = ref.deflate(&r, Z_NO_FLUSH);
                    EXPECT(ret == rret, "Z_NO_FLUSH: shim %d, zlib %d", ret, rret);
                    s.avail_out = r.avail_out = 0;
                    if (stages[st].tune) {
                        ret = deflateTune(&s, 8, 16, 128, 128);
                        rret = ref.deflateTune(&r, 8, 16, 128, 128);
                        EXPECT(ret == rret, "%s, windowBits %d, level %d: shim %d, zlib %d",
                               stages[st].what, wbits[w], from, ret, rret);
                    }
                    ret = deflateParams(&s, to, Z_DEFAULT_STRATEGY);
                    rret = ref.deflateParams(&r, to, Z_DEFAULT_STRATEGY);
                    EXPECT(ret == rret,
                           "%s, windowBits %d: deflateParams(%d -> %d) with avail_out 0: "
                           "shim %d, zlib %d",
                           stages[st].what, wbits[w], from, to, ret, rret);
                    s.avail_out = (uInt)(CAP - s.total_out);
                    r.avail_out = (uInt)(CAP - r.total_out);
                    ret = deflateParams(&s, to, Z_DEFAULT_STRATEGY);
                    rret = ref.deflateParams(&r, to, Z_DEFAULT_STRATEGY);
                    EXPECT(ret == rret,
                           "%s, windowBits %d: deflateParams(%d -> %d) again with room: "
                           "shim %d, zlib %d",
                           stages[st].what, wbits[w], from, to, ret, rret);
                    size_t taken = stages[st].flushed + stages[st].more;
                    s.avail_in = (uInt)(N - taken);
                    while ((ret = deflate(&s, Z_FINISH)) == Z_OK)
                        ;
                    size_t n = ret == Z_STREAM_END
                                   ? ref_decode(wbits[w], out, s.total_out, back, sizeof back)
                                   : (size_t)-1;
                    EXPECT(n == N && memcmp(back, in, N) == 0,
                           "%s, windowBits %d, %d -> %d: deflate(Z_FINISH) %d, %lu bytes; "
                           "zlib decodes %zd of %d bytes",
                           stages[st].what, wbits[w], from, to, ret, s.total_out, (ssize_t)n,
                           N);
                    deflateEnd(&s);
                    ref.deflateEnd(&r);
                }
}

/* A flush with a few bytes of room, after input the shim gathered (no
 * output yet): the gathered input goes to zlib, whose first bytes fill
 * the room. That is progress, zlib's Z_OK; the shim answered
 * Z_BUF_ERROR because the rest found no room. Every flush mode and room
 * from 1 to 3 bytes, in zlib and raw framing; then the stream is finished
 * and the reference decodes it. */
static void flush_with_little_room(void)
{
    enum { N = 1000, CAP = 4096 };
    static unsigned char in[N], out[CAP], rout[CAP], back[N];
    text_bytes(in, N, 5);
    static const int flushes[] = {Z_PARTIAL_FLUSH, Z_SYNC_FLUSH, Z_FULL_FLUSH, Z_BLOCK, Z_FINISH};
    static const int wbits[] = {15, -15};
    for (int w = 0; w < 2; w++)
        for (size_t f = 0; f < sizeof flushes / sizeof *flushes; f++)
            for (uInt room = 1; room <= 3; room++) {
                z_stream s, r;
                memset(&s, 0, sizeof s);
                memset(&r, 0, sizeof r);
                if (deflateInit2(&s, 1, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY) != Z_OK ||
                    ref.deflateInit2_(&r, 1, Z_DEFLATED, wbits[w], 8, Z_DEFAULT_STRATEGY,
                                      ZLIB_VERSION, (int)sizeof r) != Z_OK)
                    exit(2);
                s.next_in = r.next_in = in;
                s.avail_in = r.avail_in = N;
                s.next_out = out;
                r.next_out = rout;
                s.avail_out = r.avail_out = CAP;
                int ret = deflate(&s, Z_NO_FLUSH), rret = ref.deflate(&r, Z_NO_FLUSH);
                EXPECT(ret == rret, "Z_NO_FLUSH: shim %d, zlib %d", ret, rret);
                s.avail_out = r.avail_out = room;
                ret = deflate(&s, flushes[f]);
                rret = ref.deflate(&r, flushes[f]);
                EXPECT(ret == rret, "windowBits %d: deflate(%d) with %u bytes of room: shim %d, zlib %d",
                       wbits[w], flushes[f], room, ret, rret);
                s.avail_out = (uInt)(CAP - s.total_out);
                while ((ret = deflate(&s, Z_FINISH)) == Z_OK)
                    ;
                size_t n = ret == Z_STREAM_END
                               ? ref_decode(wbits[w], out, s.total_out, back, sizeof back)
                               : (size_t)-1;
                EXPECT(n == N && memcmp(back, in, N) == 0,
                       "windowBits %d, flush %d, room %u: deflate(Z_FINISH) %d; zlib decodes %zd of %d bytes",
                       wbits[w], flushes[f], room, ret, (ssize_t)n, N);
                deflateEnd(&s);
                ref.deflateEnd(&r);
            }
}

/* inflate returns Z_NEED_DICT from inside its state machine, without the
 * accounting a call ends with: the header it read leaves next_in and
 * avail_in but is not added to total_in (zlib 1.2.13 and later alike),
 * and data_type stays. On zlib-rs, which the shim decodes such a stream
 * with (libdeflate declines it), total_in counted the 6 bytes. Then the
 * rest, compared call by call. */
static void need_dict_total_in(void)
{
    enum { N = 20000 };
    static unsigned char data[N], c[N + 200], o1[N], o2[N];
    static const char dict[] = "alpha beta gamma delta epsilon zeta, a dictionary of words";
    text_bytes(data, N, 31);
    z_stream d;
    memset(&d, 0, sizeof d);
    if (ref.deflateInit2_(&d, 6, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                          (int)sizeof d) != Z_OK ||
        ref.deflateSetDictionary(&d, (const Bytef *)dict, sizeof dict) != Z_OK)
        exit(2);
    d.next_in = data;
    d.avail_in = N;
    d.next_out = c;
    d.avail_out = sizeof c;
    if (ref.deflate(&d, Z_FINISH) != Z_STREAM_END)
        exit(2);
    size_t clen = d.total_out;
    ref.deflateEnd(&d);
    /* the whole stream at once, and in 100-byte pieces */
    static const size_t pieces[] = {N + 200, 100};
    for (int k = 0; k < 2; k++) {
        z_stream s, r;
        memset(&s, 0, sizeof s);
        memset(&r, 0, sizeof r);
        if (inflateInit(&s) != Z_OK ||
            ref.inflateInit2_(&r, 15, ZLIB_VERSION, (int)sizeof r) != Z_OK)
            exit(2);
        s.data_type = r.data_type = 12345; /* (what inflate leaves it) */
        s.next_out = o1;
        r.next_out = o2;
        s.avail_out = r.avail_out = N;
        size_t at = 0;
        int ret = Z_OK, rret = Z_OK, calls = 0;
        while (ret == rret && (ret == Z_OK || ret == Z_NEED_DICT) && calls++ < 1000) {
            if (ret == Z_NEED_DICT) {
                ret = inflateSetDictionary(&s, (const Bytef *)dict, sizeof dict);
                rret = ref.inflateSetDictionary(&r, (const Bytef *)dict, sizeof dict);
                EXPECT(ret == rret, "inflateSetDictionary: shim %d, zlib %d", ret, rret);
            }
            size_t piece = clen - at < pieces[k] ? clen - at : pieces[k];
            s.next_in = r.next_in = c + at;
            s.avail_in = r.avail_in = (uInt)piece;
            ret = inflate(&s, Z_NO_FLUSH);
            rret = ref.inflate(&r, Z_NO_FLUSH);
            at += piece - r.avail_in;
            /* (adler between Z_NEED_DICT and the end: zlib-rs updates it
             * later than zlib, a documented difference) */
            int same = ret == rret && s.avail_in == r.avail_in && s.total_in == r.total_in &&
                       s.total_out == r.total_out &&
                       (ret != Z_NEED_DICT || (s.adler == r.adler && s.data_type == r.data_type));
            EXPECT(same,
                   "%zu-byte pieces, call %d: shim %d (avail_in %u, total_in %lu, total_out "
                   "%lu, adler %08lx, data_type %d), zlib %d (%u, %lu, %lu, %08lx, %d)",
                   pieces[k], calls, ret, s.avail_in, s.total_in, s.total_out, s.adler,
                   s.data_type, rret, r.avail_in, r.total_in, r.total_out, r.adler,
                   r.data_type);
            if (!same)
                break;
        }
        EXPECT(ret == Z_STREAM_END && rret == Z_STREAM_END && memcmp(o1, data, N) == 0,
               "%zu-byte pieces: shim %d, zlib %d at the end", pieces[k], ret, rret);
        inflateEnd(&s);
        ref.inflateEnd(&r);
    }
}


/* The heap this process holds (malloc's arenas in use and its mmapped
 * blocks). */
static size_t heap_held(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

/* zlib's streams hold nothing once ended: memory a large stream took
 * goes back with inflateEnd/deflateEnd. The shim decodes a whole stream
 * that does not fit the caller's room into a scratch buffer of the
 * thread's (up to 256 MiB: 16 times the input), and compresses such a
 * stream likewise; the thread kept it, at its largest, after the stream
 * ended. One large stream each way, output taken 16 KiB at a time as
 * python takes it, after small ones: the heap held after each, against
 * before it, stays within what the shim keeps for small streams (2 MiB,
 * and half a MiB for the rest of the process). */
static void scratch_released_after_large_streams(void)
{
    enum { N = 8 << 20, ROOM = 16384 };
    const size_t slack = (size_t)5 << 19;
    unsigned char *data = malloc(N), *c = malloc(N + N / 8), *back = malloc(N),
                  *z = malloc(N);
    if (!data || !c || !back || !z)
        exit(2);
    random_bytes(data, N, 77);
    for (size_t i = 0; i < N; i++) /* about 4 bits a byte: compresses to half */
        data[i] &= 0x0f;
    size_t clen = ref_compress(1, 15, data, N, c, N + N / 8);
    /* A small stream each way first: the thread's compressor and kept
     * buffers exist before the measure. */
    static unsigned char small_c[70000], small_out[ROOM];
    uLongf small_len = sizeof small_c;
    if (compress2(small_c, &small_len, data, 65536, 1) != Z_OK)
        exit(2);
    for (int dir = 0; dir < 2; dir++) {
        z_stream s;
        memset(&s, 0, sizeof s);
        if ((dir ? deflateInit(&s, 1) : inflateInit(&s)) != Z_OK)
            exit(2);
        s.next_in = dir ? data : small_c;
        s.avail_in = dir ? 65536 : (uInt)small_len;
        int ret;
        do {
            s.next_out = small_out;
            s.avail_out = ROOM;
            ret = dir ? deflate(&s, Z_FINISH) : inflate(&s, Z_NO_FLUSH);
        } while (ret == Z_OK);
        if (ret != Z_STREAM_END)
            exit(2);
        dir ? deflateEnd(&s) : inflateEnd(&s);
    }
    /* compress 4 MiB (the most a stream gathers whole): gathered with
     * Z_NO_FLUSH, finished into 16 KiB rooms */
    size_t before = heap_held();
    z_stream s;
    memset(&s, 0, sizeof s);
    if (deflateInit(&s, 1) != Z_OK)
        exit(2);
    s.next_in = data;
    s.avail_in = 4 << 20;
    s.next_out = z;
    s.avail_out = ROOM;
    int ret = deflate(&s, Z_NO_FLUSH);
    while (ret == Z_OK) {
        s.next_out = z + s.total_out;
        s.avail_out = ROOM;
        ret = deflate(&s, Z_FINISH);
    }
    size_t n = ret == Z_STREAM_END ? ref_decode(15, z, s.total_out, back, N) : (size_t)-1;
    EXPECT(n == (size_t)4 << 20 && memcmp(back, data, n) == 0,
           "deflate of 4 MiB into %d-byte rooms: %d, zlib decodes %zd bytes", ROOM, ret,
           (ssize_t)n);
    deflateEnd(&s);
    size_t after = heap_held();
    EXPECT(after <= before + slack,
           "deflate of 4 MiB, ended: the heap held %zu bytes more than before (zlib's "
           "stream holds nothing after deflateEnd)",
           after - before);
    /* decode the large stream */
    before = heap_held();
    memset(&s, 0, sizeof s);
    if (inflateInit(&s) != Z_OK)
        exit(2);
    s.next_in = c;
    s.avail_in = (uInt)clen;
    do {
        s.next_out = back + s.total_out;
        s.avail_out = N - s.total_out < ROOM ? (uInt)(N - s.total_out) : ROOM;
        ret = inflate(&s, Z_NO_FLUSH);
    } while (ret == Z_OK);
    EXPECT(ret == Z_STREAM_END && s.total_out == N && memcmp(back, data, N) == 0,
           "inflate of %zu bytes into %d-byte rooms: %d, %lu bytes", clen, ROOM, ret,
           s.total_out);
    inflateEnd(&s);
    after = heap_held();
    EXPECT(after <= before + slack,
           "inflate of a %zu-byte stream of %d bytes, ended: the heap held %zu bytes more "
           "than before (zlib's stream holds nothing after inflateEnd)",
           clen, N, after - before);
    free(data);
    free(c);
    free(back);
    free(z);
}


/* How much of a gzip file written so far (flushed) the reference
 * decodes: the bytes it makes, or (size_t)-1 if they are not `data`. */
static size_t gz_file_decodes(const char *path, const unsigned char *data, size_t n)
{
    static unsigned char buf[(4 << 20) + 4096], out[(4 << 20) + 4096];
    FILE *f = fopen(path, "rb");
    if (!f)
        exit(2);
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    z_stream z;
    memset(&z, 0, sizeof z);
    if (ref.inflateInit2_(&z, 31, ZLIB_VERSION, (int)sizeof z) != Z_OK)
        exit(2);
    z.next_in = buf;
    z.avail_in = (uInt)len;
    z.next_out = out;
    z.avail_out = sizeof out;
    int ret = ref.inflate(&z, Z_SYNC_FLUSH);
    size_t got = z.total_out;
    ref.inflateEnd(&z);
    if ((ret != Z_OK && ret != Z_BUF_ERROR && ret != Z_STREAM_END) || got > n ||
        memcmp(out, data, got) != 0)
        return (size_t)-1;
    return got;
}

static off_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

/* gzoffset in write mode is the offset in the file of what has been
 * written (zlib.h: "the current offset in the file being read or
 * written", "used for a progress indicator"): zlib's gzwrite writes the
 * stream to the file as deflate makes it, holding back at most a deflate
 * block and gz's 8 KiB buffer. The shim gathered a gz file's stream as
 * any other, 4 MiB of input before its first byte reached the file:
 * gzoffset stood at 0 while zlib's grew with each gzwrite. A file of 3
 * MiB (incompressible, where zlib holds back least; then text) in
 * 64 KiB gzwrites beside the reference's: after each, the shim's offset
 * is behind zlib's by at most a piece of the shim's (256 KiB) and a
 * block and buffer of zlib's; after each gzflush, both files end there
 * and decode to all that was written. (The numbers themselves differ
 * with the compressed bytes: libdeflate's are not zlib's.) */
static void gzoffset_while_writing(void)
{
    enum { N = 3 << 20, PIECE = 65536 };
    const long behind = (256 + 16 + 8 + 8) << 10;
    static unsigned char data[N];
    random_bytes(data, N / 2, 41);
    text_bytes(data + N / 2, N - N / 2, 43);
    char path[] = "/tmp/wdz-edges-gz-XXXXXX", rpath[] = "/tmp/wdz-edges-gzr-XXXXXX";
    int fd = mkstemp(path), rfd = mkstemp(rpath);
    if (fd < 0 || rfd < 0)
        exit(2);
    close(fd);
    close(rfd);
    gzFile g = gzopen(path, "wb6"), rg = ref.gzopen(rpath, "wb6");
    if (!g || !rg)
        exit(2);
    int said = 0; /* (one failing gzwrite said per half: the others alike) */
    for (size_t at = 0; at < N; at += PIECE) {
        int w = gzwrite(g, data + at, PIECE), rw = ref.gzwrite(rg, data + at, PIECE);
        if (w != PIECE || rw != PIECE)
            exit(2);
        long off = (long)gzoffset(g), roff = (long)ref.gzoffset(rg);
        int ok = off >= roff - behind && off == (long)file_size(path);
        if (!said)
            EXPECT(ok, "after gzwrite of %zu bytes: gzoffset %ld (file %ld), zlib's %ld",
                   at + PIECE, off, (long)file_size(path), roff);
        else if (!ok)
            failures++;
        said |= !ok;
        if (at + PIECE == N / 2 || at + PIECE == N) {
            int f = gzflush(g, Z_SYNC_FLUSH), rf = ref.gzflush(rg, Z_SYNC_FLUSH);
            off = (long)gzoffset(g);
            roff = (long)ref.gzoffset(rg);
            size_t got = gz_file_decodes(path, data, N), rgot = gz_file_decodes(rpath, data, N);
            EXPECT(f == rf && off == (long)file_size(path) && roff == (long)file_size(rpath) &&
                       got == at + PIECE && rgot == at + PIECE,
                   "gzflush(Z_SYNC_FLUSH) after %zu bytes: shim %d, gzoffset %ld (file %ld, "
                   "decodes to %zd bytes), zlib %d, gzoffset %ld (file %ld, %zd bytes)",
                   at + PIECE, f, off, (long)file_size(path), (ssize_t)got, rf, roff,
                   (long)file_size(rpath), (ssize_t)rgot);
            said = 0;
        }
    }
    EXPECT(gzclose(g) == Z_OK && ref.gzclose(rg) == Z_OK, "gzclose");
    unlink(path);
    unlink(rpath);
}

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {
    {"gzip_deflate_bound_single_pass", gzip_deflate_bound_single_pass},
    {"gzip_header_crc_checked", gzip_header_crc_checked},
    {"params_same_function_no_room", params_same_function_no_room},
    {"params_on_zlib_rs_stream", params_on_zlib_rs_stream},
    {"gzread_small_file_in_pieces", gzread_small_file_in_pieces},
    {"deflate_data_type", deflate_data_type},
    {"small_window_inflate_in_pieces", small_window_inflate_in_pieces},
    {"set_dictionary_after_first_deflate", set_dictionary_after_first_deflate},
    {"repeated_flush_after_handoff", repeated_flush_after_handoff},
    {"params_function_change_no_room", params_function_change_no_room},
    {"flush_with_little_room", flush_with_little_room},
    {"need_dict_total_in", need_dict_total_in},
    {"scratch_released_after_large_streams", scratch_released_after_large_streams},
    {"gzoffset_while_writing", gzoffset_while_writing},
};

int main(int argc, char **argv)
{
    const char *pre = getenv("LD_PRELOAD");
    if (!pre || !strstr(pre, "libwdz"))
        fprintf(stderr, "note: libwdz.so is not preloaded: stock zlib against itself\n");
    load_reference();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0)
            continue;
        int before = failures;
        cases[i].fn();
        printf("%s: %s\n", cases[i].name, failures == before ? "ok" : "FAILED");
    }
    return failures ? 1 : 0;
}
