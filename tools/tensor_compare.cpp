#include "tools/tensor_compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/quant.h"

namespace moestream::tools {

tensor_stats compare(std::span<const float> a, std::span<const float> b) {
    MS_ASSERT_MSG(a.size() == b.size(), "tools::compare: tensors of different sizes");
    tensor_stats s;
    // Pass 1: means, norms and the largest difference over the finite pairs.
    double sum_a = 0, sum_b = 0, sq_a = 0, sq_b = 0, sq_d = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const bool fa = std::isfinite(a[i]), fb = std::isfinite(b[i]);
        s.nonfinite_a += !fa;
        s.nonfinite_b += !fb;
        if (!fa || !fb) continue;
        const double x = a[i], y = b[i], d = x - y;
        ++s.n;
        sum_a += x;
        sum_b += y;
        sq_a += x * x;
        sq_b += y * y;
        sq_d += d * d;
        s.max_abs_diff = std::max(s.max_abs_diff, std::abs(d));
    }
    s.norm_a = std::sqrt(sq_a);
    s.norm_b = std::sqrt(sq_b);
    const double norm_d = std::sqrt(sq_d);
    s.rel_err = s.norm_b > 0 ? norm_d / s.norm_b : (norm_d > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    if (s.max_abs_diff == 0) return s;  // identical (corr stays 1, also for constant or empty tensors)

    // Pass 2: centred sums. The textbook one-pass formula cancels catastrophically when the mean
    // is large against the spread (e.g. hidden states with a big constant offset).
    const double mean_a = sum_a / double(s.n), mean_b = sum_b / double(s.n);
    double sxx = 0, syy = 0, sxy = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
        const double x = a[i] - mean_a, y = b[i] - mean_b;
        sxx += x * x;
        syy += y * y;
        sxy += x * y;
    }
    s.corr = (sxx > 0 && syy > 0) ? std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0) : 0.0;
    return s;
}

bool is_float(safetensors::dtype t) {
    using safetensors::dtype;
    return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16;
}

result<std::span<const float>> to_f32(safetensors::dtype t, std::span<const std::byte> bytes,
                                      std::vector<float>& storage) {
    using safetensors::dtype;
    if (!is_float(t))
        return make_error(std::string("dtype ") + std::string(safetensors::dtype_name(t)) + " is not a float type");
    const size_t width = size_t(safetensors::dtype_bits(t) / 8);
    MS_ASSERT(bytes.size() % width == 0);
    const size_t n = bytes.size() / width;
    // Memory-mapped F32 data is used in place when aligned (dumps are large; a copy doubles them).
    if (t == dtype::f32 && reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) == 0)
        return std::span<const float>(reinterpret_cast<const float*>(bytes.data()), n);
    storage.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const std::byte* p = bytes.data() + i * width;
        switch (t) {
            case dtype::f32: std::memcpy(&storage[i], p, 4); break;
            case dtype::f64: {
                double d;
                std::memcpy(&d, p, 8);
                storage[i] = float(d);
                break;
            }
            case dtype::f16:
            case dtype::bf16: {
                uint16_t h;
                std::memcpy(&h, p, 2);
                storage[i] = t == dtype::f16 ? quant::f16_to_f32(h) : quant::bf16_to_f32(h);
                break;
            }
            default: MS_ASSERT_MSG(false, "to_f32: unhandled float dtype");
        }
    }
    return std::span<const float>(storage);
}

}  // namespace moestream::tools
