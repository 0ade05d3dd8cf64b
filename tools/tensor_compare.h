// Numerical comparison of two tensors (a candidate `a` against a reference `b`), shared by
// `moestream compare` and any command that checks activations against a golden dump.
// Sums are in double: fp32 accumulation over millions of elements loses the digits a correlation
// of 0.9999 needs.
// Thread safety: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "config/result.h"
#include "storage/safetensors.h"

namespace moestream::tools {

struct tensor_stats {
    int64_t n = 0;              // elements compared (pairs where both are finite)
    int64_t nonfinite_a = 0;    // NaN/Inf elements in a (those pairs are left out of every sum)
    int64_t nonfinite_b = 0;
    double corr = 1.0;          // Pearson; 1 when a == b exactly (constant or empty too), 0 when one
                                // side is constant and they differ (undefined: treated as unrelated)
    double rel_err = 0.0;       // ||a-b|| / ||b||; 0 when both are 0, +inf when only b is 0
    double norm_a = 0.0;        // L2 norms
    double norm_b = 0.0;
    double max_abs_diff = 0.0;  // max |a-b|

    bool finite() const { return nonfinite_a == 0 && nonfinite_b == 0; }
    // The pass rule of `moestream compare`: every element finite and corr >= min_corr.
    bool passes(double min_corr) const { return finite() && corr >= min_corr; }
};

// a and b must have the same length (asserted).
tensor_stats compare(std::span<const float> a, std::span<const float> b);

// Float dtypes that compare() can take after to_f32: F32, F64, F16, BF16.
bool is_float(safetensors::dtype t);

// Elements of a float dtype as f32. An aligned F32 span is used in place; anything else is
// converted into `storage`. Errors name the dtype when it is not a float one.
result<std::span<const float>> to_f32(safetensors::dtype t, std::span<const std::byte> bytes,
                                      std::vector<float>& storage);

}  // namespace moestream::tools
