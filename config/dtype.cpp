#include "config/dtype.h"

#include <array>
#include <cctype>

#include "config/assert.h"

namespace moestream {
namespace {

// Block geometry from ggml's type table (ggml.c type_traits).
constexpr std::array kTraits{
    dtype_traits{ggml_type::f32, "F32", 1, 4, true},
    dtype_traits{ggml_type::f16, "F16", 1, 2, true},
    dtype_traits{ggml_type::q4_0, "Q4_0", 32, 18, false},
    dtype_traits{ggml_type::q4_1, "Q4_1", 32, 20, false},
    dtype_traits{ggml_type::q5_0, "Q5_0", 32, 22, false},
    dtype_traits{ggml_type::q5_1, "Q5_1", 32, 24, false},
    dtype_traits{ggml_type::q8_0, "Q8_0", 32, 34, true},
    dtype_traits{ggml_type::q8_1, "Q8_1", 32, 36, false},
    dtype_traits{ggml_type::q2_k, "Q2_K", 256, 84, false},
    dtype_traits{ggml_type::q3_k, "Q3_K", 256, 110, false},
    dtype_traits{ggml_type::q4_k, "Q4_K", 256, 144, false},
    dtype_traits{ggml_type::q5_k, "Q5_K", 256, 176, false},
    dtype_traits{ggml_type::q6_k, "Q6_K", 256, 210, false},
    dtype_traits{ggml_type::q8_k, "Q8_K", 256, 292, false},
    dtype_traits{ggml_type::iq2_xxs, "IQ2_XXS", 256, 66, false},
    dtype_traits{ggml_type::iq2_xs, "IQ2_XS", 256, 74, false},
    dtype_traits{ggml_type::iq3_xxs, "IQ3_XXS", 256, 98, false},
    dtype_traits{ggml_type::iq1_s, "IQ1_S", 256, 50, false},
    dtype_traits{ggml_type::iq4_nl, "IQ4_NL", 32, 18, false},
    dtype_traits{ggml_type::iq3_s, "IQ3_S", 256, 110, false},
    dtype_traits{ggml_type::iq2_s, "IQ2_S", 256, 82, false},
    dtype_traits{ggml_type::iq4_xs, "IQ4_XS", 256, 136, false},
    dtype_traits{ggml_type::i8, "I8", 1, 1, false},
    dtype_traits{ggml_type::i16, "I16", 1, 2, false},
    dtype_traits{ggml_type::i32, "I32", 1, 4, false},
    dtype_traits{ggml_type::i64, "I64", 1, 8, false},
    dtype_traits{ggml_type::f64, "F64", 1, 8, false},
    dtype_traits{ggml_type::iq1_m, "IQ1_M", 256, 56, false},
    dtype_traits{ggml_type::bf16, "BF16", 1, 2, true},
    dtype_traits{ggml_type::tq1_0, "TQ1_0", 256, 54, false},
    dtype_traits{ggml_type::tq2_0, "TQ2_0", 256, 66, false},
    dtype_traits{ggml_type::mxfp4, "MXFP4", 32, 17, true},
};

// kTraits' index by type id (-1: no such type), so a lookup, which the matmul paths make per
// tile and per expert view, is one load instead of a scan of the table.
constexpr uint32_t kIdLimit = 64;
constexpr std::array<int8_t, kIdLimit> kIndexById = [] {
    std::array<int8_t, kIdLimit> index{};
    index.fill(-1);
    for (size_t i = 0; i < kTraits.size(); ++i) index[static_cast<uint32_t>(kTraits[i].type)] = int8_t(i);
    return index;
}();

const dtype_traits* find_traits(uint32_t type_id) {
    if (type_id >= kIdLimit || kIndexById[type_id] < 0) return nullptr;
    return &kTraits[size_t(kIndexById[type_id])];
}

bool iequal(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
            return false;
    return true;
}

}  // namespace

std::optional<dtype_traits> dtype_info(uint32_t type_id) {
    if (const dtype_traits* t = find_traits(type_id)) return *t;
    return std::nullopt;
}

const dtype_traits& dtype_info(ggml_type type) {
    const dtype_traits* t = find_traits(static_cast<uint32_t>(type));
    MS_ASSERT_MSG(t != nullptr, "dtype_info: unknown ggml_type");
    return *t;
}

std::string_view dtype_name(ggml_type type) { return dtype_info(type).name; }

std::optional<ggml_type> parse_dtype(std::string_view name) {
    for (const auto& t : kTraits)
        if (iequal(t.name, name)) return t.type;
    return std::nullopt;
}

}  // namespace moestream
