// Numeric storage formats and their CPU kernels.
//
// GGUF types (rows along ne[0]): F32, F16, BF16, Q8_0 (fp16 scale + 32 int8), MXFP4 (e8m0 scale +
// 16 bytes; byte j holds element j in the low nibble and j+16 in the high nibble).
// Checkpoint formats (DeepSeek release, used by the converter and engram rows): FP8 E4M3 with
// E8M0 scales (32x32 tiles for weights, 32-element blocks for engram rows) and FP4 E2M1 with
// 32-element E8M0 scales, two adjacent elements per byte (element 2k low nibble, 2k+1 high).
//
// Kernels are vectorised with AVX2/FMA (plus AVX-512F for the quantized dots, and AVX-512 BF16
// for BF16 and MXFP4 rows against an x of bf16 values; for MXFP4 with the fp32 kernel's bits)
// when the CPU has them (chosen once at run time) and fall back to scalar code; both paths are
// tested against each other and against independent values.
// Thread safety: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "config/dtype.h"

namespace moestream::quant {

// ---- scalar conversions ----
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);        // round to nearest even, overflow to inf
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);       // round to nearest even, NaN stays NaN
float e4m3_to_f32(uint8_t v);        // OCP FP8 E4M3 (no inf; 0x7f/0xff are NaN; max 448)
uint8_t f32_to_e4m3(float f);        // RNE, saturating to +-448
float e8m0_to_f32(uint8_t e);        // 2^(e-127); 0xff is NaN
float e2m1_to_f32(uint8_t nibble);   // {0,.5,1,1.5,2,3,4,6}, bit 3 = sign
uint8_t f32_to_e2m1(float f);        // nearest, ties to even code, clamped to +-6

// ---- rows of GGUF types ----
// n must be a multiple of the type's block size; types must be compute_supported.
void dequantize_row(ggml_type type, const void* src, float* dst, int64_t n);
void quantize_row(ggml_type type, const float* src, void* dst, int64_t n);
// dot(row of `type`, fp32 vector x) with fp32 accumulation.
float dot_row(ggml_type type, const void* row, const float* x, int64_t n);
// (A whole matrix against x: moestream::matmul in model/cpu_matmul.h, which gives dot_row's bits.)

// ---- DeepSeek checkpoint formats ----
// fp8 weight [rows, cols] with one e8m0 scale per 32x32 tile (scales [ceil(rows/32), ceil(cols/32)]).
void dequantize_fp8_tiled(const uint8_t* w, const uint8_t* scales, int64_t rows, int64_t cols,
                          int64_t tile, float* out);
// fp4 weight [rows, cols] packed two per byte (cols/2 bytes a row), one e8m0 scale per 32 along
// cols (scales [rows, cols/32]).
void dequantize_fp4_checkpoint(const uint8_t* w, const uint8_t* scales, int64_t rows, int64_t cols,
                               float* out);
// Lossless repack of the checkpoint fp4 layout into ggml MXFP4 blocks (rows * cols/32 blocks).
void repack_fp4_to_mxfp4(const uint8_t* w, const uint8_t* scales, int64_t rows, int64_t cols,
                         void* mxfp4_out);
// Inverse of the above (used to verify the repack is bit-identical).
void unpack_mxfp4_to_fp4(const void* mxfp4, int64_t rows, int64_t cols, uint8_t* w_out,
                         uint8_t* scales_out);
// One engram row: n e4m3 values with one e8m0 scale per 32.
void dequantize_fp8_row_scaled(const uint8_t* v, const uint8_t* scales, int64_t n, float* out);

// Which implementation the dispatcher picked, for bench output and tests: "avx512" (the AVX2 set
// with AVX-512F Q8_0/MXFP4 dots), "avx2" or "scalar".
const char* kernel_isa();
// Forces the scalar path (tests compare both paths). Not thread-safe; call before use.
void force_scalar(bool on);

}  // namespace moestream::quant
