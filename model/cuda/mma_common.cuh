// Tensor-core and shared-memory primitives of the kernels that use mma.sync (matmul_mma.cuh,
// matmul_q8.cuh). Device code only.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA), lane = 4 g + t:
//   A (16 x 16, row-major): a0 = (row g, k 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g, 2t+8..),
//                           a3 = (g + 8, 2t+8..); the lower k in the low half of each register.
//   B (16 x 8, "col"):      b0 = (k 2t..2t+1, col g), b1 = (k 2t+8..2t+9, col g).
//   C (16 x 8, fp32):       c0 = (g, 2t), c1 = (g, 2t+1), c2 = (g + 8, 2t), c3 = (g + 8, 2t+1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moestream::cuda::kernels {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// d = A B + c for one m16n8k16 (fp16 A row-major, B col-major, fp32 accumulators).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                          const float (&c)[4]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
}

}  // namespace moestream::cuda::kernels
