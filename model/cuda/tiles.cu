// The tiler: MXFP4 matrices into the tile layout of model/mxfp4_tiles.h, in place. One thread
// block per 8-row strip: the strip's bytes into shared memory, then its units written back over
// the same bytes (a strip's tiled form fills exactly the range of its rows).
#include <algorithm>

#include "config/assert.h"
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
        const mxfp4_tiles::lane_share share = mxfp4_tiles::tile_lane(strip, row_bytes, u, g, t);
        uint8_t* unit = at + u * mxfp4_tiles::kUnitBytes;
        *reinterpret_cast<uint4*>(unit + lane * 16) = uint4{share.words[0], share.words[1], share.words[2], share.words[3]};
        if (t == 0) *reinterpret_cast<uint32_t*>(unit + mxfp4_tiles::kUnitWeightBytes + 4 * g) = share.scales;
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

cudaError_t tile_mxfp4(cudaStream_t s, std::span<const weight_view> matrices, uint64_t* launches) {
    tile_batch b;
    for (size_t i = 0; i < matrices.size(); ++i) {
        const weight_view& w = matrices[i];
        MS_ASSERT_MSG(w.type == ggml_type::mxfp4 && w.layout == weight_layout::rows &&
                          mxfp4_tiles::tileable(w.rows, w.cols, int64_t(w.row_stride)),
                      "tile_mxfp4: not a tileable MXFP4 matrix in rows");
        b.m[b.n++] = {static_cast<uint8_t*>(const_cast<void*>(w.data)), int32_t(w.rows), int32_t(w.cols)};
        if (b.n == kMaxTileMatrices || i + 1 == matrices.size()) {
            if (const cudaError_t e = tile_mxfp4(s, b); e != cudaSuccess) return e;
            if (launches) ++*launches;
            b.n = 0;
        }
    }
    return cudaSuccess;
}

}  // namespace moestream::cuda::kernels
