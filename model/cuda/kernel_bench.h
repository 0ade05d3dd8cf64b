// Measurements behind `moestream bench kernels`: the device-to-device copy bandwidth (the
// machine's own limit, read + write bytes per second), the backend's matmul kernels on given
// shapes, and cuBLAS BF16 on the same shapes, each as the median of several timed rounds over
// weight sets rotated so that no round reads from L2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/dtype.h"
#include "config/result.h"
#include "model/backend.h"

namespace moestream::cuda {

struct timing {
    double median = 0, min = 0, max = 0;  // seconds per launch (one layer's jobs)
};

// Read + write bytes per second of a device-to-device copy of `bytes`.
result<timing> copy_seconds(backend& be, size_t bytes, int rounds);

// `jobs` matrices of rows x cols of `type` as one matmul_batch (a layer's experts: with `pair`,
// each job a gate/up SwiGLU pair, so 2 matrices a job), against n rows of x.
struct matmul_case {
    ggml_type type = ggml_type::mxfp4;
    int64_t rows = 0, cols = 0;
    int jobs = 1;
    bool pair = false;
    // MXFP4: the weights tiled on the device first (model/mxfp4_tiles.h), as the expert cache
    // holds them, or in the file's rows.
    weight_layout layout = weight_layout::rows;
};
// Weight bytes one launch of the case reads.
double weight_bytes(const matmul_case& c);
// Seconds per launch; `graph`: the launches of a round recorded as one step and replayed as a
// CUDA graph (how a decode step runs them), else launched on the stream.
result<timing> matmul_seconds(backend& be, const matmul_case& c, int64_t n, int rounds, bool graph = false);

// The same shapes through cuBLAS (BF16 weights and x, fp32 accumulation: cublasGemmEx), one GEMM
// per matrix; cuBLAS is loaded when first used (an error says why when it cannot be).
result<timing> cublas_bf16_seconds(backend& be, const matmul_case& c, int64_t n, int rounds);

}  // namespace moestream::cuda
