// Tests for model/cpu_matmul: values against a double-precision reference built from
// quant::dequantize_row, and the reproducibility contract (bit-identical values whatever the
// batch, strides, thread count and partition; equal to quant::dot_row).
#include "model/cpu_matmul.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "model/bf16.h"
#include "model/memory_bandwidth.h"
#include "model/quant.h"
#include "model/quant_internal.h"
#include "model/thread_pool.h"
#include "tests/common/test_support.h"

using namespace moestream;

namespace {

constexpr std::array kTypes{ggml_type::f32, ggml_type::f16, ggml_type::bf16, ggml_type::q8_0, ggml_type::mxfp4};

struct shape {
    int64_t out_rows, in_cols;
};
// 300 x 1024 spans several tiles and chunks for the wide types; 100 x 4096 does for all types.
// Out-row counts with every remainder mod 4 exercise the four-row passes and their tails.
constexpr std::array kShapes{shape{1, 64},   shape{7, 64},    shape{300, 64},  shape{1, 96},    shape{6, 96},
                             shape{7, 96},   shape{300, 96},  shape{1, 1024},  shape{5, 1024},  shape{7, 1024},
                             shape{300, 1024}, shape{101, 544}, shape{100, 4096}};

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

struct matrix {
    ggml_type type;
    int64_t out_rows, in_cols, row_bytes;
    std::vector<uint8_t> bytes;
    std::vector<float> dequantized;  // what the kernels should multiply by
};

matrix make_matrix(ggml_type t, shape s, uint32_t seed) {
    matrix m{t, s.out_rows, s.in_cols, row_bytes(dtype_info(t), s.in_cols), {}, {}};
    const auto src = random_floats(size_t(s.out_rows * s.in_cols), seed);
    m.bytes.resize(size_t(m.out_rows * m.row_bytes));
    m.dequantized.resize(src.size());
    for (int64_t o = 0; o < m.out_rows; ++o) {
        quant::quantize_row(t, src.data() + o * s.in_cols, m.bytes.data() + o * m.row_bytes, s.in_cols);
        quant::dequantize_row(t, m.bytes.data() + o * m.row_bytes, m.dequantized.data() + o * s.in_cols, s.in_cols);
    }
    return m;
}

// n_rows activation rows of in_cols values, x_stride apart (the padding holds NaN: never read).
std::vector<float> make_x(int64_t n_rows, int64_t in_cols, int64_t x_stride, uint32_t seed) {
    const auto v = random_floats(size_t(n_rows * in_cols), seed);
    std::vector<float> x(size_t(std::max<int64_t>(n_rows * x_stride, 1)), NAN);
    for (int64_t r = 0; r < n_rows; ++r) std::memcpy(&x[size_t(r * x_stride)], &v[size_t(r * in_cols)], size_t(in_cols) * 4);
    return x;
}

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

constexpr float kSentinel = -12345.5f;

// Runs the pooled (pool != nullptr) or single-threaded matmul into a y of stride y_stride whose
// padding is checked to stay untouched; returns y.
std::vector<float> run(thread_pool* pool, const matrix& m, const std::vector<float>& x, int64_t n_rows,
                       int64_t x_stride, int64_t y_stride) {
    std::vector<float> y(size_t(n_rows * y_stride), kSentinel);
    if (pool) matmul(*pool, m.type, m.bytes.data(), m.out_rows, m.in_cols, x.data(), n_rows, x_stride, y.data(), y_stride);
    else matmul(m.type, m.bytes.data(), m.out_rows, m.in_cols, x.data(), n_rows, x_stride, y.data(), y_stride);
    for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t o = m.out_rows; o < y_stride; ++o) BOOST_REQUIRE(y[size_t(r * y_stride + o)] == kSentinel);
    return y;
}

// Runs the batch of n_rows x rows (x_stride apart) on each pool (nullptr: single-threaded) and
// each row alone, and calls check(r, o, got, alone, x row r) for every value of the batch: the
// row-by-row kernel choices (bf16-x or fp32) must not depend on the rows beside it.
template <class Check>
void check_batch_and_rows(std::span<thread_pool* const> pools, const matrix& m, const std::vector<float>& x,
                          int64_t n_rows, int64_t x_stride, int64_t y_stride, Check&& check) {
    for (thread_pool* pool : pools) {
        const auto y = run(pool, m, x, n_rows, x_stride, y_stride);
        for (int64_t r = 0; r < n_rows; ++r) {
            const float* xr = x.data() + r * x_stride;
            const auto alone = run(pool, m, std::vector<float>(xr, xr + m.in_cols), 1, m.in_cols, m.out_rows);
            for (int64_t o = 0; o < m.out_rows; ++o) check(r, o, y[size_t(r * y_stride + o)], alone[size_t(o)], xr);
        }
    }
}

// Restores the dispatcher even when a check throws.
struct scalar_guard {
    explicit scalar_guard(bool on) { quant::force_scalar(on); }
    ~scalar_guard() { quant::force_scalar(false); }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(cpu_matmul)

BOOST_AUTO_TEST_CASE(matches_double_reference) {
    thread_pool pool(2);
    uint32_t seed = 1;
    for (ggml_type t : kTypes)
        for (shape s : kShapes) {
            const matrix m = make_matrix(t, s, ++seed);
            const int64_t n_rows = 3, x_stride = s.in_cols + 5, y_stride = s.out_rows + 2;
            const auto x = make_x(n_rows, s.in_cols, x_stride, ++seed);
            const auto y = run(&pool, m, x, n_rows, x_stride, y_stride);
            for (int64_t r = 0; r < n_rows; ++r)
                for (int64_t o = 0; o < s.out_rows; ++o) {
                    double want = 0, mag = 0;
                    for (int64_t i = 0; i < s.in_cols; ++i) {
                        const double p = double(m.dequantized[size_t(o * s.in_cols + i)]) * x[size_t(r * x_stride + i)];
                        want += p;
                        mag += std::fabs(p);
                    }
                    const double got = y[size_t(r * y_stride + o)];
                    BOOST_REQUIRE_MESSAGE(std::fabs(got - want) <= 1e-5 * mag,
                                          dtype_name(t) << " " << s.out_rows << "x" << s.in_cols << " r=" << r
                                                        << " o=" << o << ": " << got << " vs " << want);
                }
        }
}

// The reproducibility contract: a batch row equals the same row computed alone, bit for bit, for
// every thread count, with and without stride padding, and with the single-threaded overload.
BOOST_AUTO_TEST_CASE(bit_identical_across_batch_strides_and_threads) {
    thread_pool p1(1), p2(2), p3(3);
    thread_pool* pools[] = {nullptr, &p1, &p2, &p3};
    uint32_t seed = 100;
    for (ggml_type t : kTypes)
        for (shape s : kShapes) {
            const matrix m = make_matrix(t, s, ++seed);
            const int64_t n_rows = 5;
            const auto x_packed = make_x(n_rows, s.in_cols, s.in_cols, ++seed);
            const auto x_padded = make_x(n_rows, s.in_cols, s.in_cols + 19, seed);  // same values
            // Reference: each row alone, single-threaded.
            std::vector<std::vector<float>> alone;
            for (int64_t r = 0; r < n_rows; ++r) {
                const std::vector<float> xr(x_packed.begin() + r * s.in_cols, x_packed.begin() + (r + 1) * s.in_cols);
                alone.push_back(run(nullptr, m, xr, 1, s.in_cols, s.out_rows));
            }
            for (thread_pool* pool : pools) {
                for (int variant = 0; variant < 4; ++variant) {
                    const bool pad_x = variant & 1, pad_y = variant & 2;
                    const int64_t x_stride = pad_x ? s.in_cols + 19 : s.in_cols;
                    const int64_t y_stride = pad_y ? s.out_rows + 3 : s.out_rows;
                    const auto y = run(pool, m, pad_x ? x_padded : x_packed, n_rows, x_stride, y_stride);
                    for (int64_t r = 0; r < n_rows; ++r)
                        for (int64_t o = 0; o < s.out_rows; ++o)
                            BOOST_REQUIRE_MESSAGE(same_bits(y[size_t(r * y_stride + o)], alone[size_t(r)][size_t(o)]),
                                                  dtype_name(t) << " " << s.out_rows << "x" << s.in_cols << " threads="
                                                                << (pool ? pool->size() : 0) << " variant=" << variant
                                                                << " r=" << r << " o=" << o);
                }
                // A row's value does not depend on its position: row 3 alone, at position 0 of a
                // batch of 1, through the pool.
                const std::vector<float> x3(x_packed.begin() + 3 * s.in_cols, x_packed.begin() + 4 * s.in_cols);
                const auto y3 = run(pool, m, x3, 1, s.in_cols, s.out_rows);
                for (int64_t o = 0; o < s.out_rows; ++o) BOOST_REQUIRE(same_bits(y3[size_t(o)], alone[3][size_t(o)]));
            }
        }
}

// matmul uses the dispatcher's row-dot kernel, so it agrees with quant::dot_row bit for bit, on
// the vectorised path and on the forced scalar path.
BOOST_AUTO_TEST_CASE(equals_quant_dot_row_bitwise) {
    thread_pool pool(2);
    for (bool scalar : {false, true}) {
        scalar_guard g(scalar);
        uint32_t seed = 500;
        for (ggml_type t : kTypes)
            for (shape s : {shape{300, 96}, shape{37, 1024}}) {
                const matrix m = make_matrix(t, s, ++seed);
                const int64_t n_rows = 4;
                const auto x = make_x(n_rows, s.in_cols, s.in_cols, ++seed);
                const auto y = run(&pool, m, x, n_rows, s.in_cols, s.out_rows);
                for (int64_t r = 0; r < n_rows; ++r)
                    for (int64_t o = 0; o < s.out_rows; ++o) {
                        const float want = quant::dot_row(t, m.bytes.data() + o * m.row_bytes, x.data() + r * s.in_cols, s.in_cols);
                        BOOST_REQUIRE_MESSAGE(same_bits(y[size_t(r * s.out_rows + o)], want),
                                              dtype_name(t) << " scalar=" << scalar << " r=" << r << " o=" << o);
                    }
            }
    }
}

// Dense rows of any length (masked tails of the SIMD kernels), out-row counts 1..9 (four-row
// passes and tails), pooled and single-threaded: equal to quant::dot_row bit for bit.
BOOST_AUTO_TEST_CASE(dense_odd_lengths_equal_quant_dot_row_bitwise) {
    thread_pool pool(3);
    uint32_t seed = 900;
    for (ggml_type t : {ggml_type::f32, ggml_type::f16, ggml_type::bf16})
        for (int64_t in_cols : {1, 15, 17, 31, 33, 63, 65, 100, 1000})
            for (int64_t out_rows = 1; out_rows <= 9; ++out_rows) {
                const matrix m = make_matrix(t, shape{out_rows, in_cols}, ++seed);
                const int64_t n_rows = 2;
                const auto x = make_x(n_rows, in_cols, in_cols + 3, ++seed);
                for (thread_pool* p : {&pool, static_cast<thread_pool*>(nullptr)}) {
                    const auto y = run(p, m, x, n_rows, in_cols + 3, out_rows);
                    for (int64_t r = 0; r < n_rows; ++r)
                        for (int64_t o = 0; o < out_rows; ++o) {
                            const float want = quant::dot_row(t, m.bytes.data() + o * m.row_bytes, &x[size_t(r * (in_cols + 3))], in_cols);
                            BOOST_REQUIRE_MESSAGE(same_bits(y[size_t(r * out_rows + o)], want),
                                                  dtype_name(t) << " " << out_rows << "x" << in_cols << " r=" << r << " o=" << o);
                        }
                }
            }
}

// x rows that are exactly bf16 (norm outputs) take the bf16 x bf16 kernels on CPUs with
// avx512_bf16, others the fp32 ones, row by row: a batch mixing both kinds equals dot_row and each
// row alone bit for bit, for every thread count, and stays within the double reference's bound.
BOOST_AUTO_TEST_CASE(bf16_rows_with_bf16_exact_x) {
    thread_pool p1(1), p3(3);
    thread_pool* pools[] = {nullptr, &p1, &p3};
    uint32_t seed = 900;
    for (shape s : kShapes) {
        const matrix m = make_matrix(ggml_type::bf16, s, ++seed);
        const int64_t n_rows = 4, x_stride = s.in_cols + 3, y_stride = s.out_rows + 1;
        auto x = make_x(n_rows, s.in_cols, x_stride, ++seed);
        for (int64_t r = 0; r < n_rows; r += 2)  // rows 0 and 2 exact, 1 and 3 not
            for (int64_t i = 0; i < s.in_cols; ++i) x[size_t(r * x_stride + i)] = round_to_bf16(x[size_t(r * x_stride + i)]);
        check_batch_and_rows(pools, m, x, n_rows, x_stride, y_stride, [&](int64_t r, int64_t o, float got, float alone, const float* xr) {
            const float want = quant::dot_row(ggml_type::bf16, m.bytes.data() + o * m.row_bytes, xr, s.in_cols);
            BOOST_REQUIRE_MESSAGE(same_bits(got, want) && same_bits(got, alone),
                                  s.out_rows << "x" << s.in_cols << " r=" << r << " o=" << o);
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < s.in_cols; ++i) {
                const double p = double(m.dequantized[size_t(o * s.in_cols + i)]) * xr[i];
                ref += p;
                mag += std::fabs(p);
            }
            BOOST_REQUIRE(std::fabs(got - ref) <= 1e-5 * mag);
        });
    }
}

// MXFP4 rows: x rows that qualify (bf16 values, none nonzero below 2^-100 or above 2^100) take
// the bf16-x kernels on CPUs with avx512_bf16 and avx512_vbmi, the others the fp32 kernels, row
// by row; both give the fp32 kernel's bits, so a batch mixing them equals the dispatcher's fp32
// row kernel, dot_row and each row alone, for every thread count.
BOOST_AUTO_TEST_CASE(mxfp4_rows_with_bf16_exact_x) {
    if (!quant::detail::pick_bf16x_kernel(ggml_type::mxfp4).one)
        BOOST_TEST_MESSAGE("no MXFP4 bf16-x kernels on this CPU: every row takes the fp32 kernel");
    thread_pool p1(1), p3(3);
    thread_pool* pools[] = {nullptr, &p1, &p3};
    const quant::detail::row_kernel fp32 = quant::detail::pick_row_kernel(ggml_type::mxfp4);
    uint32_t seed = 1300;
    for (shape s : kShapes) {
        const matrix m = make_matrix(ggml_type::mxfp4, s, ++seed);
        const int64_t n_rows = 5, x_stride = s.in_cols + 3, y_stride = s.out_rows + 1;
        auto x = make_x(n_rows, s.in_cols, x_stride, ++seed);
        // Rows 0, 2, 3 and 4 bf16 (1 is not); row 3 also holds a value below 2^-100, row 4 one above
        // 2^100, so only rows 0 and 2 qualify.
        for (int64_t r : {0, 2, 3, 4})
            for (int64_t i = 0; i < s.in_cols; ++i) x[size_t(r * x_stride + i)] = round_to_bf16(x[size_t(r * x_stride + i)]);
        x[size_t(3 * x_stride + s.in_cols / 2)] = 0x1p-110f;
        x[size_t(4 * x_stride + 1)] = -0x1p101f;
        check_batch_and_rows(pools, m, x, n_rows, x_stride, y_stride, [&](int64_t r, int64_t o, float got, float alone, const float* xr) {
            const uint8_t* row = m.bytes.data() + o * m.row_bytes;
            BOOST_REQUIRE_MESSAGE(same_bits(got, fp32.one(row, xr, s.in_cols)) &&
                                      same_bits(got, quant::dot_row(ggml_type::mxfp4, row, xr, s.in_cols)) &&
                                      same_bits(got, alone),
                                  s.out_rows << "x" << s.in_cols << " r=" << r << " o=" << o);
        });
    }
}

BOOST_AUTO_TEST_CASE(empty_shapes_write_nothing) {
    thread_pool pool(2);
    const matrix m = make_matrix(ggml_type::q8_0, shape{4, 64}, 7);
    const auto x = make_x(2, 64, 64, 8);
    std::vector<float> y(8, kSentinel);
    matmul(pool, m.type, m.bytes.data(), 0, 64, x.data(), 2, 64, y.data(), 4);
    matmul(pool, m.type, m.bytes.data(), 4, 64, x.data(), 0, 64, y.data(), 4);
    for (float v : y) BOOST_TEST(v == kSentinel);
}

// The benchmark's ceiling: only sanity here (the value depends on the machine and its load).
BOOST_AUTO_TEST_CASE(read_bandwidth_is_plausible) {
    thread_pool pool(2);
    const double bw = measure_read_bandwidth(pool, size_t(4) << 20, 2);
    BOOST_TEST(bw > 1e8);    // more than 0.1 GB/s
    BOOST_TEST(bw < 1e13);   // less than 10 TB/s
    BOOST_TEST(measure_read_bandwidth(pool, 1, 1) > 0);  // rounds up to one line
}

BOOST_AUTO_TEST_SUITE_END()
