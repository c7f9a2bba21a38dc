/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* The C tests' one assertion: counts, and on failure names the condition,
 * the library's last error and a message. Include after wd.h. */
#ifndef WD_TEST_CHECK_H
#define WD_TEST_CHECK_H
#include <stdio.h>

static int passed, failed;

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		if (cond) {                                                     \
			passed++;                                               \
		} else {                                                        \
			char m_[256];                                           \
			wd_last_error(m_, sizeof m_);                           \
			failed++;                                               \
			fprintf(stderr, "FAIL %s:%d: %s (last error: %s): ",    \
				__FILE__, __LINE__, #cond, m_);                 \
			fprintf(stderr, __VA_ARGS__);                           \
			fprintf(stderr, "\n");                                  \
		}                                                               \
	} while (0)

#endif
