// Rounding a float to the nearest bf16 value (ties to even), kept in float storage: the reference
// holds activations in bf16 between ops, and we reproduce exactly those roundings.
#pragma once

#include <cstdint>
#include <cstring>

namespace moestream {

inline float round_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    // Branch-free so loops over it vectorise: infinities survive the carry (0x7f80'0000 + 0x7fff
    // truncates back), finite values overflowing to inf is the right RNE result, and NaN is the
    // one case selected separately (kept a quiet NaN).
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t nan = (u | 0x00400000u) & 0xffff0000u;
    const uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    float out;
    std::memcpy(&out, &r, 4);
    return out;
}

inline void round_to_bf16(float* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

}  // namespace moestream
