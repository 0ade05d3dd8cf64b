// Rounding a float to the nearest bf16 value (ties to even), kept in float storage: the reference
// holds activations in bf16 between ops, and we reproduce exactly those roundings.
#pragma once

#include <cstdint>
#include <cstring>

#include "model/numeric.h"

namespace moestream {

inline float round_to_bf16(float f) { return numeric::round_bf16(f); }

inline void round_to_bf16(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

// bf16 storage of values the model has already rounded (attention keys): half the bytes, and the
// float it gives back is the one stored.
inline float bf16_value(uint16_t bits) {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// The bf16 bits of x[0..n) into out; false (out then partly written) if some x[i] is not exactly
// a bf16 value, whose low 16 bits would be lost.
inline bool to_bf16_bits_exact(const float* x, int64_t n, uint16_t* out) {
    uint32_t low = 0;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, x + i, 4);
        low |= u & 0xffffu;
        out[i] = uint16_t(u >> 16);
    }
    return low == 0;
}

}  // namespace moestream
