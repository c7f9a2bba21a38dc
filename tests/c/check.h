/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/* The C tests' one assertion: counts, and on failure names the condition,
 * the library's last error and a message. Include after wd.h. */
#ifndef WD_TEST_CHECK_H
#define WD_TEST_CHECK_H
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* call_at_thread_exit(f): run f on a new thread (so that the thread's
 * storage holds a last error), then again from a thread-key destructor
 * at that thread's exit, which glibc runs after the thread's own storage
 * (the libraries' Rust thread-locals) is gone; what that call returned,
 * or 1 when no thread could be made. A library call there must answer,
 * never abort the process. */
struct wd_exit_call {
	int (*f)(void);
	int r;
	pthread_key_t key;
};

static inline void wd_exit_call_at_exit(void *p)
{
	struct wd_exit_call *c = p;
	c->r = c->f();
}

static inline void *wd_exit_call_thread(void *p)
{
	struct wd_exit_call *c = p;
	(void)c->f();
	pthread_setspecific(c->key, c);
	return NULL;
}

static inline int call_at_thread_exit(int (*f)(void))
{
	struct wd_exit_call c = {f, 1, 0};
	pthread_t t;
	if (pthread_key_create(&c.key, wd_exit_call_at_exit))
		return 1;
	if (pthread_create(&t, NULL, wd_exit_call_thread, &c) == 0)
		pthread_join(t, NULL);
	pthread_key_delete(c.key);
	return c.r;
}

/* A buffer whose end wraps around the address space: a pointer check
 * that misses ptr + len reads or writes there. */
#define WRAPPING ((void *)(UINTPTR_MAX - 15))

/* Run f in a child: its exit code, or 128 + the signal that killed it
 * (a call that crashes fails its check instead of the whole test). */
static inline int in_child(int (*f)(void))
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0)
		_exit(f());
	int st = 0;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#endif
