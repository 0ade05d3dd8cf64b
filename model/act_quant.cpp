#include "model/act_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "config/assert.h"
#include "model/bf16.h"
#include "model/quant.h"

namespace moestream {
namespace {

// 2^ceil(log2(v)) for a positive normal float, read from its bits as the reference does:
// the exponent, plus one when the mantissa is non-zero.
float pow2_ceil(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    int e = int((u >> 23) & 0xff) - 127;
    if (u & 0x7fffffu) ++e;
    return std::ldexp(1.0f, e);
}

void fp8_block(float* x, int64_t n) {
    float amax = 1e-4f;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = pow2_ceil(amax * (1.0f / 448.0f));
    for (int64_t i = 0; i < n; ++i) {
        const float q = quant::e4m3_to_f32(quant::f32_to_e4m3(std::clamp(x[i] / scale, -448.0f, 448.0f)));
        x[i] = round_to_bf16(q * scale);
    }
}

void fp4_block(float* x, int64_t n, bool e4m3_scale) {
    float amax = e4m3_scale ? 6.0f * std::ldexp(1.0f, -9) : 6.0f * std::ldexp(1.0f, -126);
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = e4m3_scale ? quant::e4m3_to_f32(quant::f32_to_e4m3(amax / 6.0f)) : pow2_ceil(amax * (1.0f / 6.0f));
    for (int64_t i = 0; i < n; ++i) {
        const float q = quant::e2m1_to_f32(quant::f32_to_e2m1(std::clamp(x[i] / scale, -6.0f, 6.0f)));
        x[i] = round_to_bf16(q * scale);
    }
}

}  // namespace

void simulate_act_quant(act_quant_kind kind, float* x, int64_t n) {
    const int64_t block = kind == act_quant_kind::fp4_e4m3_16 ? 16 : 32;
    MS_ASSERT(n % block == 0);
    for (int64_t b = 0; b < n; b += block) {
        switch (kind) {
            case act_quant_kind::fp8_e8m0_32: fp8_block(x + b, block); break;
            case act_quant_kind::fp4_e8m0_32: fp4_block(x + b, block, false); break;
            case act_quant_kind::fp4_e4m3_16: fp4_block(x + b, block, true); break;
        }
    }
}

}  // namespace moestream
