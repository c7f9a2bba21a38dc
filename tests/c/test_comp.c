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
	struct wd_comp_stats st;
	memset(&st, 0xff, sizeof st);
	CHECK(wd_comp_stats(c, NULL) == -EINVAL, "NULL stats");
	CHECK(wd_comp_stats(c, &st) == 0 && st.bytes_in > 0 &&
		      st.offloaded + st.cpu_threshold + st.cpu_policy + st.cpu_assist + st.cpu_fallback > 0,
	      "stats count the requests");
	printf("offloaded %llu, cpu: policy %llu, fallback %llu\n", (unsigned long long)st.offloaded,
	       (unsigned long long)st.cpu_policy, (unsigned long long)st.cpu_fallback);
	wd_comp_free(c);
	wd_comp_free(NULL);
	free(d);
	free(z);
	free(back);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
