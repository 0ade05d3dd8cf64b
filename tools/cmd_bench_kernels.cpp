// moestream bench kernels: the CUDA matmul kernels on the expert and dense shapes of mini and of
// flash (random weights of those shapes, rotated over more than the L2), for MXFP4, Q8_0 and BF16
// at batch 1, 2 and 4, as a fraction of the device-to-device copy bandwidth measured in the same
// run (read + write bytes per second), with cuBLAS BF16 on the same shapes beside them.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "config/config.h"
#include "tools/command.h"

#if MOESTREAM_HAVE_CUDA
#include "model/cuda/cuda_backend.h"
#include "model/cuda/kernel_bench.h"
#endif

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "bench kernels";

#if MOESTREAM_HAVE_CUDA

struct shape {
    const char* model;
    const char* what;
    int64_t rows, cols;
    int jobs;
    bool pair;
    bool expert;  // routed experts (MXFP4, Q8_0, BF16 compared); dense: the file's types
};

// One layer's matmuls of each model (dsv41-architecture.md §2, §7.1): the 6 routed experts'
// gate/up pairs and downs, each set as one launch, and the dense projections a decode step runs.
const shape kShapes[] = {
    {"mini", "experts gate+up (6 pairs)", 512, 1024, 6, true, true},
    {"mini", "experts down (6)", 1024, 512, 6, false, true},
    {"mini", "wq_b", 4096, 256, 1, false, false},
    {"mini", "wo_b", 1024, 1024, 1, false, false},
    {"mini", "shared gate+up", 512, 1024, 1, true, false},
    {"mini", "lm head", 129280, 1024, 1, false, false},
    {"flash", "experts gate+up (6 pairs)", 2304, 5120, 6, true, true},
    {"flash", "experts down (6)", 5120, 2304, 6, false, true},
    {"flash", "wq_a", 1280, 5120, 1, false, false},
    {"flash", "wq_b", 32768, 1280, 1, false, false},
    {"flash", "wo_b", 5120, 8192, 1, false, false},
    {"flash", "shared gate+up", 2304, 5120, 1, true, false},
};

int run(const cli::args& a) {
    auto rounds = a.get_int("rounds", 15);
    if (!rounds) return usage_error(kName, rounds.message());
    if (*rounds < 3) return usage_error(kName, "--rounds must be >= 3");
    const std::string only = a.get_or("shapes", "mini,flash");
    std::vector<int64_t> batches;
    {
        const std::string list = a.get_or("batches", "1,2,4");
        size_t at = 0;
        while (at <= list.size()) {
            const size_t end = std::min(list.find(',', at), list.size());
            const std::string item = list.substr(at, end - at);
            char* stop = nullptr;
            const long long v = std::strtoll(item.c_str(), &stop, 10);
            if (item.empty() || *stop != '\0' || v < 1 || v > 4096)
                return usage_error(kName, "--batches takes x row counts from 1 to 4096, comma-separated");
            batches.push_back(v);
            at = end + 1;
        }
    }
    auto be = cuda::make_backend({});
    if (!be) return fail(kName, be.message());
    backend& gpu = **be;
    std::printf("bench kernels: %s, median of %lld rounds (min-max)\n", gpu.device_description().c_str(),
                static_cast<long long>(*rounds));
    auto copy = cuda::copy_seconds(gpu, size_t(2) << 30, int(*rounds));
    if (!copy) return fail(kName, copy.message());
    const double d2d = 2.0 * double(size_t(2) << 30) / copy->median;
    std::printf("device-to-device copy (2 GiB, read + write): %.0f GB/s (%.0f-%.0f)\n\n", d2d / 1e9,
                2.0 * double(size_t(2) << 30) / copy->max / 1e9, 2.0 * double(size_t(2) << 30) / copy->min / 1e9);
    std::printf("%-6s %-26s %-11s %5s %10s %8s %7s %14s %7s %9s %7s\n", "model", "matmuls", "type", "batch", "us", "GB/s",
                "ratio", "cuBLAS bf16 us", "ratio", "graph us", "ratio");
    // The experts' MXFP4 in both layouts: tiled (as the expert cache holds them on this backend)
    // and in the file's rows (the kernel for untiled matrices).
    struct kind {
        ggml_type type;
        weight_layout layout;
        const char* label;
    };
    const bool tiles = gpu.tiles_mxfp4();
    for (const auto& s : kShapes) {
        if (only.find(s.model) == std::string::npos) continue;
        std::vector<kind> kinds;
        if (s.expert) {
            if (tiles) kinds.push_back({ggml_type::mxfp4, weight_layout::mxfp4_tiles, "MXFP4 tiles"});
            kinds.push_back({ggml_type::mxfp4, weight_layout::rows, "MXFP4 rows"});
        }
        // Q8_0 as the dense weights' upload keeps them on this backend (tiled, the tensor-core
        // kernels) and in the file's rows (the CUDA-core kernel).
        if (gpu.tiles_q8_0()) kinds.push_back({ggml_type::q8_0, weight_layout::q8_0_tiles, "Q8_0 tiles"});
        kinds.push_back({ggml_type::q8_0, weight_layout::rows, "Q8_0"});
        kinds.push_back({ggml_type::bf16, weight_layout::rows, "BF16"});
        for (const kind& k : kinds)
            for (int64_t n : batches) {
                const ggml_type t = k.type;
                const cuda::matmul_case c{t, s.rows, s.cols, s.jobs, s.pair, k.layout};
                auto ours = cuda::matmul_seconds(gpu, c, n, int(*rounds));
                if (!ours) return fail(kName, ours.message());
                const double gbps = cuda::weight_bytes(c) / ours->median;
                std::printf("%-6s %-26s %-11s %5lld %10.1f %8.0f %7.3f", s.model, s.what, k.label,
                            static_cast<long long>(n), ours->median * 1e6, gbps / 1e9, gbps / d2d);
                if (t == ggml_type::bf16 || &k == &kinds.front()) {
                    auto cb = cuda::cublas_bf16_seconds(gpu, c, n, int(*rounds));
                    if (cb) {
                        cuda::matmul_case bf = c;
                        bf.type = ggml_type::bf16;
                        std::printf(" %14.1f %7.3f", cb->median * 1e6, cuda::weight_bytes(bf) / cb->median / d2d);
                    } else {
                        std::printf("  (%s)", cb.message().c_str());
                    }
                } else {
                    std::printf(" %14s %7s", "", "");
                }
                // The time inside a step's graph (as a resident decode runs them: descriptors staged
                // once at the graph's head, programmatic edges, so a launch may load its first
                // weights while the one before it ends) beside the stream figure, which pays a
                // descriptor copy and a full launch gap per launch; and its ratio.
                auto in_graph = cuda::matmul_seconds(gpu, c, n, int(*rounds), true);
                if (!in_graph) return fail(kName, in_graph.message());
                std::printf(" %9.1f %7.3f", in_graph->median * 1e6, cuda::weight_bytes(c) / in_graph->median / d2d);
                std::printf("\n");
                std::fflush(stdout);
            }
    }
    const auto st = cuda::stats(gpu);
    std::printf("\n%llu kernel launches\n", static_cast<unsigned long long>(st.launches));
    return 0;
}

#else

int run(const cli::args&) { return fail(kName, "this build has no CUDA backend (nvcc was not found when it was built)"); }

#endif

const std::vector<cli::option_spec>& options() {
    static const std::vector<cli::option_spec> specs = {
        {"rounds", "N", "timed rounds per case, median reported (default 15)"},
        {"shapes", "LIST", "mini, flash or both (default mini,flash)"},
        {"batches", "LIST", "x rows per matmul, comma-separated (default 1,2,4; prefill sizes time the GEMM kernels)"},
    };
    return specs;
}

const command kCommand{kName, "[--rounds N] [--shapes mini,flash] [--batches 1,2,4]",
                       "The CUDA matmul kernels on mini's and flash's expert and dense shapes (MXFP4, Q8_0, BF16 at "
                       "batch 1, 2, 4) as a fraction of the device-to-device copy bandwidth measured in the same run, "
                       "beside cuBLAS BF16 on the same shapes.",
                       options(), run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
