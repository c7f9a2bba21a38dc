/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* libwd_comp.so through wd_comp.h: round trips of every algorithm, on the
 * host named by WD_HOST (or on the CPU without one), the errors and
 * statuses the header promises, out-parameters untouched on failure,
 * messages through libwd.so's wd_last_error.
 * Exit 0 and "N passed, 0 failed". */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wd.h"
#include "wd_comp.h"
#include "check.h"

static unsigned char *text(size_t n)
{
	static const char *words[] = {"queue ", "domain ", "IOVA ", "engine ", "session\n"};
	unsigned char *d = malloc(n + 16);
	size_t at = 0;
	uint32_t x = 7;
	while (at < n) {
		x = x * 1103515245u + 12345u;
		const char *w = words[(x >> 16) % 5];
		size_t l = strlen(w);
		memcpy(d + at, w, l);
		at += l;
	}
	return d;
}

/* A failing call (checked at thread exit: call_at_thread_exit). */
static int new_without_out(void)
{
	return wd_comp_new(NULL);
}

int main(void)
{
	struct wd_comp *c = NULL;
	CHECK(wd_comp_new(NULL) == -EINVAL, "NULL out refused");
	CHECK(wd_comp_new(&c) == 0 && c != NULL, "a compressor");
	size_t n = 300000;
	unsigned char *d = text(n), *z = malloc(n + 1024), *back = malloc(n + 1);
	for (int alg = WD_COMP_DEFLATE; alg <= WD_COMP_LZ4; alg++) {
		size_t bound = wd_comp_bound(alg, n);
		CHECK(bound >= n && bound < n + n / 8 + 1024, "bound of alg %d", alg);
		/* A length no buffer can have has no bound (it wrapped to a few
		 * bytes: "room that always suffices"). */
		CHECK(wd_comp_bound(alg, SIZE_MAX - 8) == 0 && wd_comp_bound(alg, SIZE_MAX / 2) == 0,
		      "no bound past SIZE_MAX / 2, alg %d", alg);
		size_t zlen = bound;
		CHECK(wd_comp_compress(c, alg, WD_COMP_DEFAULT_LEVEL, d, n, z, &zlen) == 0 && zlen < n,
		      "compress alg %d", alg);
		size_t blen = n + 1, used = 0;
		CHECK(wd_comp_decompress(c, alg, z, zlen, &used, back, &blen, 0) == 0 && blen == n &&
			      used == zlen && memcmp(back, d, n) == 0,
		      "round trip alg %d", alg);
		/* Too little room: -ENOBUFS, counts untouched. */
		size_t small = 100, keep = 12345;
		CHECK(wd_comp_decompress(c, alg, z, zlen, &keep, back, &small, 0) == -ENOBUFS &&
			      small == 100 && keep == 12345,
		      "no room alg %d", alg);
		/* Truncated: -EBADMSG (raw deflate may say -ENOBUFS: it has no
		 * length of its own). */
		blen = n;
		int r = wd_comp_decompress(c, alg, z, zlen / 2, NULL, back, &blen, 0);
		CHECK(r == -EBADMSG || (alg == WD_COMP_DEFLATE && r == -ENOBUFS), "truncated alg %d: %d",
		      alg, r);
		/* A ratio limit stops the expansion. */
		blen = n + 1;
		CHECK(wd_comp_decompress(c, alg, z, zlen, NULL, back, &blen, 2) == -EOVERFLOW,
		      "ratio alg %d", alg);
	}
	size_t zlen = n;
	char msg[256] = "";
	CHECK(wd_comp_compress(c, 9, 1, d, n, z, &zlen) == -EINVAL && zlen == n, "unknown algorithm");
	CHECK(wd_last_error(msg, sizeof msg) > 0 && strstr(msg, "wd_comp_compress"),
	      "wd_last_error names the call: %s", msg);
	CHECK(wd_comp_compress(c, WD_COMP_LZ4, 7, d, n, z, &zlen) == -EINVAL, "lz4 has one level");
	CHECK(wd_comp_compress(c, WD_COMP_ZSTD, 1, d, n, d + 10, &zlen) == -EINVAL,
	      "overlapping buffers refused");
	CHECK(wd_comp_compress(c, WD_COMP_ZSTD, 1, NULL, 10, z, &zlen) == -EINVAL, "NULL source");
	CHECK(wd_comp_compress(c, WD_COMP_ZSTD, 1, d, n, z, NULL) == -EINVAL, "NULL length");
	CHECK(wd_comp_compress((struct wd_comp *)d, WD_COMP_ZSTD, 1, d, n, z, &zlen) == -EINVAL,
	      "a foreign pointer is not a compressor");
	CHECK(wd_comp_decompress(c, WD_COMP_ZLIB, d, 1000, NULL, back, &zlen, 70000) == -EINVAL,
	      "ratio above 65535");
	/* A batch: buffers of different sizes, several in flight. */
	struct wd_comp_buf bufs[4];
	unsigned char *zs[4], *outs[4];
	size_t sizes[4] = {1, 5000, 100000, 300000};
	for (int i = 0; i < 4; i++) {
		zs[i] = malloc(wd_comp_bound(WD_COMP_GZIP, sizes[i]));
		outs[i] = malloc(sizes[i]);
		bufs[i] = (struct wd_comp_buf){d, sizes[i], zs[i], wd_comp_bound(WD_COMP_GZIP, sizes[i]), 0};
	}
	CHECK(wd_comp_compress_batch(c, WD_COMP_GZIP, 6, bufs, 4) == 0, "batch compress");
	for (int i = 0; i < 4; i++) {
		CHECK(bufs[i].consumed == sizes[i] && bufs[i].dst_len > 0, "batch counts %d", i);
		bufs[i] = (struct wd_comp_buf){zs[i], bufs[i].dst_len, outs[i], sizes[i], 0};
	}
	CHECK(wd_comp_decompress_batch(c, WD_COMP_GZIP, bufs, 4, 0) == 0, "batch decompress");
	for (int i = 0; i < 4; i++)
		CHECK(bufs[i].dst_len == sizes[i] && memcmp(outs[i], d, sizes[i]) == 0, "batch data %d", i);
	/* One buffer with too little room fails the batch; no count changes. */
	bufs[3].dst_len = 10;
	size_t before = bufs[0].dst_len;
	CHECK(wd_comp_decompress_batch(c, WD_COMP_GZIP, bufs, 4, 0) == -ENOBUFS &&
		      bufs[0].dst_len == before && bufs[3].dst_len == 10,
	      "a failed batch writes no counts");
	CHECK(wd_comp_compress_batch(c, WD_COMP_GZIP, 6, NULL, 2) == -EINVAL, "NULL batch");
	/* A count past the limit is refused before anything is set aside for
	 * it (2^40 entries aborted the process on a failed allocation). */
	CHECK(wd_comp_compress_batch(c, WD_COMP_GZIP, 6, bufs, (size_t)1 << 40) == -EINVAL,
	      "a batch of 2^40 buffers");
	for (int i = 0; i < 4; i++) {
		free(zs[i]);
		free(outs[i]);
	}

	/* Scatter lists: the message in uneven pieces (one empty) into three
	 * output pieces gives the contiguous stream; back the same way. */
	{
		size_t cont = wd_comp_bound(WD_COMP_ZLIB, n);
		unsigned char *whole = malloc(cont), *zz = malloc(cont);
		CHECK(wd_comp_compress(c, WD_COMP_ZLIB, 1, d, n, whole, &cont) == 0, "contiguous");
		struct iovec in[4] = {{d, 7}, {d + 7, 0}, {d + 7, 100000}, {d + 100007, n - 100007}};
		size_t room = wd_comp_bound(WD_COMP_ZLIB, n);
		struct iovec out[3] = {{zz, 1000}, {zz + 1000, 3}, {zz + 1003, room - 1003}};
		size_t made = 0, took = 0, got = 0;
		CHECK(wd_comp_compress_sg(c, WD_COMP_ZLIB, 1, in, 4, out, 3, &made) == 0 && made == cont &&
			      memcmp(zz, whole, cont) == 0,
		      "scatter list compress gives the contiguous stream (%zu of %zu)", made, cont);
		struct iovec zin[2] = {{zz, made / 3}, {zz + made / 3, made - made / 3}};
		struct iovec bout[2] = {{back, 12345}, {back + 12345, n - 12345}};
		CHECK(wd_comp_decompress_sg(c, WD_COMP_ZLIB, zin, 2, &took, bout, 2, &got, 0) == 0 &&
			      took == made && got == n && memcmp(back, d, n) == 0,
		      "scatter list round trip");
		/* Refused: output pieces overlapping each other or an input,
		 * a NULL piece with a length, too many pieces; counts untouched. */
		struct iovec lap[2] = {{zz, 100}, {zz + 50, room - 50}};
		made = 77;
		CHECK(wd_comp_compress_sg(c, WD_COMP_ZLIB, 1, in, 4, lap, 2, &made) == -EINVAL && made == 77,
		      "overlapping output pieces refused");
		struct iovec into[1] = {{d + 10, 1000}};
		CHECK(wd_comp_compress_sg(c, WD_COMP_ZLIB, 1, in, 4, into, 1, &made) == -EINVAL,
		      "output over an input refused");
		struct iovec null[1] = {{NULL, 10}};
		CHECK(wd_comp_compress_sg(c, WD_COMP_ZLIB, 1, null, 1, out, 3, &made) == -EINVAL,
		      "NULL piece refused");
		CHECK(wd_comp_compress_sg(c, WD_COMP_ZLIB, 1, in, 1025, out, 3, &made) == -EINVAL,
		      "more than 1024 pieces refused");
		CHECK(wd_comp_compress_sg(c, WD_COMP_ZLIB, 1, in, 4, out, 3, NULL) == -EINVAL,
		      "NULL produced refused");
		/* Too little room across the pieces: -ENOBUFS. */
		CHECK(wd_comp_decompress_sg(c, WD_COMP_ZLIB, zin, 2, NULL, bout, 1, &got, 0) == -ENOBUFS &&
			      got == n,
		      "no room across the pieces");
		/* A batch whose outputs overlap each other is refused. */
		struct wd_comp_buf lapb[2] = {{d, 1000, zz, 2000, 0}, {d, 1000, zz + 1000, 2000, 0}};
		CHECK(wd_comp_compress_batch(c, WD_COMP_ZLIB, 1, lapb, 2) == -EINVAL,
		      "batch outputs overlapping each other refused");
		free(whole);
		free(zz);
	}

	/* Asynchronous requests: eight started at once (the source buffer
	 * reused after each submit), finished newest first by polling and
	 * waiting; a corrupt one fails alone; tickets are spent once. */
	{
		enum { N = 8 };
		size_t len = 60000, room = wd_comp_bound(WD_COMP_GZIP, len);
		unsigned char *src = malloc(len), *zz[N];
		uint64_t t[N];
		for (int i = 0; i < N; i++) {
			memcpy(src, d + i * 1000, len);
			zz[i] = malloc(room);
			CHECK(wd_comp_submit(c, WD_COMP_OP_COMPRESS, WD_COMP_GZIP, 6, 0, src, len, zz[i], room,
					     &t[i]) == 0,
			      "submit %d", i);
			memset(src, 0, len);
		}
		size_t zl[N];
		for (int i = N - 1; i >= 0; i--) {
			size_t took = 0;
			int r;
			while ((r = wd_comp_poll(c, t[i], &took, &zl[i])) == -EAGAIN)
				;
			CHECK(r == 0 && took == len && zl[i] > 0, "poll %d: %d", i, r);
			CHECK(wd_comp_poll(c, t[i], &took, &zl[i]) == -EINVAL, "ticket %d spent", i);
		}
		for (int i = 0; i < N; i++) {
			size_t got = 0, blen = len;
			CHECK(wd_comp_decompress(c, WD_COMP_GZIP, zz[i], zl[i], NULL, back, &blen, 0) == 0 &&
				      blen == len && memcmp(back, d + i * 1000, len) == 0,
			      "async result %d", i);
			uint64_t u;
			CHECK(wd_comp_submit(c, WD_COMP_OP_DECOMPRESS, WD_COMP_GZIP, 0, 0, zz[i], zl[i], back,
					     len, &u) == 0 &&
				      wd_comp_wait(c, u, NULL, &got) == 0 && got == len &&
				      memcmp(back, d + i * 1000, len) == 0,
			      "async decompress %d", i);
		}
		uint64_t bad;
		size_t got = 99;
		/* Computed at once, it fails at submit; on the device, at wait. */
		int r = wd_comp_submit(c, WD_COMP_OP_DECOMPRESS, WD_COMP_GZIP, 0, 0, d, len, back, len, &bad);
		if (r == 0)
			r = wd_comp_wait(c, bad, NULL, &got);
		CHECK(r == -EBADMSG && got == 99, "a corrupt stream fails its own request, counts untouched");
		CHECK(wd_comp_submit(c, 7, WD_COMP_GZIP, 0, 0, d, len, back, len, &bad) == -EINVAL,
		      "unknown operation");
		CHECK(wd_comp_submit(c, WD_COMP_OP_COMPRESS, WD_COMP_GZIP, 6, 0, d, len, back, len, NULL) ==
			      -EINVAL,
		      "NULL ticket");
		CHECK(wd_comp_wait(c, 123456789, NULL, &got) == -EINVAL, "unknown ticket");
		/* Both counts are optional (a NULL produced was -EINVAL). */
		uint64_t quiet;
		CHECK(wd_comp_submit(c, WD_COMP_OP_COMPRESS, WD_COMP_GZIP, 6, 0, d, len, back, len,
				     &quiet) == 0 &&
			      wd_comp_wait(c, quiet, NULL, NULL) == 0,
		      "a wait that wants no counts");
		for (int i = 0; i < N; i++)
			free(zz[i]);
		free(src);
	}

	/* A stream: compressed in pieces with every flush mode, then
	 * decompressed in small pieces. */
	struct wd_comp_stream *s = NULL;
	CHECK(wd_comp_stream_new(c, WD_COMP_LZ4, 1, 1, 0, NULL, 0, &s) == -EINVAL && s == NULL,
	      "no LZ4 streams");
	for (int compress = 0; compress < 2; compress++)
		CHECK(wd_comp_stream_new(c, WD_COMP_GZIP, compress, 6, 0, "dict", 4, &s) == -EINVAL &&
			      s == NULL,
		      "gzip takes no dictionary (compress %d)", compress);
	CHECK(wd_comp_stream_new(c, WD_COMP_ZLIB, 1, 6, 0, NULL, 0, &s) == 0 && s, "a stream");
	size_t zat = 0, at = 0;
	static const int flushes[] = {WD_COMP_NO_FLUSH, WD_COMP_SYNC_FLUSH, WD_COMP_FULL_FLUSH};
	for (int k = 0; at < n; k++) {
		size_t piece = n - at < 40000 ? n - at : 40000;
		int last = at + piece == n, end = 0;
		size_t took = piece, room = n + 1024 - zat;
		int r = wd_comp_stream_run(c, s, d + at, &took, z + zat, &room,
					   last ? WD_COMP_FINISH : flushes[k % 3], &end);
		CHECK(r == 0, "stream run %d", k);
		if (r != 0)
			break;
		at += took;
		zat += room;
		if (last)
			CHECK(end == 1 && took == piece, "the stream ended");
	}
	wd_comp_stream_free(c, s);
	struct wd_comp_stream *u = NULL;
	/* The level is ignored when decompressing, whatever it is. */
	CHECK(wd_comp_stream_new(c, WD_COMP_ZLIB, 0, 1000, 0, NULL, 0, &u) == 0, "a decompressor");
	size_t zin = 0, made = 0;
	int end = 0;
	while (!end) {
		size_t take = zat - zin < 1000 ? zat - zin : 1000, room = 7000;
		int r = wd_comp_stream_run(c, u, z + zin, &take, back + made, &room, WD_COMP_NO_FLUSH, &end);
		CHECK(r == 0 && (take > 0 || room > 0 || end), "decompress progress");
		if (r != 0 || (take == 0 && room == 0 && !end))
			break;
		zin += take;
		made += room;
	}
	CHECK(end && made == n && zin == zat && memcmp(back, d, n) == 0, "stream round trip");
	CHECK(wd_comp_stream_run(c, (struct wd_comp_stream *)d, z, &zin, back, &made, 0, NULL) == -EINVAL,
	      "a foreign stream pointer");
	wd_comp_stream_free(c, u);
	wd_comp_stream_free(c, NULL);

	/* A stream in pieces: three calls, one stream; bad calls change
	 * nothing. */
	for (int alg = WD_COMP_DEFLATE; alg <= WD_COMP_GZIP; alg++) {
		struct wd_comp_pieces p = {7, 7}, was;
		size_t cuts[] = {0, 1000, 120000, n}, at = 0;
		for (int i = 0; i < 3; i++) {
			size_t len = cuts[i + 1] - cuts[i], room = wd_comp_bound(alg, len) + 20;
			int flags = (i == 0 ? WD_COMP_PIECE_FIRST : 0) | (i == 2 ? WD_COMP_PIECE_LAST : 0);
			if (i == 1) {
				size_t r0 = 10;
				was = p;
				CHECK(wd_comp_compress_piece(c, alg, 1, &p, d + cuts[i], len, z + at, &r0,
							     flags) == -ENOBUFS &&
					      r0 == 10 && p.check == was.check && p.len == was.len,
				      "a piece without room: nothing written, alg %d", alg);
				CHECK(wd_comp_compress_piece(c, alg, 1, &p, d, len, z + at, &room, 8) == -EINVAL,
				      "unknown flags");
				CHECK(wd_comp_compress_piece(c, alg, 1, NULL, d, len, z + at, &room, 0) == -EINVAL,
				      "NULL pieces");
			}
			CHECK(wd_comp_compress_piece(c, alg, 1, &p, d + cuts[i], len, z + at, &room, flags) == 0,
			      "piece %d of alg %d", i, alg);
			CHECK(p.len == cuts[i + 1], "length carried");
			at += room;
		}
		size_t blen = n + 1, used = 0;
		CHECK(wd_comp_decompress(c, alg, z, at, &used, back, &blen, 0) == 0 && blen == n &&
			      used == at && memcmp(back, d, n) == 0,
		      "pieces round trip alg %d", alg);
	}
	struct wd_comp_pieces p = {0, 0};
	size_t room = 100;
	CHECK(wd_comp_compress_piece(c, WD_COMP_ZSTD, 1, &p, d, 10, z, &room, 3) == -EINVAL,
	      "pieces of zstd");

	struct wd_comp_stats st;
	memset(&st, 0xff, sizeof st);
	CHECK(wd_comp_stats(c, NULL) == -EINVAL, "NULL stats");
	uint64_t rebuilt = 7, lost = 7;
	CHECK(wd_comp_stream_stats(c, &rebuilt, NULL) == -EINVAL && rebuilt == 7,
	      "NULL stream stats: nothing written");
	CHECK(wd_comp_stream_stats(NULL, &rebuilt, &lost) == -EINVAL, "stream stats of NULL");
	CHECK(wd_comp_stream_stats(c, &rebuilt, &lost) == 0 && rebuilt == 0 && lost == 0,
	      "no host restarted under a stream");
	uint64_t split = 7;
	CHECK(wd_comp_split_stats(c, NULL) == -EINVAL, "NULL split stats");
	CHECK(wd_comp_split_stats(NULL, &split) == -EINVAL && split == 7,
	      "split stats of NULL: nothing written");
	CHECK(wd_comp_split_stats(c, &split) == 0, "split stats");

	/* Cutting switched off: a large block is not cut; on again: it is
	 * where blocks were cut before (a device there, the auto policy). */
	CHECK(wd_comp_set_split(NULL, 1) == -EINVAL, "set split of NULL");
	CHECK(wd_comp_set_split(c, 2) == -EINVAL, "set split neither 0 nor 1");
	uint64_t cut[3];
	for (int on = 0; on < 2; on++) {
		CHECK(wd_comp_set_split(c, on) == 0, "set split %d", on);
		CHECK(wd_comp_split_stats(c, &cut[on]) == 0, "split stats");
		size_t room = n + 1024, blen = n + 1, used = 0;
		CHECK(wd_comp_compress(c, WD_COMP_ZLIB, 1, d, n, z, &room) == 0, "compress, split %d", on);
		CHECK(wd_comp_decompress(c, WD_COMP_ZLIB, z, room, &used, back, &blen, 0) == 0 &&
			      blen == n && memcmp(back, d, n) == 0,
		      "round trip, split %d", on);
	}
	CHECK(wd_comp_split_stats(c, &cut[2]) == 0, "split stats");
	CHECK(cut[1] == cut[0], "no cut while off");
	CHECK(split == 0 || cut[2] > cut[1], "cut again once on");
	CHECK(wd_comp_stats(c, &st) == 0 && st.bytes_in > 0, "stats");
	CHECK(st.offloaded + st.cpu_threshold + st.cpu_policy + st.cpu_assist + st.cpu_fallback + split > 0,
	      "stats count the requests");
	printf("offloaded %llu, split %llu, cpu: policy %llu, fallback %llu\n",
	       (unsigned long long)st.offloaded, (unsigned long long)split,
	       (unsigned long long)st.cpu_policy, (unsigned long long)st.cpu_fallback);
	wd_comp_free(c);
	wd_comp_free(NULL);
	free(d);
	free(z);
	free(back);
	CHECK(call_at_thread_exit(new_without_out) == -EINVAL, "a call at thread exit answers");
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
