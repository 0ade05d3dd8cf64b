// Rounding a float to the nearest bf16 value (ties to even), kept in float storage: the reference
// holds activations in bf16 between ops, and we reproduce exactly those roundings.
#pragma once

#include <cstdint>
#include <cstring>

namespace moestream {

inline float round_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) {  // inf stays, NaN stays NaN (quiet)
        if (u & 0x007fffffu) u |= 0x00400000u;
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
    }
    u &= 0xffff0000u;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
}

inline void round_to_bf16(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

}  // namespace moestream
