// Scalar conversions and kernels, plus the run-time dispatch to the AVX2 and AVX-512 versions
// (quant_avx2.cpp, quant_avx512.cpp). The scalar code is the reference the SIMD code is tested
// against, so it favours obviousness over speed.
#include "model/quant.h"

#include <atomic>
#include <bit>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "config/assert.h"
#include "model/numeric.h"
#include "model/quant_internal.h"

namespace moestream::quant {
namespace {

using detail::block_mxfp4;
using detail::block_q8_0;
using detail::kBlock;

// The minifloat encoder and the formats are model/numeric.h's (shared with the CUDA kernels).
using numeric::encode_minifloat;
using numeric::kE2m1;
using numeric::kE4m3;
using numeric::kF16;

// ---------------------------------------------------------------- lookup tables

struct tables {
    float e4m3[256];
    float e8m0[256];
    float e2m1[16];
    tables() {
        for (int i = 0; i < 256; ++i) e4m3[i] = e4m3_to_f32(uint8_t(i));
        for (int i = 0; i < 256; ++i) e8m0[i] = e8m0_to_f32(uint8_t(i));
        for (int i = 0; i < 16; ++i) e2m1[i] = e2m1_to_f32(uint8_t(i));
    }
};

const tables& lut() {
    static const tables t;
    return t;
}

// ---------------------------------------------------------------- scalar row kernels

float load_f16_scale(const block_q8_0& b) {
    uint16_t d;
    std::memcpy(&d, &b.d, sizeof d);  // rows need not be 2-byte aligned inside a mapped file
    return f16_to_f32(d);
}

float dot_f32_scalar(const void* row, const float* x, int64_t n) {
    const float* w = static_cast<const float*>(row);
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += w[i] * x[i];
    return acc;
}

float dot_f16_scalar(const void* row, const float* x, int64_t n) {
    const uint8_t* w = static_cast<const uint8_t*>(row);
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, w + 2 * i, 2);
        acc += f16_to_f32(h) * x[i];
    }
    return acc;
}

float dot_bf16_scalar(const void* row, const float* x, int64_t n) {
    const uint8_t* w = static_cast<const uint8_t*>(row);
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, w + 2 * i, 2);
        acc += detail::bf16_bits_to_f32(b) * x[i];
    }
    return acc;
}

// Per block: exact-ish int8 x fp32 sum first, one multiply by the scale (as ggml does).
float dot_q8_0_scalar(const void* row, const float* x, int64_t n) {
    MS_ASSERT(n % kBlock == 0);
    const block_q8_0* b = static_cast<const block_q8_0*>(row);
    float acc = 0.0f;
    for (int64_t ib = 0; ib < n / kBlock; ++ib, x += kBlock) {
        float s = 0.0f;
        for (int j = 0; j < kBlock; ++j) s += float(b[ib].qs[j]) * x[j];
        acc += s * load_f16_scale(b[ib]);
    }
    return acc;
}

float dot_mxfp4_scalar(const void* row, const float* x, int64_t n) {
    MS_ASSERT(n % kBlock == 0);
    const block_mxfp4* b = static_cast<const block_mxfp4*>(row);
    float acc = 0.0f;
    for (int64_t ib = 0; ib < n / kBlock; ++ib, x += kBlock) {
        float s = 0.0f;
        for (int j = 0; j < kBlock / 2; ++j) {
            s += float(detail::kE2m1Doubled[b[ib].qs[j] & 0x0f]) * x[j];
            s += float(detail::kE2m1Doubled[b[ib].qs[j] >> 4]) * x[j + kBlock / 2];
        }
        acc += s * detail::e8m0_half_to_f32(b[ib].e);
    }
    return acc;
}

void dequantize_f16_scalar(const void* src, float* dst, int64_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_f32(h);
    }
}

// ---------------------------------------------------------------- quantizers (ggml reference)

// ggml quantize_row_q8_0_ref: d = amax/127, q = roundf(x * (1/d)) (half away from zero), the
// scale stored as fp16 after computing q with the fp32 d. amax/127 above 65504 stores inf, as
// in ggml.
void quantize_q8_0(const float* src, void* dst, int64_t n) {
    MS_ASSERT(n % kBlock == 0);
    auto* out = static_cast<uint8_t*>(dst);
    for (int64_t ib = 0; ib < n / kBlock; ++ib, src += kBlock, out += sizeof(block_q8_0)) {
        float amax = 0.0f;
        for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(src[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = f32_to_f16(d);
        std::memcpy(out, &dh, 2);
        for (int j = 0; j < kBlock; ++j) out[2 + j] = uint8_t(int8_t(std::roundf(src[j] * id)));
    }
}

// ggml best_index_mxfp4: first index (scan 0..15) of the least |kv*d - x|. Ties therefore go to
// the smaller magnitude (0.75 -> 0.5, not the even code 1.0) and zero is always +0 (code 0).
// This deliberately differs from f32_to_e2m1 (ties to even) so our GGUFs match llama.cpp's.
uint8_t best_index_mxfp4(float x, float d) {
    int best = 0;
    float best_err = std::fabs(float(detail::kE2m1Doubled[0]) * d - x);
    for (int i = 1; i < 16; ++i) {
        const float err = std::fabs(float(detail::kE2m1Doubled[i]) * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return uint8_t(best);
}

// ggml quantize_row_mxfp4_ref: E = floor(log2f(amax)) - 2 + 127 (so amax/2^(E-127) lies in
// [4, 8) and values above 6 clip to 6), E = 0 for an all-zero block. We clamp E to [0, 254],
// where ggml's uint8 cast of an out-of-range float is undefined (amax < 2^-125 or non-finite).
uint8_t mxfp4_exponent(const float* x) {
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));  // NaN is skipped
    if (!(amax > 0.0f)) return 0;
    if (std::isinf(amax)) return 254;
    const float e = std::floor(std::log2(amax)) - 2.0f + 127.0f;
    return uint8_t(std::clamp(e, 0.0f, 254.0f));
}

void quantize_mxfp4(const float* src, void* dst, int64_t n) {
    MS_ASSERT(n % kBlock == 0);
    auto* out = static_cast<block_mxfp4*>(dst);
    for (int64_t ib = 0; ib < n / kBlock; ++ib, src += kBlock) {
        block_mxfp4 b;
        b.e = mxfp4_exponent(src);
        const float d = detail::e8m0_half_to_f32(b.e);
        for (int j = 0; j < kBlock / 2; ++j)
            b.qs[j] = uint8_t(best_index_mxfp4(src[j], d) | (best_index_mxfp4(src[j + 16], d) << 4));
        std::memcpy(&out[ib], &b, sizeof b);
    }
}

// ---------------------------------------------------------------- dispatch

using detail::dot_fn;
using detail::row_kernel;
using row_fn = void (*)(const void*, float*, int64_t);

// Four rows one at a time: for the kernels without a multi-row version (x: float, or bf16 bits).
template <class X, float (*One)(const void*, const X*, int64_t)>
void four_by_one(const void* rows, int64_t stride, const X* x, int64_t n, float* out) {
    for (int r = 0; r < 4; ++r) out[r] = One(static_cast<const uint8_t*>(rows) + r * stride, x, n);
}

template <dot_fn One>
constexpr row_kernel single() {
    return {One, four_by_one<float, One>};
}

struct kernel_set {
    const char* isa;
    row_kernel f32, f16, bf16, q8_0, mxfp4;
    row_fn dequant_f16;
};

constexpr kernel_set kScalar{"scalar",
                             single<dot_f32_scalar>(),
                             single<dot_f16_scalar>(),
                             single<dot_bf16_scalar>(),
                             single<dot_q8_0_scalar>(),
                             single<dot_mxfp4_scalar>(),
                             dequantize_f16_scalar};
constexpr kernel_set kAvx2{"avx2",
                           single<detail::dot_f32_avx2>(),
                           single<detail::dot_f16_avx2>(),
                           single<detail::dot_bf16_avx2>(),
                           single<detail::dot_q8_0_avx2>(),
                           single<detail::dot_mxfp4_avx2>(),
                           detail::dequantize_f16_avx2};
constexpr kernel_set kAvx512{"avx512",
                             {detail::dot_f32_avx512, detail::dot4_f32_avx512},
                             single<detail::dot_f16_avx512>(),  // four-row F16 measured slower
                             {detail::dot_bf16_avx512, detail::dot4_bf16_avx512},
                             {detail::dot_q8_0_avx512, detail::dot4_q8_0_avx512},
                             {detail::dot_mxfp4_avx512, detail::dot4_mxfp4_avx512},
                             detail::dequantize_f16_avx2};

// The same AVX-512 kernels one row at a time: on AMD Zen 4 the four-row passes measured 40-60%
// slower than single rows on decode's 1024-column matrices (four interleaved short streams),
// on the Intel Xeon they are faster. Results are the same bits either way.
constexpr kernel_set kAvx512SingleRow{"avx512",
                                      single<detail::dot_f32_avx512>(),
                                      single<detail::dot_f16_avx512>(),
                                      single<detail::dot_bf16_avx512>(),
                                      single<detail::dot_q8_0_avx512>(),
                                      single<detail::dot_mxfp4_avx512>(),
                                      detail::dequantize_f16_avx2};

bool cpu_has_avx2() {
    static const bool has = [] {
        __builtin_cpu_init();  // needed if we are first called from a static initialiser
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    }();
    return has;
}

bool cpu_has_avx512() {
    static const bool has = cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    return has;
}

std::atomic<bool> g_force_scalar{false};

const kernel_set& kernels() {
    if (g_force_scalar.load(std::memory_order_relaxed) || !cpu_has_avx2()) return kScalar;
    if (!cpu_has_avx512()) return kAvx2;
    static const bool four_rows = __builtin_cpu_is("intel");
    return four_rows ? kAvx512 : kAvx512SingleRow;
}

void check_row(ggml_type type, int64_t n) {
    const dtype_traits& t = dtype_info(type);
    MS_ASSERT_MSG(t.compute_supported, "type has no CPU kernel");
    MS_ASSERT_MSG(n >= 0 && n % t.block_elems == 0, "row length is not a multiple of the block size");
}

// Scale of 32-element block `b` of an e8m0-scaled fp8/fp4 row.
float block_scale(const uint8_t* scales, int64_t b) { return lut().e8m0[scales[b]]; }

}  // namespace

// ================================================================ scalar conversions

float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) {
        // inf, or NaN with its payload kept and made quiet, as the F16C instruction does.
        return std::bit_cast<float>(sign | 0x7f800000u | (man ? 0x400000u | (man << 13) : 0u));
    }
    if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
    // Zero or subnormal: man * 2^-24 is exact in fp32.
    const float mag = float(man) * 0x1p-24f;
    return sign ? -mag : mag;
}

uint16_t f32_to_f16(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // quiet NaN
    if (abs == 0x7f800000u) return uint16_t(sign | 0x7c00u);
    const uint32_t code = encode_minifloat(std::bit_cast<float>(abs), kF16);
    return uint16_t(sign | (code > kF16.max_code ? 0x7c00u : code));  // overflow -> inf
}

float bf16_to_f32(uint16_t b) { return detail::bf16_bits_to_f32(b); }

uint16_t f32_to_bf16(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    // Truncating a NaN could leave an all-zero mantissa (= inf); force the quiet bit instead.
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
    // RNE: adding 0x7fff plus the kept LSB carries exactly when above half or at an odd tie;
    // a carry out of the mantissa correctly bumps the exponent (up to inf).
    return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float e4m3_to_f32(uint8_t v) {
    return numeric::e4m3_value(v);
}

uint8_t f32_to_e4m3(float f) {
    return numeric::e4m3_code(f);
}

float e8m0_to_f32(uint8_t e) {
    return numeric::e8m0_value(e);
}

float e2m1_to_f32(uint8_t nibble) {
    MS_ASSERT(nibble < 16);
    return numeric::e2m1_value(nibble);
}

uint8_t f32_to_e2m1(float f) {
    return numeric::e2m1_code(f);
}

// ================================================================ GGUF rows

void dequantize_row(ggml_type type, const void* src, float* dst, int64_t n) {
    check_row(type, n);
    switch (type) {
        case ggml_type::f32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
        case ggml_type::f16: kernels().dequant_f16(src, dst, n); return;
        case ggml_type::bf16: {
            const uint8_t* p = static_cast<const uint8_t*>(src);
            for (int64_t i = 0; i < n; ++i) {
                uint16_t b;
                std::memcpy(&b, p + 2 * i, 2);
                dst[i] = bf16_to_f32(b);
            }
            return;
        }
        case ggml_type::q8_0: {
            const block_q8_0* b = static_cast<const block_q8_0*>(src);
            for (int64_t ib = 0; ib < n / kBlock; ++ib) {
                const float d = load_f16_scale(b[ib]);
                for (int j = 0; j < kBlock; ++j) dst[ib * kBlock + j] = float(b[ib].qs[j]) * d;
            }
            return;
        }
        case ggml_type::mxfp4: {
            const block_mxfp4* b = static_cast<const block_mxfp4*>(src);
            for (int64_t ib = 0; ib < n / kBlock; ++ib) {
                const float d = detail::e8m0_half_to_f32(b[ib].e);
                float* o = dst + ib * kBlock;
                for (int j = 0; j < kBlock / 2; ++j) {
                    o[j] = float(detail::kE2m1Doubled[b[ib].qs[j] & 0x0f]) * d;
                    o[j + 16] = float(detail::kE2m1Doubled[b[ib].qs[j] >> 4]) * d;
                }
            }
            return;
        }
        default: MS_ASSERT(false);
    }
}

void quantize_row(ggml_type type, const float* src, void* dst, int64_t n) {
    check_row(type, n);
    uint8_t* out = static_cast<uint8_t*>(dst);
    switch (type) {
        case ggml_type::f32: std::memcpy(dst, src, size_t(n) * sizeof(float)); return;
        case ggml_type::f16:
            for (int64_t i = 0; i < n; ++i) {
                const uint16_t h = f32_to_f16(src[i]);
                std::memcpy(out + 2 * i, &h, 2);
            }
            return;
        case ggml_type::bf16:
            for (int64_t i = 0; i < n; ++i) {
                const uint16_t b = f32_to_bf16(src[i]);
                std::memcpy(out + 2 * i, &b, 2);
            }
            return;
        case ggml_type::q8_0: quantize_q8_0(src, dst, n); return;
        case ggml_type::mxfp4: quantize_mxfp4(src, dst, n); return;
        default: MS_ASSERT(false);
    }
}

float dot_row(ggml_type type, const void* row, const float* x, int64_t n) {
    check_row(type, n);
    if (const detail::bf16x_kernel k = detail::pick_bf16x_kernel(type); k.one) {
        thread_local std::vector<uint16_t> xb;
        xb.resize(size_t(n));
        if (k.pack(x, n, xb.data())) return k.one(row, xb.data(), n);
    }
    return detail::pick_row_kernel(type).one(row, x, n);
}

// ================================================================ checkpoint formats

void dequantize_fp8_tiled(const uint8_t* w, const uint8_t* scales, int64_t rows, int64_t cols,
                          int64_t tile, float* out) {
    MS_ASSERT(rows >= 0 && cols >= 0);
    MS_ASSERT(tile > 0);
    const int64_t tiles_per_row = (cols + tile - 1) / tile;
    const tables& t = lut();
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* srow = scales + (r / tile) * tiles_per_row;
        for (int64_t c = 0; c < cols; ++c)
            out[r * cols + c] = t.e4m3[w[r * cols + c]] * t.e8m0[srow[c / tile]];
    }
}

void dequantize_fp4_checkpoint(const uint8_t* w, const uint8_t* scales, int64_t rows, int64_t cols,
                               float* out) {
    MS_ASSERT(rows >= 0 && cols >= 0);
    MS_ASSERT_MSG(cols % kBlock == 0, "fp4 rows hold whole 32-element scale blocks");
    const tables& t = lut();
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* wr = w + r * (cols / 2);
        const uint8_t* sr = scales + r * (cols / kBlock);
        float* o = out + r * cols;
        for (int64_t k = 0; k < cols / 2; ++k) {
            const float d = t.e8m0[sr[(2 * k) / kBlock]];
            o[2 * k] = t.e2m1[wr[k] & 0x0f] * d;
            o[2 * k + 1] = t.e2m1[wr[k] >> 4] * d;
        }
    }
}

void repack_fp4_to_mxfp4(const uint8_t* w, const uint8_t* scales, int64_t rows, int64_t cols,
                         void* mxfp4_out) {
    MS_ASSERT(rows >= 0 && cols >= 0);
    MS_ASSERT_MSG(cols % kBlock == 0, "fp4 rows hold whole 32-element scale blocks");
    const int64_t nblocks = rows * (cols / kBlock);
    auto* out = static_cast<uint8_t*>(mxfp4_out);
    // Rows are contiguous in both layouts, so block b of the matrix is bytes [16b, 16b+16) of w.
    for (int64_t b = 0; b < nblocks; ++b) {
        const uint8_t* src = w + b * (kBlock / 2);
        block_mxfp4 blk;
        blk.e = scales[b];
        auto nib = [src](int i) { return uint8_t((src[i / 2] >> (4 * (i & 1))) & 0x0f); };
        for (int j = 0; j < kBlock / 2; ++j) blk.qs[j] = uint8_t(nib(j) | (nib(j + 16) << 4));
        std::memcpy(out + b * sizeof(block_mxfp4), &blk, sizeof blk);
    }
}

void unpack_mxfp4_to_fp4(const void* mxfp4, int64_t rows, int64_t cols, uint8_t* w_out,
                         uint8_t* scales_out) {
    MS_ASSERT(rows >= 0 && cols >= 0);
    MS_ASSERT_MSG(cols % kBlock == 0, "fp4 rows hold whole 32-element scale blocks");
    const int64_t nblocks = rows * (cols / kBlock);
    const auto* in = static_cast<const uint8_t*>(mxfp4);
    for (int64_t b = 0; b < nblocks; ++b) {
        block_mxfp4 blk;
        std::memcpy(&blk, in + b * sizeof(block_mxfp4), sizeof blk);
        scales_out[b] = blk.e;
        auto elem = [&blk](int i) { return uint8_t(i < 16 ? blk.qs[i] & 0x0f : blk.qs[i - 16] >> 4); };
        uint8_t* dst = w_out + b * (kBlock / 2);
        for (int k = 0; k < kBlock / 2; ++k) dst[k] = uint8_t(elem(2 * k) | (elem(2 * k + 1) << 4));
    }
}

void dequantize_fp8_row_scaled(const uint8_t* v, const uint8_t* scales, int64_t n, float* out) {
    MS_ASSERT(n >= 0);
    MS_ASSERT(v != nullptr || n == 0);
    const tables& t = lut();
    for (int64_t i = 0; i < n; ++i) out[i] = t.e4m3[v[i]] * block_scale(scales, i / kBlock);
}

const char* kernel_isa() { return kernels().isa; }

namespace detail {

bf16x_kernel pick_bf16x_kernel(ggml_type type) {
    static const bool has_bf16 = cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
    static const bool has_vbmi = __builtin_cpu_supports("avx512vbmi");
    const kernel_set& k = kernels();
    if (!has_bf16 || (&k != &kAvx512 && &k != &kAvx512SingleRow)) return {};
    const bool four = &k == &kAvx512;  // kAvx512SingleRow takes these one row at a time too
    if (type == ggml_type::bf16)
        return {dot_bf16x_avx512, four ? dot4_bf16x_avx512 : four_by_one<uint16_t, dot_bf16x_avx512>, pack_bf16_exact};
    if (type == ggml_type::mxfp4 && has_vbmi)
        return {dot_mxfp4_bf16x_avx512, four ? dot4_mxfp4_bf16x_avx512 : four_by_one<uint16_t, dot_mxfp4_bf16x_avx512>,
                pack_mxfp4_bf16x_avx512};
    return {};
}

bool pack_bf16_exact(const float* x, int64_t n, uint16_t* out) {
    MS_ASSERT(n >= 0);
    uint32_t low = 0;
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(x[i]);
        low |= u & 0xffffu;
        out[i] = uint16_t(u >> 16);
    }
    return low == 0;
}

row_kernel pick_row_kernel(ggml_type type) {
    const kernel_set& k = kernels();
    switch (type) {
        case ggml_type::f32: return k.f32;
        case ggml_type::f16: return k.f16;
        case ggml_type::bf16: return k.bf16;
        case ggml_type::q8_0: return k.q8_0;
        case ggml_type::mxfp4: return k.mxfp4;
        default: break;
    }
    MS_ASSERT_MSG(false, "dot_row/gemv/matmul: type has no CPU kernel");
    return {};
}

}  // namespace detail

void force_scalar(bool on) { g_force_scalar.store(on, std::memory_order_relaxed); }

}  // namespace moestream::quant
