// `moestream bench quant`: gemv throughput per weight type, in GB/s of weight bytes, next to a
// plain memory-read bandwidth measured in the same run with as many threads. Decode is one gemv
// per weight matrix per token, so the fraction of read bandwidth is the number that matters.
// One thread times the single-threaded moestream::matmul; --threads N the pooled one, as decode runs it;
// --decode times many distinct matrices of the --rows x --cols shape, one matmul call each, as
// decode streams its small weight matrices. x is random fp32; --bf16-x rounds it to bf16, as
// decode's norm outputs are, so the bf16-x kernels (BF16 and MXFP4 rows) are what is timed.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "config/assert.h"
#include "config/dtype.h"
#include "model/bf16.h"
#include "model/cpu_matmul.h"
#include "model/memory_bandwidth.h"
#include "model/quant.h"
#include "model/thread_pool.h"
#include "tools/command.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "bench quant";

const cli::option_spec kOptions[] = {
    {"rows", "N", "matrix rows (default 16384; 1024 with --decode)"},
    {"cols", "N", "matrix columns, a multiple of 32 (default 8192; 1024 with --decode)"},
    {"threads", "N", "threads: 1 (default) times the single-threaded matmul, more the pooled one"},
    {"decode", "", "decode-like: distinct rows x cols matrices (512 MiB in all), one matmul call each"},
    {"type", "T", "one of F32, F16, BF16, Q8_0, MXFP4 (default: all of them)"},
    {"reps", "N", "timed repetitions, the best is reported (default 5)"},
    {"scalar", "", "force the scalar kernels"},
    {"bf16-x", "", "round x to bf16 (decode's activations): BF16 and MXFP4 then time the bf16-x kernels"},
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Streaming sum with 4 independent accumulators; AVX2 when present so the loop is limited by
// memory, not by instruction throughput.
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t* p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
    }
    alignas(32) uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
    uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (; i < n; ++i) s += p[i];
    return s;
}

// Integer addition is associative, so the compiler vectorises this with baseline SSE2.
uint64_t sum_scalar(const uint64_t* p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; ++i) s += p[i];
    return s;
}

// Best-of-reps read bandwidth over `bytes` (rounded down to 8-byte words), in GB/s.
double read_bandwidth(size_t bytes, int reps) {
    std::vector<uint64_t> buf(bytes / 8);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;  // touch every page before timing
    const bool avx2 = __builtin_cpu_supports("avx2");
    volatile uint64_t sink = 0;
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        sink = sink + (avx2 ? sum_avx2(buf.data(), buf.size()) : sum_scalar(buf.data(), buf.size()));
        best = std::min(best, seconds_since(t0));
    }
    return double(buf.size() * 8) / best / 1e9;
}

// A rows x cols matrix of `type`: 64 distinct random rows, tiled (values do not change the
// speed of these kernels, and quantizing hundreds of MB would dominate the run).
std::vector<uint8_t> make_matrix(ggml_type type, int64_t rows, int64_t cols) {
    const int64_t rb = row_bytes(dtype_info(type), cols);
    const int64_t seed_rows = std::min<int64_t>(rows, 64);
    std::mt19937 rng(42);
    std::normal_distribution<float> dist(0.0f, 0.02f);
    std::vector<float> src(static_cast<size_t>(cols));
    std::vector<uint8_t> m(size_t(rows * rb));
    for (int64_t r = 0; r < seed_rows; ++r) {
        for (auto& v : src) v = dist(rng);
        quant::quantize_row(type, src.data(), m.data() + r * rb, cols);
    }
    for (int64_t r = seed_rows; r < rows; ++r) std::memcpy(m.data() + r * rb, m.data() + (r % seed_rows) * rb, size_t(rb));
    return m;
}

// The activation row: random fp32 values (none a bf16), or all rounded to bf16.
std::vector<float> make_x(int64_t cols, bool bf16) {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(cols));
    for (auto& v : x) v = bf16 ? round_to_bf16(dist(rng)) : dist(rng);
    return x;
}

struct gemv_result {
    size_t bytes;  // of weights per pass
    double seconds;
    double gbps;
};

// Best of `reps` timed calls of `pass` over `bytes` of weights, after one warm-up call (page
// faults, caches).
template <class Pass>
gemv_result time_passes(size_t bytes, int reps, Pass&& pass) {
    pass();
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        pass();
        best = std::min(best, seconds_since(t0));
    }
    MS_ASSERT(best > 0);
    return {bytes, best, double(bytes) / best / 1e9};
}

// One rows x cols matrix: the single-threaded matmul on one thread, the pooled one on more.
gemv_result time_gemv(thread_pool& pool, ggml_type type, int64_t rows, int64_t cols, int reps, bool bf16_x) {
    const auto w = make_matrix(type, rows, cols);
    const auto x = make_x(cols, bf16_x);
    std::vector<float> y(static_cast<size_t>(rows));
    if (pool.size() == 1)
        return time_passes(w.size(), reps, [&] { matmul(type, w.data(), rows, cols, x.data(), 1, cols, y.data(), rows); });
    return time_passes(w.size(), reps, [&] {
        matmul(pool, type, w.data(), rows, cols, x.data(), 1, cols, y.data(), rows);
    });
}

// Bytes of distinct weights a decode-like pass streams: well above any last-level cache, so every
// call reads its matrix from memory, as decode does.
constexpr size_t kDecodeBytes = size_t(512) << 20;

// Distinct rows x cols matrices filling kDecodeBytes, one pooled matmul call each, so the time
// includes what decode pays per call (waking the pool, short chunks, row tails).
gemv_result time_decode_like(thread_pool& pool, ggml_type type, int64_t rows, int64_t cols, int reps, bool bf16_x) {
    const int64_t mat_bytes = rows * row_bytes(dtype_info(type), cols);
    const int64_t count = std::max<int64_t>(1, int64_t(kDecodeBytes) / mat_bytes);
    const auto one = make_matrix(type, rows, cols);
    std::vector<uint8_t> w(size_t(count * mat_bytes));
    for (int64_t m = 0; m < count; ++m) std::memcpy(w.data() + m * mat_bytes, one.data(), size_t(mat_bytes));
    const auto x = make_x(cols, bf16_x);
    std::vector<float> y(static_cast<size_t>(rows));
    return time_passes(w.size(), reps, [&] {
        for (int64_t m = 0; m < count; ++m)
            matmul(pool, type, w.data() + m * mat_bytes, rows, cols, x.data(), 1, cols, y.data(), rows);
    });
}

int run(const cli::args& a) {
    const bool decode = a.flag("decode");
    const bool bf16_x = a.flag("bf16-x");
    auto rows = a.get_int("rows", decode ? 1024 : 16384);
    if (!rows) return usage_error(kName, rows.message());
    auto cols = a.get_int("cols", decode ? 1024 : 8192);
    if (!cols) return usage_error(kName, cols.message());
    auto reps = a.get_int("reps", 5);
    if (!reps) return usage_error(kName, reps.message());
    auto threads = a.get_int("threads", 1);
    if (!threads) return usage_error(kName, threads.message());
    if (*rows <= 0 || *cols <= 0 || *cols % 32 != 0) return usage_error(kName, "--rows must be > 0 and --cols a positive multiple of 32");
    if (*reps <= 0) return usage_error(kName, "--reps must be > 0");
    if (*threads <= 0 || *threads > 1024) return usage_error(kName, "--threads must be in [1, 1024]");

    std::vector<ggml_type> types{ggml_type::f32, ggml_type::f16, ggml_type::bf16, ggml_type::q8_0, ggml_type::mxfp4};
    if (auto t = a.get("type")) {
        auto parsed = parse_dtype(*t);
        if (!parsed || std::find(types.begin(), types.end(), *parsed) == types.end())
            return usage_error(kName, "--type: '" + *t + "' is not one of F32, F16, BF16, Q8_0, MXFP4");
        types = {*parsed};
    }
    quant::force_scalar(a.flag("scalar"));

    thread_pool pool{static_cast<int>(*threads)};
    const long long nr = *rows, nc = *cols;
    const char* x_kind = bf16_x ? "bf16" : "fp32";
    double mem = 0;
    if (pool.size() == 1 && !decode) {
        mem = read_bandwidth(size_t(512) << 20, int(*reps));
        std::printf("memory read (sum of 512 MiB, 1 thread): %.2f GB/s\n", mem);
        std::printf("gemv %lld x %lld, 1 thread, isa %s, x %s\n", nr, nc, quant::kernel_isa(), x_kind);
    } else {
        mem = measure_read_bandwidth(pool, size_t(512) << 20, int(*reps)) / 1e9;
        std::printf("memory read (sum of 512 MiB, %d threads): %.2f GB/s\n", pool.size(), mem);
        if (decode)
            std::printf("decode-like: distinct %lld x %lld matrices, %zu MiB per pass, one matmul call each, %d threads, isa %s, x %s\n",
                        nr, nc, kDecodeBytes >> 20, pool.size(), quant::kernel_isa(), x_kind);
        else std::printf("matmul %lld x %lld, 1 x row, %d threads, isa %s, x %s\n", nr, nc, pool.size(), quant::kernel_isa(), x_kind);
    }
    std::printf("%-6s %10s %10s %9s %9s\n", "type", "MiB", "ms", "GB/s", "of read");
    for (ggml_type t : types) {
        const auto r = decode ? time_decode_like(pool, t, *rows, *cols, int(*reps), bf16_x)
                              : time_gemv(pool, t, *rows, *cols, int(*reps), bf16_x);
        const double mib = double(r.bytes) / (1 << 20);
        const auto name = dtype_name(t);
        std::printf("%-6.*s %10.1f %10.2f %9.2f %8.0f%%\n", int(name.size()), name.data(), mib, r.seconds * 1e3,
                    r.gbps, 100.0 * r.gbps / mem);
    }
    quant::force_scalar(false);
    return 0;
}

const command kCommand{kName, "[--rows N] [--cols N] [--threads N] [--decode] [--type T] [--reps N] [--scalar] [--bf16-x]",
                       "Measures gemv throughput per weight type (GB/s of weight bytes) against a plain "
                       "memory-read bandwidth with as many threads.",
                       kOptions, run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
