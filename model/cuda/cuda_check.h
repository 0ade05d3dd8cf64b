// Host-side CUDA error handling shared by the backend's translation units (no kernel code).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

namespace moestream::cuda {

// A CUDA error inside an op or on an established stream is a bug or a dead device: say which
// call failed and stop (ops return nothing; expected failures, such as running out of memory in
// allocate(), are values).
inline void check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    std::fprintf(stderr, "moestream: CUDA error in %s: %s (%s)\n", what, cudaGetErrorString(e), cudaGetErrorName(e));
    std::fflush(stderr);
    std::abort();
}

}  // namespace moestream::cuda
