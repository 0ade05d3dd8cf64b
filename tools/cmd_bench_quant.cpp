// `moestream bench quant`: single-thread gemv throughput per weight type, in GB/s of weight
// bytes, next to a plain memory-read bandwidth measured in the same run. Decode is one gemv per
// weight matrix per token, so the fraction of read bandwidth is the number that matters.
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
#include "model/quant.h"
#include "tools/command.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "bench quant";

const cli::option_spec kOptions[] = {
    {"rows", "N", "matrix rows (default 16384)"},
    {"cols", "N", "matrix columns, a multiple of 32 (default 8192)"},
    {"type", "T", "one of F32, F16, BF16, Q8_0, MXFP4 (default: all of them)"},
    {"reps", "N", "timed repetitions, the best is reported (default 5)"},
    {"scalar", "", "force the scalar kernels"},
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

struct gemv_result {
    double seconds;
    double gbps;
};

gemv_result time_gemv(ggml_type type, int64_t rows, int64_t cols, int reps) {
    const auto w = make_matrix(type, rows, cols);
    std::vector<float> x(static_cast<size_t>(cols), 0.5f);
    std::vector<float> y(static_cast<size_t>(rows));
    quant::gemv(type, w.data(), rows, cols, x.data(), y.data());  // warm-up (page faults, caches)
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        quant::gemv(type, w.data(), rows, cols, x.data(), y.data());
        best = std::min(best, seconds_since(t0));
    }
    MS_ASSERT(best > 0);
    return {best, double(w.size()) / best / 1e9};
}

int run(const cli::args& a) {
    auto rows = a.get_int("rows", 16384);
    if (!rows) return usage_error(kName, rows.message());
    auto cols = a.get_int("cols", 8192);
    if (!cols) return usage_error(kName, cols.message());
    auto reps = a.get_int("reps", 5);
    if (!reps) return usage_error(kName, reps.message());
    if (*rows <= 0 || *cols <= 0 || *cols % 32 != 0) return usage_error(kName, "--rows must be > 0 and --cols a positive multiple of 32");
    if (*reps <= 0) return usage_error(kName, "--reps must be > 0");

    std::vector<ggml_type> types{ggml_type::f32, ggml_type::f16, ggml_type::bf16, ggml_type::q8_0, ggml_type::mxfp4};
    if (auto t = a.get("type")) {
        auto parsed = parse_dtype(*t);
        if (!parsed || std::find(types.begin(), types.end(), *parsed) == types.end())
            return usage_error(kName, "--type: '" + *t + "' is not one of F32, F16, BF16, Q8_0, MXFP4");
        types = {*parsed};
    }
    quant::force_scalar(a.flag("scalar"));

    const double mem = read_bandwidth(size_t(512) << 20, int(*reps));
    std::printf("memory read (sum of 512 MiB, 1 thread): %.2f GB/s\n", mem);
    std::printf("gemv %lld x %lld, 1 thread, isa %s\n", static_cast<long long>(*rows),
                static_cast<long long>(*cols), quant::kernel_isa());
    std::printf("%-6s %10s %10s %9s %9s\n", "type", "MiB", "ms", "GB/s", "of read");
    for (ggml_type t : types) {
        const double mib = double(row_bytes(dtype_info(t), *cols) * *rows) / (1 << 20);
        const auto r = time_gemv(t, *rows, *cols, int(*reps));
        const auto name = dtype_name(t);
        std::printf("%-6.*s %10.1f %10.2f %9.2f %8.0f%%\n", int(name.size()), name.data(), mib, r.seconds * 1e3,
                    r.gbps, 100.0 * r.gbps / mem);
    }
    quant::force_scalar(false);
    return 0;
}

const command kCommand{kName, "[--rows N] [--cols N] [--type T] [--reps N] [--scalar]",
                       "Measures single-thread gemv throughput per weight type (GB/s of weight bytes) "
                       "against a plain memory-read bandwidth.",
                       kOptions, run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
