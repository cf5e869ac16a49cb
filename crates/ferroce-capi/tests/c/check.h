/*
 * What the C tests share: the bound on every wait, and the checks that end the program at
 * the first failure, printing the test file's name, the line, what failed and the library's
 * last error.
 *
 * Included by capi_test.c and verbs_test.c as "check.h", found beside them, so
 * tests/c_abi.rs and scripts/test-c.sh compile them with no flag more. Each defines
 * _POSIX_C_SOURCE before including it.
 */
#ifndef FERROCE_TEST_CHECK_H
#define FERROCE_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferroce.h"

#define WAIT_MS 5000

static void fail_at(const char *file, int line, const char *what) {
    const char *name = strrchr(file, '/');
    char text[512];
    ferroce_last_error(text, sizeof text);
    fprintf(stderr, "%s:%d: %s\n  last error: %s\n", name ? name + 1 : file, line, what, text);
    exit(1);
}

#define fail(what, line) fail_at(__FILE__, (line), (what))

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        if (!(cond)) fail(#cond, __LINE__);                                                       \
    } while (0)

/* A call that must return `want`. */
#define EXPECT(call, want)                                                                        \
    do {                                                                                          \
        ferroce_result r_ = (call);                                                               \
        if (r_ != (want)) {                                                                       \
            char m_[256];                                                                         \
            snprintf(m_, sizeof m_, "%s returned %s, expected %s", #call,                         \
                     ferroce_result_name((uint32_t)r_), ferroce_result_name((uint32_t)(want)));   \
            fail(m_, __LINE__);                                                                   \
        }                                                                                         \
    } while (0)

#define OK(call) EXPECT(call, FERROCE_RESULT_OK)

#endif
