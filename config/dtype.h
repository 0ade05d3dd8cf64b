// Tensor storage types, numbered as in ggml/GGUF so files round-trip. This is shared vocabulary
// for storage/ (file layout) and model/ (kernels); it lives in config/ because config is the only
// library every module links.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace moestream {

enum class ggml_type : uint32_t {
    f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9,
    q2_k = 10, q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15,
    iq2_xxs = 16, iq2_xs = 17, iq3_xxs = 18, iq1_s = 19, iq4_nl = 20, iq3_s = 21, iq2_s = 22,
    iq4_xs = 23, i8 = 24, i16 = 25, i32 = 26, i64 = 27, f64 = 28, iq1_m = 29, bf16 = 30,
    tq1_0 = 34, tq2_0 = 35, mxfp4 = 39,
};

struct dtype_traits {
    ggml_type type;
    std::string_view name;   // ggml's name, e.g. "Q8_0"
    int64_t block_elems;     // elements per block along ne0
    int64_t block_bytes;     // bytes per block
    bool compute_supported;  // the CPU kernels can dequantize / dot it
};

// Traits of a known type, or nullopt for a number that is not a ggml type we know of.
std::optional<dtype_traits> dtype_info(uint32_t type_id);
const dtype_traits& dtype_info(ggml_type type);  // asserts the type is known

// Bytes of a row of n elements (n must be a multiple of the block size).
inline int64_t row_bytes(const dtype_traits& t, int64_t n) { return n / t.block_elems * t.block_bytes; }

std::string_view dtype_name(ggml_type type);
// Parses "F32", "q8_0", "MXFP4", ... (case-insensitive).
std::optional<ggml_type> parse_dtype(std::string_view name);

}  // namespace moestream
