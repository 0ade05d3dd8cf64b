// The tiler: MXFP4 matrices into the tile layout of model/mxfp4_tiles.h, in place. One thread
// block per 8-row strip: the strip's bytes into shared memory, then its units written back over
// the same bytes (a strip's tiled form fills exactly the range of its rows).
#include <algorithm>

#include "model/cuda/device_common.cuh"
#include "model/cuda/kernels.h"
#include "model/mxfp4_tiles.h"

namespace moestream::cuda::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) k_tile_mxfp4(const tile_batch b) {
    // Waits for its predecessor but never triggers its dependents early (no launch_dependents):
    // they start once every strip is written, since a matmul loads weights before its own wait.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
    extern __shared__ __align__(16) uint8_t strip[];
    int64_t s = blockIdx.x;
    int i = 0;
    for (; i < b.n; ++i) {
        const int64_t strips = b.m[i].rows / mxfp4_tiles::kStripRows;
        if (s < strips) break;
        s -= strips;
    }
    if (i == b.n) return;
    const tile_matrix m = b.m[i];
    const int64_t row_bytes = m.cols / 32 * 17, bytes = mxfp4_tiles::strip_bytes(m.cols);
    uint8_t* at = m.data + s * bytes;
    for (int64_t k = threadIdx.x; k < bytes / 16; k += kThreads)
        reinterpret_cast<uint4*>(strip)[k] = reinterpret_cast<const uint4*>(at)[k];
    __syncthreads();
    // Thread k writes lane (g, t)'s 16 bytes of unit k / 32 (and, at t == 0, row g's scales).
    const int64_t units = m.cols / (32 * mxfp4_tiles::kUnitBlocks);
    for (int64_t k = threadIdx.x; k < units * 32; k += kThreads) {
        const int64_t u = k / 32;
        const int lane = int(k % 32), g = lane >> 2, t = lane & 3;
        uint32_t w[4], sc = 0;
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const uint8_t* blk = strip + g * row_bytes + (mxfp4_tiles::kUnitBlocks * u + jj) * 17;
            const uint32_t q = uint32_t(blk[1 + 4 * t]) | uint32_t(blk[2 + 4 * t]) << 8 | uint32_t(blk[3 + 4 * t]) << 16 |
                               uint32_t(blk[4 + 4 * t]) << 24;
            w[jj] = mxfp4_tiles::tiled_word(q);
            sc |= uint32_t(blk[0]) << (8 * jj);
        }
        uint8_t* unit = at + u * mxfp4_tiles::kUnitBytes;
        *reinterpret_cast<uint4*>(unit + lane * 16) = uint4{w[0], w[1], w[2], w[3]};
        if (t == 0) *reinterpret_cast<uint32_t*>(unit + mxfp4_tiles::kUnitWeightBytes + 4 * g) = sc;
    }
}

}  // namespace

cudaError_t tile_mxfp4(cudaStream_t s, const tile_batch& batch) {
    int64_t strips = 0;
    size_t shared = 0;
    for (int i = 0; i < batch.n; ++i) {
        const tile_matrix& m = batch.m[i];
        if (!mxfp4_tiles::tileable(m.rows, m.cols, m.cols / 32 * 17) || reinterpret_cast<uintptr_t>(m.data) % 16 != 0)
            return cudaErrorInvalidValue;
        strips += m.rows / mxfp4_tiles::kStripRows;
        shared = std::max(shared, size_t(mxfp4_tiles::strip_bytes(m.cols)));
    }
    if (strips == 0) return cudaSuccess;
    static const cudaError_t opted = cudaFuncSetAttribute(
        k_tile_mxfp4, cudaFuncAttributeMaxDynamicSharedMemorySize, int(mxfp4_tiles::strip_bytes(mxfp4_tiles::kMaxCols)));
    if (opted != cudaSuccess) return opted;
    // Launched directly, never recorded into a step (tiles are made outside steps: at fills and
    // at load).
    k_tile_mxfp4<<<dim3(unsigned(strips)), dim3(kThreads), shared, s>>>(batch);
    return cudaGetLastError();
}

}  // namespace moestream::cuda::kernels
