// `moestream bench decode --backend cuda` (tools/bench_gpu_decode.cpp).
#pragma once

#include <cstdint>
#include <string_view>

#include "config/config.h"

namespace moestream::tools {

// Decode on the GPU against its floor measured in the same run, and (with `compare`) the
// remap-sync baseline, a per-op profile and the CPU backend beside it; returns the exit code.
int run_gpu_decode(std::string_view name, const moestream_config& cfg, int64_t n, int64_t prompt_len,
                   bool with_graphs = true, bool with_stream = true, bool compare = true);

}  // namespace moestream::tools
