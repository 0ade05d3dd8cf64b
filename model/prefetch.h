// Software prefetch of a weight stream's first bytes. The AVX-512 row kernels prefetch ahead
// within the rows they are given (quant_avx512.cpp); what they cannot reach is the start of the
// next, unrelated matrix a thread moves on to (the next tile of a batched pass, the up half of a
// SwiGLU pair, the next term of an output sum). Those starts are prefetched here a tile early.
#pragma once

#include <cstdint>

namespace moestream {

// Bytes of a stream's start worth prefetching: what the kernels' own look-ahead covers later.
inline constexpr int64_t kStreamStartBytes = 4096;

// Prefetches [p + ahead, p + ahead + bytes) to L2, a line per 64 bytes (a hint: never faults,
// never changes results). The addresses are formed as integers, so the range may lie past the end
// of p's array (the kernels' look-ahead runs over the last rows of a matrix).
[[gnu::always_inline]] inline void prefetch_to_l2(const void* p, int64_t bytes, int64_t ahead = 0) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(p) + uintptr_t(ahead);
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(reinterpret_cast<const void*>(at + uintptr_t(o)), 0, 2);
}

}  // namespace moestream
