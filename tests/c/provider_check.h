/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* What the provider's C tests share: the assertion (counts; on failure
 * names the condition, a message and OpenSSL's error queue), random bytes,
 * and a cipher from both providers. Include after the OpenSSL headers. */
#ifndef WD_TEST_PROVIDER_CHECK_H
#define WD_TEST_PROVIDER_CHECK_H
#include <stdio.h>

static int passed, failed;

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		if (cond) {                                                     \
			passed++;                                               \
		} else {                                                        \
			failed++;                                               \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                           \
			fprintf(stderr, "\n");                                  \
			ERR_print_errors_fp(stderr);                            \
		}                                                               \
	} while (0)

static unsigned long long rng = 0x9e3779b97f4a7c15ull;
static inline unsigned rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (unsigned)(rng >> 11);
}

static inline void fill(unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)rnd();
}

/* `name` from this provider ([0]) and from the default one ([1]), the two
 * sides a differential test compares (a side not found is NULL, and the
 * failure counted). */
static inline void fetch_both(const char *name, EVP_CIPHER *cs[2])
{
	cs[0] = EVP_CIPHER_fetch(NULL, name, "provider=wd");
	cs[1] = EVP_CIPHER_fetch(NULL, name, "provider=default");
	CHECK(cs[0] && cs[1], "fetch %s", name);
}

static inline void free_both(EVP_CIPHER *cs[2])
{
	EVP_CIPHER_free(cs[0]);
	EVP_CIPHER_free(cs[1]);
}

#endif
