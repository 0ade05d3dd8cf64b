// Software prefetch of a weight stream's first bytes. The AVX-512 row kernels prefetch ahead
// within the rows they are given (quant_avx512.cpp); what they cannot reach is the start of the
// next, unrelated matrix a thread moves on to (the next tile of a batched pass, the up half of a
// SwiGLU pair, the next term of an output sum). Those starts are prefetched here a tile early.
#pragma once

#include <cstdint>

namespace moestream {

// Bytes of a stream's start worth prefetching: what the kernels' own look-ahead covers later.
inline constexpr int64_t kStreamStartBytes = 4096;

// Prefetches [p, p + bytes) to L2, a line per 64 bytes (a hint: never faults, never changes
// results).
inline void prefetch_to_l2(const void* p, int64_t bytes) {
    const char* c = static_cast<const char*>(p);
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o, 0, 2);
}

}  // namespace moestream
