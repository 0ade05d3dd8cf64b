// Tests for model/quant: every expected value here is computed independently of quant.cpp (hand
// built blocks, closed-form decoders written out below, double-precision references).
#include "model/quant.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/bf16.h"
#include "model/cpu_matmul.h"
#include "model/quant_internal.h"
#include "tests/common/test_support.h"

using namespace moestream;
using namespace moestream::quant;

namespace {

// ---- independent reference decoders (formulas from the format specs, not from quant.cpp) ----

double ref_f16(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const double sign = s ? -1.0 : 1.0;
    if (e == 31) return m ? std::nan("") : sign * INFINITY;
    if (e == 0) return sign * std::ldexp(m, -24);
    return sign * std::ldexp(1024 + m, e - 25);
}

double ref_e4m3(uint8_t v) {
    const int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    if (e == 15 && m == 7) return std::nan("");
    const double mag = e == 0 ? (m / 8.0) * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    return s ? -mag : mag;
}

constexpr std::array<double, 8> kE2m1Mag{0, 0.5, 1, 1.5, 2, 3, 4, 6};

double ref_e2m1(uint8_t nib) { return (nib & 8 ? -1.0 : 1.0) * kE2m1Mag[nib & 7]; }

double ref_e8m0(uint8_t e) { return e == 255 ? std::nan("") : std::ldexp(1.0, int(e) - 127); }

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = uint8_t(rng());
    return v;
}

// Scales restricted to a sane range so random dot products do not overflow.
std::vector<uint8_t> random_scales(size_t n, uint32_t seed) {
    auto v = random_bytes(n, seed);
    for (auto& b : v) b = uint8_t(120 + b % 12);
    return v;
}

std::vector<uint8_t> quantized(ggml_type t, const std::vector<float>& src, int64_t rows, int64_t cols) {
    const int64_t rb = row_bytes(dtype_info(t), cols);
    std::vector<uint8_t> out(size_t(rows * rb));
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, src.data() + r * cols, out.data() + r * rb, cols);
    return out;
}

// Restores the dispatcher even when a check throws.
struct scalar_guard {
    explicit scalar_guard(bool on) { force_scalar(on); }
    ~scalar_guard() { force_scalar(false); }
};

constexpr std::array kComputeTypes{ggml_type::f32, ggml_type::f16, ggml_type::bf16, ggml_type::q8_0,
                                   ggml_type::mxfp4};

}  // namespace

BOOST_AUTO_TEST_SUITE(quant)

// ---------------------------------------------------------------- f16

BOOST_AUTO_TEST_CASE(f16_decode_all_codes_and_roundtrip) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = f16_to_f32(uint16_t(h));
        const double want = ref_f16(uint16_t(h));
        if (std::isnan(want)) {
            BOOST_TEST_REQUIRE(std::isnan(f));
            BOOST_TEST_REQUIRE(std::isnan(f16_to_f32(f32_to_f16(f))));  // NaN stays NaN
            continue;
        }
        BOOST_TEST_REQUIRE(double(f) == want, "code " << h);
        BOOST_TEST_REQUIRE(f32_to_f16(f) == h, "roundtrip " << h);
    }
}

BOOST_AUTO_TEST_CASE(f16_rounds_to_nearest_even) {
    // Midpoints between every pair of adjacent positive finite codes (exact in fp32: 12 bits).
    for (uint16_t h = 0; h < 0x7bff; ++h) {
        const float mid = float((ref_f16(h) + ref_f16(uint16_t(h + 1))) / 2);
        const uint16_t even = (h & 1) ? uint16_t(h + 1) : h;
        BOOST_TEST_REQUIRE(f32_to_f16(mid) == even, "tie above " << h);
        BOOST_TEST_REQUIRE(f32_to_f16(std::nextafter(mid, 0.0f)) == h);
        BOOST_TEST_REQUIRE(f32_to_f16(std::nextafter(mid, INFINITY)) == uint16_t(h + 1));
        BOOST_TEST_REQUIRE(f32_to_f16(-mid) == uint16_t(even | 0x8000));
    }
    BOOST_TEST(f32_to_f16(65519.0f) == 0x7bff);
    BOOST_TEST(f32_to_f16(65520.0f) == 0x7c00);  // tie between 65504 and 65536 -> even -> inf
    BOOST_TEST(f32_to_f16(1e9f) == 0x7c00);
    BOOST_TEST(f32_to_f16(-INFINITY) == 0xfc00);
    BOOST_TEST(f32_to_f16(0x1p-25f) == 0x0000);   // half the smallest subnormal: tie to 0
    BOOST_TEST(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
    BOOST_TEST(f32_to_f16(0x1.8p-24f) == 0x0002);  // 1.5 ulp: tie to even 2
    BOOST_TEST(f32_to_f16(1e-30f) == 0x0000);
    BOOST_TEST(f32_to_f16(-0.0f) == 0x8000);
    BOOST_TEST(f32_to_f16(std::numeric_limits<float>::denorm_min()) == 0x0000);
    BOOST_TEST((f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7fff) > 0x7c00);
}

// ---------------------------------------------------------------- bf16

BOOST_AUTO_TEST_CASE(bf16_roundtrip_ties_and_specials) {
    for (uint32_t b = 0; b < 65536; ++b) {
        const float f = bf16_to_f32(uint16_t(b));
        BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(f) == b << 16);
        if (std::isnan(f)) BOOST_TEST_REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
        else BOOST_TEST_REQUIRE(f32_to_bf16(f) == b);
        if ((b & 0x7f80) == 0x7f80) continue;  // no finite midpoint above inf/NaN codes
        const uint32_t mid = (b << 16) | 0x8000u;
        const uint16_t even = (b & 1) ? uint16_t(b + 1) : uint16_t(b);
        BOOST_TEST_REQUIRE(f32_to_bf16(std::bit_cast<float>(mid)) == even, "tie " << b);
        BOOST_TEST_REQUIRE(f32_to_bf16(std::bit_cast<float>(mid + 1)) == uint16_t(b + 1));
        BOOST_TEST_REQUIRE(f32_to_bf16(std::bit_cast<float>(mid - 1)) == uint16_t(b));
    }
    // A NaN whose payload sits only in the low 16 bits must not truncate to inf.
    BOOST_TEST(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));
    BOOST_TEST(f32_to_bf16(std::bit_cast<float>(0x7f7fffffu)) == 0x7f80);  // FLT_MAX -> inf
    BOOST_TEST(f32_to_bf16(std::bit_cast<float>(0x00000001u)) == 0x0000);  // tiny subnormal
    BOOST_TEST(f32_to_bf16(1.0f) == 0x3f80);
}

// bf16 storage of rounded values (model/bf16.h: attention keys): every code round-trips, and a
// float with any of its low 16 bits set is refused rather than truncated.
BOOST_AUTO_TEST_CASE(bf16_storage_of_exact_values) {
    std::vector<float> all(65536);
    for (uint32_t b = 0; b < 65536; ++b) {
        all[b] = bf16_value(uint16_t(b));
        BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(all[b]) == b << 16);
    }
    std::vector<uint16_t> bits(all.size());
    BOOST_TEST(to_bf16_bits_exact(all.data(), int64_t(all.size()), bits.data()));
    for (uint32_t b = 0; b < 65536; ++b) BOOST_TEST_REQUIRE(bits[b] == b);
    for (uint32_t low : {1u, 0x8000u, 0xffffu}) {
        std::vector<float> row{1.0f, std::bit_cast<float>(0x3f800000u | low), -2.0f};
        uint16_t out[3];
        BOOST_TEST(!to_bf16_bits_exact(row.data(), 3, out), "low bits " << low);
    }
}

// ---------------------------------------------------------------- e4m3

BOOST_AUTO_TEST_CASE(e4m3_all_codes) {
    int nans = 0;
    for (int v = 0; v < 256; ++v) {
        const double want = ref_e4m3(uint8_t(v));
        const float got = e4m3_to_f32(uint8_t(v));
        if (std::isnan(want)) {
            ++nans;
            BOOST_TEST_REQUIRE(std::isnan(got));
            continue;
        }
        BOOST_TEST_REQUIRE(double(got) == want, "code " << v);
        BOOST_TEST_REQUIRE(f32_to_e4m3(got) == v, "roundtrip " << v);
    }
    BOOST_TEST(nans == 2);
    BOOST_TEST(e4m3_to_f32(0x7e) == 448.0f);
    BOOST_TEST(e4m3_to_f32(0x01) == 0x1p-9f);
}

BOOST_AUTO_TEST_CASE(e4m3_encode_rne_and_saturation) {
    // Ties between adjacent positive codes go to the even code.
    for (int v = 0; v < 0x7e; ++v) {
        const float mid = float((ref_e4m3(uint8_t(v)) + ref_e4m3(uint8_t(v + 1))) / 2);
        const int even = (v & 1) ? v + 1 : v;
        BOOST_TEST_REQUIRE(f32_to_e4m3(mid) == even, "tie above " << v);
        BOOST_TEST_REQUIRE(f32_to_e4m3(-mid) == (even | 0x80));
        BOOST_TEST_REQUIRE(f32_to_e4m3(std::nextafter(mid, INFINITY)) == v + 1);
        BOOST_TEST_REQUIRE(f32_to_e4m3(std::nextafter(mid, 0.0f)) == v);
    }
    BOOST_TEST(f32_to_e4m3(448.0f) == 0x7e);
    BOOST_TEST(f32_to_e4m3(464.0f) == 0x7e);  // would round to 480, which does not exist
    BOOST_TEST(f32_to_e4m3(1e30f) == 0x7e);
    BOOST_TEST(f32_to_e4m3(INFINITY) == 0x7e);
    BOOST_TEST(f32_to_e4m3(-INFINITY) == 0xfe);
    BOOST_TEST(f32_to_e4m3(-500.0f) == 0xfe);
    BOOST_TEST(f32_to_e4m3(0x1p-10f) == 0x00);   // half the smallest subnormal: tie to 0
    BOOST_TEST(f32_to_e4m3(0x1.8p-9f) == 0x02);  // tie to even subnormal 2
    BOOST_TEST(f32_to_e4m3(0x1p-20f) == 0x00);
    BOOST_TEST(std::isnan(e4m3_to_f32(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()))));
}

// ---------------------------------------------------------------- e8m0, e2m1

BOOST_AUTO_TEST_CASE(e8m0_values) {
    for (int e = 0; e < 255; ++e) BOOST_TEST_REQUIRE(double(e8m0_to_f32(uint8_t(e))) == ref_e8m0(uint8_t(e)));
    BOOST_TEST(e8m0_to_f32(127) == 1.0f);
    BOOST_TEST(e8m0_to_f32(128) == 2.0f);
    BOOST_TEST(e8m0_to_f32(0) == 0x1p-127f);
    BOOST_TEST(e8m0_to_f32(1) == 0x1p-126f);
    BOOST_TEST(e8m0_to_f32(254) == 0x1p127f);
    BOOST_TEST(std::isnan(e8m0_to_f32(255)));
}

BOOST_AUTO_TEST_CASE(e2m1_codes_and_rounding) {
    const std::array<float, 16> want{0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; ++c) {
        BOOST_TEST(e2m1_to_f32(uint8_t(c)) == want[size_t(c)]);
        BOOST_TEST(std::signbit(e2m1_to_f32(uint8_t(c))) == (c >= 8));
        BOOST_TEST(f32_to_e2m1(want[size_t(c)]) == c);
    }
    // Midpoints go to the even code (docs section 3.8).
    const std::array<std::pair<float, float>, 7> ties{
        {{0.25f, 0}, {0.75f, 1}, {1.25f, 1}, {1.75f, 2}, {2.5f, 2}, {3.5f, 4}, {5.0f, 4}}};
    for (auto [x, y] : ties) {
        BOOST_TEST(e2m1_to_f32(f32_to_e2m1(x)) == y, "x=" << x);
        BOOST_TEST(e2m1_to_f32(f32_to_e2m1(-x)) == -y, "x=" << -x);
    }
    BOOST_TEST(f32_to_e2m1(0.26f) == 1);
    BOOST_TEST(f32_to_e2m1(5.01f) == 7);
    BOOST_TEST(f32_to_e2m1(7.0f) == 7);   // clamped
    BOOST_TEST(f32_to_e2m1(100.0f) == 7);
    BOOST_TEST(f32_to_e2m1(-INFINITY) == 15);
}

// ---------------------------------------------------------------- hand-built GGUF blocks

BOOST_AUTO_TEST_CASE(q8_0_hand_block) {
    std::array<uint8_t, 34> blk{};
    blk[0] = 0x00;
    blk[1] = 0x38;  // fp16 0x3800 = 0.5
    for (int j = 0; j < 32; ++j) blk[size_t(2 + j)] = uint8_t(int8_t(j - 16));
    blk[2 + 13] = uint8_t(int8_t(-3));
    std::array<float, 32> out{};
    dequantize_row(ggml_type::q8_0, blk.data(), out.data(), 32);
    BOOST_TEST(out[13] == -1.5f);
    BOOST_TEST(out[0] == -8.0f);
    BOOST_TEST(out[31] == 7.5f);
    std::array<float, 32> x{};
    x.fill(1.0f);
    // sum of (j - 16) * 0.5 over j, with element 13 replaced by -3: (-16 - (-3 + 3)) * 0.5 = -8
    double want = 0;
    for (int j = 0; j < 32; ++j) want += (j == 13 ? -3 : j - 16) * 0.5;
    for (bool scalar : {true, false}) {
        scalar_guard g(scalar);
        BOOST_TEST(dot_row(ggml_type::q8_0, blk.data(), x.data(), 32) == float(want));
    }
}

BOOST_AUTO_TEST_CASE(mxfp4_hand_blocks) {
    for (int e : {0, 1, 2, 100, 127, 128, 254}) {
        std::array<uint8_t, 17> blk{};
        blk[0] = uint8_t(e);
        for (int j = 0; j < 16; ++j) blk[size_t(1 + j)] = uint8_t(j | ((15 - j) << 4));
        std::array<float, 32> out{};
        dequantize_row(ggml_type::mxfp4, blk.data(), out.data(), 32);
        for (int j = 0; j < 16; ++j) {
            // float(): 6 * 2^127 overflows fp32 to inf, which is the right fp32 answer.
            BOOST_TEST_REQUIRE(out[size_t(j)] == float(ref_e2m1(uint8_t(j)) * ref_e8m0(uint8_t(e))));
            BOOST_TEST_REQUIRE(out[size_t(j + 16)] == float(ref_e2m1(uint8_t(15 - j)) * ref_e8m0(uint8_t(e))));
        }
    }
    // e = 127 (scale 1), byte 0 = 0x7f: element 0 = 6, element 16 = -6... (high nibble 7 = +6)
    std::array<uint8_t, 17> blk{};
    blk[0] = 127;
    blk[1] = 0xf7;  // element 0 low nibble 7 = +6, element 16 high nibble 0xf = -6
    std::array<float, 32> x{};
    x[0] = 2.0f;
    x[16] = 0.5f;
    for (bool scalar : {true, false}) {
        scalar_guard g(scalar);
        BOOST_TEST(dot_row(ggml_type::mxfp4, blk.data(), x.data(), 32) == 6.0f * 2.0f - 6.0f * 0.5f);
    }
}

// ---------------------------------------------------------------- quantizers

BOOST_AUTO_TEST_CASE(q8_0_quantize_error_bound_and_ggml_rule) {
    auto src = random_floats(32 * 64, 1, 3.0f);
    src[5] = 0.0f;
    std::fill(src.begin() + 32, src.begin() + 64, 0.0f);  // all-zero block: d = 0, q = 0
    auto q = quantized(ggml_type::q8_0, src, 1, int64_t(src.size()));
    std::vector<float> back(src.size());
    dequantize_row(ggml_type::q8_0, q.data(), back.data(), int64_t(src.size()));
    for (size_t b = 0; b < src.size() / 32; ++b) {
        double amax = 0;
        for (size_t j = 0; j < 32; ++j) amax = std::max(amax, double(std::fabs(src[b * 32 + j])));
        const double d = amax / 127;
        for (size_t j = 0; j < 32; ++j) {
            const size_t i = b * 32 + j;
            // round(x/d) error plus the fp16 rounding of d (|q| <= 127, rel. error <= 2^-11).
            BOOST_TEST_REQUIRE(std::fabs(double(back[i]) - src[i]) <= d * (0.5 + 127.0 / 2048) + 1e-30);
            const int8_t qi = int8_t(q[b * 34 + 2 + j]);
            if (amax > 0 && std::fabs(src[i]) == amax) BOOST_TEST_REQUIRE(std::abs(qi) == 127);
        }
    }
    BOOST_TEST(back[32] == 0.0f);
}

// Independent statement of ggml's MXFP4 rule: E = floor(log2 amax) - 2 + 127, element = nearest
// E2M1 value times 2^(E-127), ties toward the smaller magnitude, zero encoded as +0.
std::array<uint8_t, 17> ref_mxfp4_block(const float* x) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    std::array<uint8_t, 17> b{};
    const int e = amax > 0 ? int(std::floor(std::log2(amax))) - 2 + 127 : 0;
    b[0] = uint8_t(e);
    const double s = std::ldexp(1.0, e - 127);
    auto code = [&](float v) {
        const double a = std::fabs(v) / s;
        int best = 0;
        for (int c = 1; c < 8; ++c)
            if (std::fabs(kE2m1Mag[size_t(c)] - a) < std::fabs(kE2m1Mag[size_t(best)] - a)) best = c;
        return uint8_t(best == 0 ? 0 : best | (v < 0 ? 8 : 0));
    };
    for (int j = 0; j < 16; ++j) b[size_t(1 + j)] = uint8_t(code(x[j]) | (code(x[j + 16]) << 4));
    return b;
}

BOOST_AUTO_TEST_CASE(mxfp4_quantize_matches_ggml_rule_and_error_bound) {
    auto src = random_floats(32 * 200, 2, 0.05f);
    // A block made of exact ties at scale 1 (amax 6 -> E = 127): 0.25 -> 0, 0.75 -> 0.5,
    // 2.5 -> 2, 5 -> 4 under the smaller-magnitude rule.
    const std::array<float, 8> ties{0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.75f};
    for (size_t j = 0; j < 32; ++j) src[j] = j == 31 ? 6.0f : ties[j % 8];
    std::fill(src.begin() + 32, src.begin() + 64, 0.0f);
    src[64 + 3] = 7.9f;  // amax in [4, 8) * 2^0: values above 6 clip to 6
    auto q = quantized(ggml_type::mxfp4, src, 1, int64_t(src.size()));
    std::vector<float> back(src.size());
    dequantize_row(ggml_type::mxfp4, q.data(), back.data(), int64_t(src.size()));
    for (size_t b = 0; b < src.size() / 32; ++b) {
        const auto want = ref_mxfp4_block(src.data() + b * 32);
        BOOST_TEST_REQUIRE(std::memcmp(want.data(), q.data() + b * 17, 17) == 0, "block " << b);
        const double s = ref_e8m0(q[b * 17]);
        for (size_t j = 0; j < 32; ++j) {
            const double x = src[b * 32 + j], y = back[b * 32 + j];
            // Half the widest E2M1 step (2 between 4 and 6) inside the range, clipping above 6.
            BOOST_TEST_REQUIRE(std::fabs(x - y) <= std::max(1.0 * s, std::fabs(x) - 6 * s) + 1e-30);
        }
    }
    BOOST_TEST(back[1] == 0.5f);  // 0.75: tie -> smaller magnitude (ggml), not even code 1.0
    BOOST_TEST(back[4] == 2.0f);
    BOOST_TEST(back[7] == -0.5f);
    BOOST_TEST(back[64 + 3] == 6.0f);
    BOOST_TEST(q[17] == 0);  // all-zero block: E = 0, every nibble +0
}

BOOST_AUTO_TEST_CASE(dense_quantize_roundtrip) {
    auto src = random_floats(96, 3);
    for (ggml_type t : {ggml_type::f32, ggml_type::f16, ggml_type::bf16}) {
        auto q = quantized(t, src, 1, 96);
        std::vector<float> back(96);
        dequantize_row(t, q.data(), back.data(), 96);
        const double tol = t == ggml_type::f32 ? 0 : t == ggml_type::f16 ? 0x1p-11 : 0x1p-8;
        for (size_t i = 0; i < 96; ++i)
            BOOST_TEST_REQUIRE(std::fabs(back[i] - src[i]) <= tol * std::fabs(src[i]));
    }
}

// ---------------------------------------------------------------- kernels

// Lengths around every loop boundary of the SIMD kernels: multiples of 32 that are not multiples
// of 64 or 256, block counts around the Q8_0 scale group of 16, and odd lengths for the dense
// types (masked tails below 16, 32 and 64 elements).
constexpr int64_t kKernelLengths[] = {32, 64, 96, 160, 352, 480, 512, 544, 1056, 4128,
                                      1, 7, 15, 17, 31, 33, 37, 63, 65, 101, 127, 129, 1001};

// |fast - scalar| against the scalar kernel on row `q`, relative to sum |w x| (only the summation
// order differs between the kernels).
void check_against_scalar(ggml_type t, const std::vector<uint8_t>& q, const std::vector<float>& x, int64_t n,
                          float fast, const std::string& what) {
    std::vector<float> w(static_cast<size_t>(n));
    dequantize_row(t, q.data(), w.data(), n);
    double mag = 0;
    for (size_t i = 0; i < size_t(n); ++i) mag += std::fabs(double(w[i]) * x[i]);
    scalar_guard g(true);
    const float slow = dot_row(t, q.data(), x.data(), n);
    BOOST_TEST_REQUIRE(std::fabs(double(fast) - slow) <= 1e-5 * mag + 1e-30,
                       dtype_name(t) << " " << what << " n=" << n << " " << fast << " vs " << slow);
}

BOOST_AUTO_TEST_CASE(simd_matches_scalar_on_odd_lengths) {
    if (std::string(kernel_isa()) == "scalar") {
        BOOST_TEST_MESSAGE("no AVX2 on this CPU: only the scalar path is tested");
        return;
    }
    for (int64_t n : kKernelLengths) {
        const auto src = random_floats(size_t(n), uint32_t(n), 2.0f);
        const auto x = random_floats(size_t(n), uint32_t(n + 1));
        for (ggml_type t : kComputeTypes) {
            if (n % dtype_info(t).block_elems != 0) continue;
            const auto q = quantized(t, src, 1, n);
            check_against_scalar(t, q, x, n, dot_row(t, q.data(), x.data(), n), kernel_isa());
        }
    }
}

// On an AVX-512 machine the dispatcher never picks the AVX2 dots, so call them directly.
BOOST_AUTO_TEST_CASE(avx2_dots_match_scalar_when_avx512_is_picked) {
    if (std::string(kernel_isa()) != "avx512") {
        BOOST_TEST_MESSAGE("dispatcher does not use AVX-512: covered by the test above");
        return;
    }
    const auto avx2_dot = [](ggml_type t) {
        switch (t) {
            case ggml_type::f32: return detail::dot_f32_avx2;
            case ggml_type::f16: return detail::dot_f16_avx2;
            case ggml_type::bf16: return detail::dot_bf16_avx2;
            case ggml_type::q8_0: return detail::dot_q8_0_avx2;
            default: return detail::dot_mxfp4_avx2;
        }
    };
    for (int64_t n : kKernelLengths) {
        const auto src = random_floats(size_t(n), uint32_t(3 * n), 2.0f);
        const auto x = random_floats(size_t(n), uint32_t(3 * n + 1));
        for (ggml_type t : kComputeTypes) {
            if (n % dtype_info(t).block_elems != 0) continue;
            const auto q = quantized(t, src, 1, n);
            check_against_scalar(t, q, x, n, avx2_dot(t)(q.data(), x.data(), n), "avx2");
        }
    }
}

// The four-row kernels give each row the single-row kernel's bits (cpu_matmul's reproducibility
// rests on it), on the SIMD path and on the scalar one; matmul, which uses them, equals dot_row.
BOOST_AUTO_TEST_CASE(four_row_kernels_equal_one_row_bitwise) {
    for (bool scalar : {false, true}) {
        scalar_guard g(scalar);
        for (int64_t n : kKernelLengths) {
            for (ggml_type t : kComputeTypes) {
                if (n % dtype_info(t).block_elems != 0) continue;
                const int64_t rows = 11;  // two passes of four and a tail of three
                const auto src = random_floats(size_t(rows * n), uint32_t(5 * n), 2.0f);
                const auto x = random_floats(size_t(n), uint32_t(5 * n + 1));
                const auto q = quantized(t, src, rows, n);
                const int64_t rb = row_bytes(dtype_info(t), n);
                const detail::row_kernel k = detail::pick_row_kernel(t);
                std::vector<float> y(size_t(rows), NAN);
                matmul(t, q.data(), rows, n, x.data(), 1, n, y.data(), rows);
                for (int64_t first = 0; first + 4 <= rows; ++first) {  // every alignment of a pass
                    float four[4];
                    k.four(q.data() + first * rb, rb, x.data(), n, four);
                    for (int64_t r = 0; r < 4; ++r) {
                        const float one = dot_row(t, q.data() + (first + r) * rb, x.data(), n);
                        BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(four[r]) == std::bit_cast<uint32_t>(one),
                                           dtype_name(t) << " scalar=" << scalar << " n=" << n << " row " << first + r);
                    }
                }
                for (int64_t r = 0; r < rows; ++r) {
                    const float one = dot_row(t, q.data() + r * rb, x.data(), n);
                    BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(y[size_t(r)]) == std::bit_cast<uint32_t>(one),
                                       dtype_name(t) << " gemv scalar=" << scalar << " n=" << n << " row " << r);
                }
            }
        }
    }
}

// The AVX-512 four-row kernels against their one-row kernels directly, whichever set the
// dispatcher picked on this CPU (it keeps single rows on AMD), and the bf16 x bf16 kernels
// against the fp32 BF16 kernel's value within the summation-order bound.
BOOST_AUTO_TEST_CASE(avx512_four_row_kernels_equal_one_row_on_any_vendor) {
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl")) {
        BOOST_TEST_MESSAGE("no AVX-512 F/BW/VL on this CPU: skipped");
        return;
    }
    struct pair {
        ggml_type t;
        detail::dot_fn one;
        detail::dot4_fn four;
    };
    const pair pairs[] = {{ggml_type::f32, detail::dot_f32_avx512, detail::dot4_f32_avx512},
                          {ggml_type::bf16, detail::dot_bf16_avx512, detail::dot4_bf16_avx512},
                          {ggml_type::q8_0, detail::dot_q8_0_avx512, detail::dot4_q8_0_avx512},
                          {ggml_type::mxfp4, detail::dot_mxfp4_avx512, detail::dot4_mxfp4_avx512}};
    const bool bf16x = __builtin_cpu_supports("avx512bf16");
    for (int64_t n : kKernelLengths)
        for (const pair& p : pairs) {
            if (n % dtype_info(p.t).block_elems != 0) continue;
            const int64_t rows = 4;
            const auto src = random_floats(size_t(rows * n), uint32_t(7 * n), 2.0f);
            auto x = random_floats(size_t(n), uint32_t(7 * n + 1));
            for (auto& v : x) v = round_to_bf16(v);  // bf16-exact, so the bf16 x bf16 kernels apply too
            const auto q = quantized(p.t, src, rows, n);
            const int64_t rb = row_bytes(dtype_info(p.t), n);
            float four[4];
            p.four(q.data(), rb, x.data(), n, four);
            std::vector<uint16_t> xb(static_cast<size_t>(n));
            BOOST_REQUIRE(detail::pack_bf16_exact(x.data(), n, xb.data()));
            float four_x[4];
            if (bf16x && p.t == ggml_type::bf16) detail::dot4_bf16x_avx512(q.data(), rb, xb.data(), n, four_x);
            for (int64_t r = 0; r < rows; ++r) {
                const float one = p.one(q.data() + r * rb, x.data(), n);
                BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(four[r]) == std::bit_cast<uint32_t>(one),
                                   dtype_name(p.t) << " n=" << n << " row " << r);
                if (!(bf16x && p.t == ggml_type::bf16)) continue;
                const float one_x = detail::dot_bf16x_avx512(q.data() + r * rb, xb.data(), n);
                BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(four_x[r]) == std::bit_cast<uint32_t>(one_x), "bf16x n=" << n);
                double mag = 0;
                std::vector<float> w(static_cast<size_t>(n));
                dequantize_row(p.t, q.data() + r * rb, w.data(), n);
                for (int64_t i = 0; i < n; ++i) mag += std::fabs(double(w[size_t(i)]) * x[size_t(i)]);
                BOOST_TEST_REQUIRE(std::fabs(double(one_x) - double(one)) <= 1e-5 * mag + 1e-30, "bf16x n=" << n);
            }
        }
}

// ---------------------------------------------------------------- MXFP4 x bf16 (avx512_bf16)

bool cpu_has_mxfp4_bf16x() {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bf16");
}

// Precondition: the case is reported skipped, with the reason, on CPUs without the kernels.
boost::test_tools::assertion_result needs_mxfp4_bf16x(boost::unit_test::test_unit_id) {
    boost::test_tools::assertion_result r(cpu_has_mxfp4_bf16x());
    if (!r) r.message() << "skipped: the CPU lacks AVX-512 F/BW/VL/VBMI/BF16";
    return r;
}

float bits_to_f32(uint32_t u) { return std::bit_cast<float>(u); }

// The pair layout written out: per 32-value block, word 2i = bf16 bits of x[i], word 2i + 1 of
// x[i + 16].
std::vector<uint16_t> ref_pairs(const std::vector<float>& x) {
    std::vector<uint16_t> p(x.size());
    for (size_t b = 0; b < x.size(); b += 32)
        for (size_t i = 0; i < 16; ++i) {
            p[b + 2 * i] = uint16_t(std::bit_cast<uint32_t>(x[b + i]) >> 16);
            p[b + 2 * i + 1] = uint16_t(std::bit_cast<uint32_t>(x[b + i + 16]) >> 16);
        }
    return p;
}

// n bf16 values whose magnitudes are 2^e times a random 8-bit significand in [1, 2), e uniform
// in [lo_exp, hi_exp], with random signs and about one in eight an exact zero of either sign.
std::vector<float> random_bf16(size_t n, uint32_t seed, int lo_exp, int hi_exp) {
    std::mt19937 rng(seed);
    std::vector<float> x(n);
    for (auto& v : x) {
        const uint32_t r = rng();
        if (r % 8 == 0) {
            v = r & 8 ? -0.0f : 0.0f;
            continue;
        }
        const int e = lo_exp + int((r >> 4) % uint32_t(hi_exp - lo_exp + 1));
        v = std::ldexp(float(128 + ((r >> 12) & 127)) / 128.0f, e) * ((r >> 20) & 1 ? -1.0f : 1.0f);
    }
    return x;
}

// Every way the bf16-x MXFP4 kernels can compute rows of `q` against x (one row, four rows at
// every alignment, dot_row's dispatch) gives the fp32 kernel's bits, NaN and infinities included.
void check_mxfp4_bf16x_rows(const std::vector<uint8_t>& q, int64_t rows, const std::vector<float>& x,
                            const std::string& what) {
    const int64_t n = int64_t(x.size()), rb = row_bytes(dtype_info(ggml_type::mxfp4), n);
    std::vector<uint16_t> xp(x.size());
    BOOST_TEST_REQUIRE(detail::pack_mxfp4_bf16x_avx512(x.data(), n, xp.data()), what);
    BOOST_TEST_REQUIRE((xp == ref_pairs(x)), what);
    std::vector<float> want(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
        want[size_t(r)] = detail::dot_mxfp4_avx512(q.data() + r * rb, x.data(), n);
        const float one = detail::dot_mxfp4_bf16x_avx512(q.data() + r * rb, xp.data(), n);
        const float routed = dot_row(ggml_type::mxfp4, q.data() + r * rb, x.data(), n);
        BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(one) == std::bit_cast<uint32_t>(want[size_t(r)]),
                           what << " n=" << n << " row " << r << ": " << one << " vs " << want[size_t(r)]);
        BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(routed) == std::bit_cast<uint32_t>(want[size_t(r)]), what << " dot_row");
    }
    for (int64_t first = 0; first + 4 <= rows; ++first) {
        float four[4];
        detail::dot4_mxfp4_bf16x_avx512(q.data() + first * rb, rb, xp.data(), n, four);
        for (int64_t r = 0; r < 4; ++r)
            BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(four[r]) == std::bit_cast<uint32_t>(want[size_t(first + r)]),
                               what << " four-row n=" << n << " row " << first + r);
    }
}

// The dispatcher hands MXFP4 rows to the bf16-x kernels exactly where the CPU has them.
BOOST_AUTO_TEST_CASE(mxfp4_bf16x_dispatch) {
    const detail::bf16x_kernel k = detail::pick_bf16x_kernel(ggml_type::mxfp4);
    if (!cpu_has_mxfp4_bf16x() || std::string(kernel_isa()) != "avx512") {
        BOOST_TEST((k.one == nullptr));
        BOOST_TEST_MESSAGE("no AVX-512 BF16/VBMI kernel set on this CPU: MXFP4 rows take the fp32 kernels");
        return;
    }
    BOOST_TEST_REQUIRE((k.one == &detail::dot_mxfp4_bf16x_avx512));
    BOOST_TEST((k.pack == &detail::pack_mxfp4_bf16x_avx512));
    BOOST_TEST((k.four != nullptr));
    BOOST_TEST((detail::pick_bf16x_kernel(ggml_type::q8_0).one == nullptr));
    scalar_guard g(true);
    BOOST_TEST((detail::pick_bf16x_kernel(ggml_type::mxfp4).one == nullptr));
}

// x qualifies when every value is a bf16 that is 0 or has 2^-100 <= |x| <= 2^100; one value that
// is not, in either half of any block, disqualifies the whole vector.
BOOST_AUTO_TEST_CASE(mxfp4_bf16x_pack_qualifies_and_lays_out_pairs, *boost::unit_test::precondition(needs_mxfp4_bf16x)) {
    auto x = random_bf16(32 * 5, 21, -100, 99);
    x[3] = 0x1p-100f;
    x[20] = -0x1p-100f;
    x[40] = 0x1p100f;
    x[63] = -0x1p100f;
    x[70] = 0.0f;
    x[71] = -0.0f;
    std::vector<uint16_t> xp(x.size());
    BOOST_TEST_REQUIRE(detail::pack_mxfp4_bf16x_avx512(x.data(), int64_t(x.size()), xp.data()));
    BOOST_TEST((xp == ref_pairs(x)));
    const float bad[] = {bits_to_f32(std::bit_cast<uint32_t>(1.5f) | 1u),       // low bits set
                         bits_to_f32(std::bit_cast<uint32_t>(-3.0f) | 0x8000u),  // low bits set
                         0x1p-101f, -0x1.fep-101f,                              // tiny
                         bits_to_f32(0x00010000u), bits_to_f32(0x807f0000u),    // subnormal bf16
                         0x1.02p100f, -0x1p101f, 0x1p127f,                      // huge
                         INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(), bits_to_f32(0xff810000u)};
    for (float v : bad)
        for (size_t pos : {size_t(0), size_t(15), size_t(16), size_t(31), size_t(32 * 4 + 17)}) {
            auto y = x;
            y[pos] = v;
            BOOST_TEST_REQUIRE(!detail::pack_mxfp4_bf16x_avx512(y.data(), int64_t(y.size()), xp.data()),
                               "value bits " << std::hex << std::bit_cast<uint32_t>(v) << std::dec << " at " << pos);
        }
    BOOST_TEST(detail::pack_mxfp4_bf16x_avx512(x.data(), 0, xp.data()));  // nothing to disqualify
}

// All 256 code bytes (so every (element i, element i + 16) pair of E2M1 codes) under every e8m0
// scale, against x of ordinary and of extreme magnitudes: the fp32 kernel's bits, including the
// infinities and NaNs that the largest scales and e = 0xff produce.
BOOST_AUTO_TEST_CASE(mxfp4_bf16x_equals_fp32_kernel_on_every_code_pair_and_scale,
                     *boost::unit_test::precondition(needs_mxfp4_bf16x)) {
    constexpr int64_t n = 32 * 16, rows = 5;
    const std::vector<std::vector<float>> xs{random_bf16(n, 31, -3, 2), random_bf16(n, 32, -100, 99),
                                             random_bf16(n, 33, -100, -90), random_bf16(n, 34, 90, 99)};
    for (int e = 0; e < 256; ++e) {
        // Row r: block k holds code bytes 16k + j, rotated by r blocks and reversed on odd rows.
        std::vector<uint8_t> q(size_t(rows * 16 * 17));
        for (int64_t r = 0; r < rows; ++r)
            for (int k = 0; k < 16; ++k) {
                uint8_t* blk = q.data() + (r * 16 + k) * 17;
                blk[0] = uint8_t(e);
                for (int j = 0; j < 16; ++j) {
                    const int byte = 16 * ((k + r) % 16) + j;
                    blk[1 + j] = uint8_t(r % 2 ? 255 - byte : byte);
                }
            }
        for (size_t i = 0; i < xs.size(); ++i) check_mxfp4_bf16x_rows(q, rows, xs[i], "e=" + std::to_string(e) + " x" + std::to_string(i));
    }
}

// Random matrices of 1 to 40 blocks a row and decode's widths, from random bytes with the scales
// of trained weights and from quantized values.
BOOST_AUTO_TEST_CASE(mxfp4_bf16x_equals_fp32_kernel_on_random_rows, *boost::unit_test::precondition(needs_mxfp4_bf16x)) {
    constexpr int64_t rows = 7;  // every alignment of a four-row pass, and single rows
    std::vector<int64_t> blocks;
    for (int64_t nb = 1; nb <= 40; ++nb) blocks.push_back(nb);
    for (int64_t nb : {64, 128, 224}) blocks.push_back(nb);
    for (int64_t nb : blocks)
        for (uint32_t trial = 0; trial < 3; ++trial) {
        const int64_t n = nb * 32;
        const uint32_t seed = uint32_t(41 * nb + 7 * trial);
        auto q = random_bytes(size_t(rows * nb * 17), seed);
        const auto scales = random_bytes(size_t(rows * nb), seed + 1);
        for (size_t b = 0; b < scales.size(); ++b) q[b * 17] = uint8_t(100 + scales[b] % 41);  // 2^-28 .. 2^12
        const auto quantized_rows = quantized(ggml_type::mxfp4, random_floats(size_t(rows * n), seed + 2, 0.05f), rows, n);
        auto x = random_floats(size_t(n), seed + 3, 3.0f);
        for (auto& v : x) v = round_to_bf16(v);
        check_mxfp4_bf16x_rows(q, rows, x, "random bytes");
        check_mxfp4_bf16x_rows(quantized_rows, rows, x, "quantized");
        check_mxfp4_bf16x_rows(q, rows, random_bf16(size_t(n), seed + 4, -100, 99), "random bytes, wide x");
        }
}

// An exact zero keeps the fp32 kernel's sign: blocks that underflow to -0 leave every accumulator
// lane at -0, then all-zero codes against negative x add -0 (the fp32 kernel's lo * x + hi * x
// sum is -0 there), so the row's value is -0 only if the bf16-x kernel's pair sums are -0 too.
BOOST_AUTO_TEST_CASE(mxfp4_bf16x_keeps_the_sign_of_zero, *boost::unit_test::precondition(needs_mxfp4_bf16x)) {
    constexpr int64_t nb = 5, n = nb * 32;
    std::vector<uint8_t> q(size_t(4 * nb * 17), 0);  // blocks 2..4: scale 2^-128, every code 0
    for (int64_t r = 0; r < 4; ++r)
        for (int64_t b = 0; b < 2; ++b) {
            uint8_t* blk = q.data() + (r * nb + b) * 17;
            blk[0] = 0;  // scale 2^-128
            for (int j = 0; j < 16; ++j) blk[1 + j] = 0x01;  // element j: code 1, element j + 16: code 0
        }
    std::vector<float> x(size_t(n), -1.0f);
    for (int64_t i = 0; i < 64; ++i) x[size_t(i)] = -0x1p-100f;  // -2^-100 * 2^-128 rounds to -0
    const float fp32 = detail::dot_mxfp4_avx512(q.data(), x.data(), n);
    BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(fp32) == 0x80000000u);  // the case arises
    check_mxfp4_bf16x_rows(q, 4, x, "signed zeros");
}

// x that does not qualify (low bits set, tiny, subnormal or huge values) takes the fp32 kernel in
// dot_row and matmul: the fp32 kernel's bits, where the bf16-x kernel would treat a subnormal as 0
// or, with products that overflow, could add them in another order.
BOOST_AUTO_TEST_CASE(mxfp4_unqualified_x_takes_the_fp32_kernel) {
    {
        // 12 * 2^127 overflows to +inf first in the fp32 kernel; -12 * 2^127 then keeps it +inf.
        std::array<uint8_t, 17> blk{};
        blk[0] = 127;
        blk[1] = 0xf7;  // element 0: code 7 (doubled 12), element 16: code 15 (doubled -12)
        std::array<float, 32> x{};
        x[0] = x[16] = 0x1p127f;
        const float want = detail::pick_row_kernel(ggml_type::mxfp4).one(blk.data(), x.data(), 32);
        BOOST_TEST(want == INFINITY);
        BOOST_TEST(std::bit_cast<uint32_t>(dot_row(ggml_type::mxfp4, blk.data(), x.data(), 32)) == std::bit_cast<uint32_t>(want));
        // A subnormal x (a bf16: 2^-127) times code 1, scaled by 2^126: 0.5, not 0.
        blk[0] = 254;
        blk[1] = 0x01;
        x[0] = bits_to_f32(0x00400000u);
        x[16] = 0.0f;
        BOOST_TEST(dot_row(ggml_type::mxfp4, blk.data(), x.data(), 32) == 0.5f);
    }
    constexpr int64_t rows = 6, n = 32 * 9;
    const auto q = quantized(ggml_type::mxfp4, random_floats(size_t(rows * n), 51, 2.0f), rows, n);
    const int64_t rb = row_bytes(dtype_info(ggml_type::mxfp4), n);
    const detail::row_kernel fp32 = detail::pick_row_kernel(ggml_type::mxfp4);
    auto base = random_floats(size_t(n), 52);
    for (auto& v : base) v = round_to_bf16(v);
    const float odd[] = {bits_to_f32(std::bit_cast<uint32_t>(0.75f) | 0x10u), 0x1p-101f, bits_to_f32(0x00400000u), 0x1p101f,
                         0x1p127f};
    for (float v : odd)
        for (size_t pos : {size_t(5), size_t(16 + 5), size_t(n - 1)}) {
            auto x = base;
            x[pos] = v;
            std::vector<float> y(size_t(rows), NAN);
            moestream::matmul(ggml_type::mxfp4, q.data(), rows, n, x.data(), 1, n, y.data(), rows);
            for (int64_t r = 0; r < rows; ++r) {
                const float want = fp32.one(q.data() + r * rb, x.data(), n);
                BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(dot_row(ggml_type::mxfp4, q.data() + r * rb, x.data(), n)) ==
                                   std::bit_cast<uint32_t>(want));
                BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(y[size_t(r)]) == std::bit_cast<uint32_t>(want));
            }
        }
}

BOOST_AUTO_TEST_CASE(dequantize_f16_paths_agree) {
    std::vector<uint8_t> raw = random_bytes(2 * 77, 9);
    std::vector<float> a(77), b(77);
    {
        scalar_guard g(true);
        dequantize_row(ggml_type::f16, raw.data(), a.data(), 77);
    }
    dequantize_row(ggml_type::f16, raw.data(), b.data(), 77);
    for (size_t i = 0; i < 77; ++i) BOOST_TEST_REQUIRE(std::bit_cast<uint32_t>(a[i]) == std::bit_cast<uint32_t>(b[i]));
}

BOOST_AUTO_TEST_CASE(gemv_matches_double_reference) {
    const int64_t rows = 37, cols = 800;  // 800 = 25 blocks: a multiple of 32, not of 256
    const auto src = random_floats(size_t(rows * cols), 4);
    const auto x = random_floats(size_t(cols), 5);
    for (ggml_type t : kComputeTypes) {
        const auto q = quantized(t, src, rows, cols);
        const int64_t rb = row_bytes(dtype_info(t), cols);
        for (bool scalar : {true, false}) {
            scalar_guard g(scalar);
            std::vector<float> y(size_t(rows), NAN);
            matmul(t, q.data(), rows, cols, x.data(), 1, cols, y.data(), rows);
            for (int64_t r = 0; r < rows; ++r) {
                // The reference decodes with the independent formulas where practical.
                std::vector<float> w(static_cast<size_t>(cols));
                dequantize_row(t, q.data() + r * rb, w.data(), cols);
                if (t == ggml_type::q8_0)
                    for (int64_t i = 0; i < cols; ++i) {
                        const uint8_t* blk = q.data() + r * rb + (i / 32) * 34;
                        w[size_t(i)] = float(int8_t(blk[2 + i % 32]) * ref_f16(uint16_t(blk[0] | blk[1] << 8)));
                    }
                double want = 0, mag = 0;
                for (int64_t i = 0; i < cols; ++i) {
                    want += double(w[size_t(i)]) * x[size_t(i)];
                    mag += std::fabs(double(w[size_t(i)]) * x[size_t(i)]);
                }
                BOOST_TEST_REQUIRE(std::fabs(y[size_t(r)] - want) <= 1e-5 * mag,
                                   dtype_name(t) << (scalar ? " scalar" : " simd") << " row " << r);
            }
        }
    }
}

// ---------------------------------------------------------------- checkpoint formats

BOOST_AUTO_TEST_CASE(fp4_repack_is_lossless) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 32}, {3, 96}, {7, 160}, {5, 2304}}) {
        const auto w = random_bytes(size_t(rows * cols / 2), uint32_t(rows * 7 + cols));
        auto scales = random_bytes(size_t(rows * cols / 32), uint32_t(cols));
        scales[0] = 0xff;  // NaN scale survives the repack too
        std::vector<uint8_t> mx(size_t(rows * cols / 32 * 17));
        repack_fp4_to_mxfp4(w.data(), scales.data(), rows, cols, mx.data());
        std::vector<uint8_t> w2(w.size()), s2(scales.size());
        unpack_mxfp4_to_fp4(mx.data(), rows, cols, w2.data(), s2.data());
        BOOST_TEST_REQUIRE(w2 == w);
        BOOST_TEST_REQUIRE(s2 == scales);

        std::vector<float> a(size_t(rows * cols)), b(size_t(rows * cols));
        dequantize_fp4_checkpoint(w.data(), scales.data(), rows, cols, a.data());
        for (int64_t r = 0; r < rows; ++r)
            dequantize_row(ggml_type::mxfp4, mx.data() + r * (cols / 32) * 17, b.data() + r * cols, cols);
        for (int64_t i = 0; i < rows * cols; ++i) {
            // Independent decode of the checkpoint layout: element i is nibble (i & 1) of byte i/2.
            const int64_t r = i / cols, c = i % cols;
            const uint8_t nib = uint8_t((w[size_t(r * cols / 2 + c / 2)] >> (4 * (c & 1))) & 15);
            const double want = ref_e2m1(nib) * ref_e8m0(scales[size_t(r * cols / 32 + c / 32)]);
            BOOST_TEST_REQUIRE(same_value(a[size_t(i)], float(want)), "i=" << i);
            BOOST_TEST_REQUIRE(same_value(a[size_t(i)], b[size_t(i)]), "i=" << i);
        }
    }
}

BOOST_AUTO_TEST_CASE(fp4_repack_layout_by_hand) {
    // Checkpoint bytes k = 0..15 hold elements (2k, 2k+1); fill element i with code i % 16.
    std::array<uint8_t, 16> w{};
    for (int k = 0; k < 16; ++k) w[size_t(k)] = uint8_t(((2 * k) % 16) | (((2 * k + 1) % 16) << 4));
    const uint8_t scale = 130;
    std::array<uint8_t, 17> mx{};
    repack_fp4_to_mxfp4(w.data(), &scale, 1, 32, mx.data());
    BOOST_TEST(mx[0] == 130);
    for (int j = 0; j < 16; ++j) BOOST_TEST(mx[size_t(1 + j)] == uint8_t((j % 16) | (((j + 16) % 16) << 4)));
}

BOOST_AUTO_TEST_CASE(fp8_tiled_dequantize_ragged_edges) {
    const int64_t rows = 45, cols = 70, tile = 32;  // 2 x 3 tiles, the last ones partial
    const auto w = random_bytes(size_t(rows * cols), 11);
    const auto scales = random_scales(2 * 3, 12);
    std::vector<float> out(size_t(rows * cols));
    dequantize_fp8_tiled(w.data(), scales.data(), rows, cols, tile, out.data());
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            const double want = ref_e4m3(w[size_t(r * cols + c)]) * ref_e8m0(scales[size_t((r / 32) * 3 + c / 32)]);
            BOOST_TEST_REQUIRE(same_value(out[size_t(r * cols + c)], float(want)), r << "," << c);
        }
}

BOOST_AUTO_TEST_CASE(fp8_engram_row) {
    const auto v = random_bytes(256, 13);
    const auto scales = random_scales(8, 14);
    std::vector<float> out(256);
    dequantize_fp8_row_scaled(v.data(), scales.data(), 256, out.data());
    for (size_t i = 0; i < 256; ++i)
        BOOST_TEST_REQUIRE(same_value(out[i], float(ref_e4m3(v[i]) * ref_e8m0(scales[i / 32]))));
}

BOOST_AUTO_TEST_CASE(isa_reporting) {
    const std::string isa = kernel_isa();
    BOOST_TEST((isa == "avx512" || isa == "avx2" || isa == "scalar"));
    scalar_guard g(true);
    BOOST_TEST(std::string(kernel_isa()) == "scalar");
}

BOOST_AUTO_TEST_SUITE_END()
