/* The check helpers of the C API tests (api.c, cm_api.c): each failed
 * check prints where and why, with errno, and counts; REQUIRE stops. */
#ifndef UROCE_CHECK_H
#define UROCE_CHECK_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;

/* Each condition is evaluated exactly once (they call verbs). */
#define CHECK(cond, ...) check_at(!!(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)
#define REQUIRE(cond, ...)                                                \
	do {                                                              \
		if (!CHECK(cond, __VA_ARGS__))                            \
			exit(1);                                          \
	} while (0)

__attribute__((format(printf, 5, 6)))
static int check_at(int ok, const char *file, int line, const char *what, const char *fmt, ...)
{
	if (ok)
		return 1;
	int e = errno;
	va_list ap;
	fprintf(stderr, "FAIL %s:%d: %s: ", file, line, what);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (errno %d)\n", e);
	failures++;
	return 0;
}

#endif
