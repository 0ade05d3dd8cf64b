// Always-on invariant checks (tier (a) of docs/errors.md): a failed MS_ASSERT is a programmer
// error, so it prints the expression, the place and an optional context message, then aborts.
// Expected operating errors are values (see result.h), never asserts.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace moestream::detail {
[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line, const char* msg) {
    std::fprintf(stderr, "moestream: assertion failed: %s at %s:%d%s%s\n", expr, file, line,
                 msg ? ": " : "", msg ? msg : "");
    std::fflush(stderr);
    std::abort();
}
}  // namespace moestream::detail

#define MS_ASSERT(cond)                                                                  \
    do {                                                                                 \
        if (!(cond)) ::moestream::detail::assert_fail(#cond, __FILE__, __LINE__, nullptr); \
    } while (0)

#define MS_ASSERT_MSG(cond, msg)                                                     \
    do {                                                                             \
        if (!(cond)) ::moestream::detail::assert_fail(#cond, __FILE__, __LINE__, msg); \
    } while (0)
