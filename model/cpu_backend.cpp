#include "model/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "model/bf16.h"
#include "model/cpu_matmul.h"

namespace moestream {
namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Mean of squares in double: the statistic must not depend on the vector width of the machine.
float inv_rms(const float* x, int64_t n, float eps) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
    return 1.0f / std::sqrt(float(s / double(n)) + eps);
}

// The hot loops below are compiled for AVX-512, AVX2 and baseline x86-64 (picked at load time).
// Their arithmetic is the same lane by lane in every clone (no fp contraction, fixed lane sums),
// so the clones give identical bits.
#define MS_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

MS_VECTOR_CLONES double dot(const float* a, const float* b, int64_t n) {
    // fp32 products summed in fp32 over 32 interleaved lanes (four independent vector chains, so
    // the adds are not latency-bound), then the lanes in a fixed tree: a fixed order
    // (reproducible) that the compiler turns into vector code on any x86-64.
    float lane[32] = {};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 32; ++k) lane[k] += a[i + k] * b[i + k];
    for (; i < n; ++i) lane[i % 32] += a[i] * b[i];
    for (int w = 16; w >= 1; w /= 2)
        for (int k = 0; k < w; ++k) lane[k] += lane[k + w];
    return lane[0];
}

// y += a x
MS_VECTOR_CLONES void axpy(float a, const float* x, float* y, int64_t n) {
    for (int64_t d = 0; d < n; ++d) y[d] += a * x[d];
}

// out[j] = bf16(post_j f + Σ_i C[i][j] H_i) for one row (sums in i order).
MS_VECTOR_CLONES void expand_row(const float* f, const float* Hr, int hc, int64_t dim, const float* post,
                                 const float* C, float* tmp) {
    for (int j = 0; j < hc; ++j) {
        float* t = tmp + j * dim;
        for (int64_t d = 0; d < dim; ++d) t[d] = 0.0f;
        for (int i = 0; i < hc; ++i) {
            const float c = C[i * hc + j];
            const float* h = Hr + i * dim;
            for (int64_t d = 0; d < dim; ++d) t[d] += c * h[d];
        }
        const float p = post[j];
        for (int64_t d = 0; d < dim; ++d) t[d] = round_to_bf16(p * f[d] + t[d]);
    }
}

}  // namespace

cpu_backend::cpu_backend(int threads) : pool_(std::max(1, threads)) {}

// Adds the op's wall time to its slot when profiling; nested ops (hc_mixes' matmul) count in both.
struct cpu_backend::timer {
    cpu_backend& be;
    op_id id;
    std::chrono::steady_clock::time_point t0;
    timer(cpu_backend& b, op_id i) : be(b), id(i) {
        if (be.profiling_) t0 = std::chrono::steady_clock::now();
    }
    ~timer() {
        if (!be.profiling_) return;
        be.times_[id].calls++;
        be.times_[id].seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
};

std::vector<cpu_backend::op_time> cpu_backend::profile() const { return {std::begin(times_), std::end(times_)}; }

void cpu_backend::reset_profile() {
    for (auto& t : times_) t.calls = 0, t.seconds = 0;
}

void cpu_backend::matmul(const weight_view& w, const float* x, int64_t x_stride, int64_t n, float* y,
                         int64_t y_stride, bool round) {
    timer t_(*this, k_matmul);
    MS_ASSERT(!w.empty() && n >= 0);
    MS_ASSERT_MSG(w.row_stride == size_t(row_bytes(dtype_info(w.type), w.cols)), "weight rows must be contiguous");
    if (n == 0) return;
    moestream::matmul(pool_, w.type, w.data, w.rows, w.cols, x, n, x_stride, y, y_stride);
    if (round)
        for (int64_t r = 0; r < n; ++r) round_to_bf16(y + r * y_stride, w.rows);
}

void cpu_backend::matmul_batch(std::span<const matmul_job> jobs) {
    timer t_(*this, k_matmul_batch);
    // Split every job's output rows into tiles of about 32 KiB of weights and share the tiles
    // out in one parallel step; each tile runs the single-threaded matmul on its rows, which
    // computes every value exactly as the pooled one does.
    constexpr int64_t kTileBytes = 32 << 10;
    tiles_.clear();
    for (size_t j = 0; j < jobs.size(); ++j) {
        const auto& jb = jobs[j];
        MS_ASSERT(!jb.w.empty());
        MS_ASSERT_MSG(jb.w.row_stride == size_t(row_bytes(dtype_info(jb.w.type), jb.w.cols)), "weight rows must be contiguous");
        if (jb.n == 0) continue;
        const int64_t rows = std::max<int64_t>(1, kTileBytes / int64_t(jb.w.row_stride));
        for (int64_t b = 0; b < jb.w.rows; b += rows) tiles_.push_back({int32_t(j), b, std::min(jb.w.rows, b + rows)});
    }
    pool_.parallel_for(int64_t(tiles_.size()), [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const tile& tl = tiles_[size_t(t)];
            const auto& jb = jobs[size_t(tl.job)];
            moestream::matmul(jb.w.type, jb.w.row(tl.begin), tl.end - tl.begin, jb.w.cols, jb.x, jb.n, jb.x_stride,
                              jb.y + tl.begin, jb.y_stride);
            if (jb.round_bf16)
                for (int64_t r = 0; r < jb.n; ++r) round_to_bf16(jb.y + r * jb.y_stride + tl.begin, tl.end - tl.begin);
        }
    });
}

void cpu_backend::rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y,
                           bool round) {
    timer t_(*this, k_rms_norm);
    for (int64_t r = 0; r < n; ++r) {
        const float* xr = x + r * dim;
        float* yr = y + r * dim;
        const float s = inv_rms(xr, dim, eps);
        for (int64_t i = 0; i < dim; ++i) {
            float v = xr[i] * s;
            if (w) v *= w[i];
            yr[i] = round ? round_to_bf16(v) : v;
        }
    }
}

void cpu_backend::round_bf16(float* x, int64_t count) { round_to_bf16(x, count); }

void cpu_backend::rope(float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim, int64_t rope_dim,
                       const int64_t* pos, const float* freqs, bool inverse) {
    timer t_(*this, k_rope);
    const int64_t pairs = rope_dim / 2;
    std::vector<float> c(static_cast<size_t>(pairs)), s(static_cast<size_t>(pairs));
    for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < pairs; ++i) {
            // The reference forms the angle in fp32: fp32(pos) * f_i, then fp32 cos/sin.
            const float theta = float(pos[r]) * freqs[i];
            c[size_t(i)] = std::cos(theta);
            s[size_t(i)] = inverse ? -std::sin(theta) : std::sin(theta);
        }
        for (int h = 0; h < n_heads; ++h) {
            float* t = x + r * row_stride + h * head_dim + (head_dim - rope_dim);
            for (int64_t i = 0; i < pairs; ++i) {
                const float a = t[2 * i], b = t[2 * i + 1];
                t[2 * i] = round_to_bf16(a * c[size_t(i)] - b * s[size_t(i)]);
                t[2 * i + 1] = round_to_bf16(a * s[size_t(i)] + b * c[size_t(i)]);
            }
        }
    }
}

void cpu_backend::hc_mixes(const float* H, int64_t n, int hc, int64_t dim, const weight_view& fn, const float* base,
                           const float* scale, int iters, float hc_eps, float norm_eps, float* pre, float* post,
                           float* comb, const float* fn_h) {
    timer t_(*this, k_hc_mixes);
    const int64_t n_mix = (2 + hc) * hc;
    MS_ASSERT(fn.rows == n_mix && fn.cols == hc * dim && fn.type == ggml_type::f32);
    std::vector<float> mix(static_cast<size_t>(n * n_mix));
    if (fn_h) std::copy(fn_h, fn_h + n * n_mix, mix.begin());
    else matmul(fn, H, hc * dim, n, mix.data(), n_mix, false);
    for (int64_t r = 0; r < n; ++r) {
        float* m = mix.data() + r * n_mix;
        const float s = inv_rms(H + r * hc * dim, hc * dim, norm_eps);
        for (int64_t i = 0; i < n_mix; ++i) m[i] *= s;
        for (int k = 0; k < hc; ++k) {
            pre[r * hc + k] = sigmoid(m[k] * scale[0] + base[k]) + hc_eps;
            post[r * hc + k] = 2.0f * sigmoid(m[hc + k] * scale[1] + base[hc + k]);
        }
        float* C = comb + r * hc * hc;
        for (int i = 0; i < hc; ++i) {
            float mx = -std::numeric_limits<float>::infinity();
            for (int j = 0; j < hc; ++j) {
                C[i * hc + j] = m[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j];
                mx = std::max(mx, C[i * hc + j]);
            }
            float sum = 0;
            for (int j = 0; j < hc; ++j) sum += (C[i * hc + j] = std::exp(C[i * hc + j] - mx));
            for (int j = 0; j < hc; ++j) C[i * hc + j] = C[i * hc + j] / sum + hc_eps;
        }
        auto normalize_columns = [&] {
            for (int j = 0; j < hc; ++j) {
                float sum = 0;
                for (int i = 0; i < hc; ++i) sum += C[i * hc + j];
                for (int i = 0; i < hc; ++i) C[i * hc + j] /= sum + hc_eps;
            }
        };
        normalize_columns();
        for (int it = 1; it < iters; ++it) {
            for (int i = 0; i < hc; ++i) {
                float sum = 0;
                for (int j = 0; j < hc; ++j) sum += C[i * hc + j];
                for (int j = 0; j < hc; ++j) C[i * hc + j] /= sum + hc_eps;
            }
            normalize_columns();
        }
    }
}

void cpu_backend::hc_collapse(const float* H, int64_t n, int hc, int64_t dim, const float* p, float* out) {
    timer t_(*this, k_hc_collapse);
    for (int64_t r = 0; r < n; ++r)
        for (int64_t d = 0; d < dim; ++d) {
            float s = 0;
            for (int k = 0; k < hc; ++k) s += p[r * hc + k] * H[(r * hc + k) * dim + d];
            out[r * dim + d] = round_to_bf16(s);
        }
}

void cpu_backend::hc_expand(const float* f, const float* H, int64_t n, int hc, int64_t dim, const float* post,
                            const float* comb, float* out) {
    timer t_(*this, k_hc_expand);
    // Per value: s = Σ_i C[i][j] H_i (i ascending), then post_j f + s; the loops run along dim so
    // they vectorise, the order of every sum is unchanged.
    std::vector<float> tmp(static_cast<size_t>(hc * dim));
    for (int64_t r = 0; r < n; ++r) {
        expand_row(f + r * dim, H + r * hc * dim, hc, dim, post + r * hc, comb + r * hc * hc, tmp.data());
        std::copy(tmp.begin(), tmp.end(), out + r * hc * dim);
    }
}

void cpu_backend::attention(std::span<const attention_row> rows, int n_heads, int64_t head_dim, float scale,
                            const float* sinks, bool bf16_probs) {
    timer t_(*this, k_attention);
    const int64_t units = int64_t(rows.size()) * n_heads;
    pool_.parallel_for(units, [&](int64_t begin, int64_t end) {
        std::vector<float> p;
        for (int64_t u = begin; u < end; ++u) {
            const attention_row& row = rows[size_t(u / n_heads)];
            const int h = int(u % n_heads);
            const float* q = row.q + h * head_dim;
            float* o = row.out + h * head_dim;
            std::fill(o, o + head_dim, 0.0f);
            if (row.n_keys == 0) continue;
            p.resize(size_t(row.n_keys));
            float m = sinks[h];
            for (int64_t i = 0; i < row.n_keys; ++i) {
                p[size_t(i)] = float(dot(q, row.keys[i], head_dim)) * scale;
                m = std::max(m, p[size_t(i)]);
            }
            float denom = std::exp(sinks[h] - m);
            for (int64_t i = 0; i < row.n_keys; ++i) denom += (p[size_t(i)] = std::exp(p[size_t(i)] - m));
            for (int64_t i = 0; i < row.n_keys; ++i)
                axpy(bf16_probs ? round_to_bf16(p[size_t(i)]) : p[size_t(i)], row.keys[i], o, head_dim);
            const float inv = 1.0f / denom;
            for (int64_t d = 0; d < head_dim; ++d) o[d] = round_to_bf16(o[d] * inv);
        }
    });
}

void cpu_backend::simulate_quant(act_quant_kind kind, float* x, int64_t count) {
    timer t_(*this, k_quant);
    simulate_act_quant(kind, x, count);
}

void cpu_backend::swiglu(float* g, const float* u, int64_t n, int64_t inter, float limit, const float* w) {
    timer t_(*this, k_swiglu);
    for (int64_t r = 0; r < n; ++r) {
        const float wr = w ? w[r] : 1.0f;
        for (int64_t i = 0; i < inter; ++i) {
            const float gv = std::min(g[r * inter + i], limit);
            const float uv = std::clamp(u[r * inter + i], -limit, limit);
            const float h = gv / (1.0f + std::exp(-gv)) * uv;
            g[r * inter + i] = round_to_bf16(wr * h);
        }
    }
}

void cpu_backend::indexer_scores(const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim,
                                 const float* keys, int64_t n_keys, const int64_t* n_visible, float* scores) {
    timer t_(*this, k_indexer);
    pool_.parallel_for(n, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
            for (int64_t j = 0; j < n_keys; ++j) {
                if (j >= n_visible[r]) {
                    scores[r * n_keys + j] = -std::numeric_limits<float>::infinity();
                    continue;
                }
                float s = 0;
                for (int h = 0; h < n_heads; ++h) {
                    const float qk = round_to_bf16(float(dot(q + (r * n_heads + h) * head_dim, keys + j * head_dim, head_dim)));
                    s += round_to_bf16(std::max(qk, 0.0f) * w[r * n_heads + h]);
                }
                scores[r * n_keys + j] = round_to_bf16(s);
            }
    });
}

void cpu_backend::engram_gate(float* H, int64_t n, int hc, int64_t dim, const float* kv, const float* qk,
                              float norm_eps) {
    timer t_(*this, k_engram);
    std::vector<float> hn(static_cast<size_t>(dim)), kn(static_cast<size_t>(dim));
    const float inv_sqrt_dim = 1.0f / std::sqrt(float(dim));
    for (int64_t r = 0; r < n; ++r) {
        const float* value = kv + (r * (hc + 1) + hc) * dim;
        for (int k = 0; k < hc; ++k) {
            float* Hk = H + (r * hc + k) * dim;
            const float* key = kv + (r * (hc + 1) + k) * dim;
            rms_norm(Hk, 1, dim, nullptr, norm_eps, hn.data(), true);
            rms_norm(key, 1, dim, nullptr, norm_eps, kn.data(), true);
            double d = 0;
            for (int64_t i = 0; i < dim; ++i) d += double(hn[size_t(i)] * qk[k * dim + i] * kn[size_t(i)]);
            const float dotv = float(d) * inv_sqrt_dim;
            const float sgn = dotv > 0 ? 1.0f : (dotv < 0 ? -1.0f : 0.0f);
            const float gate = sigmoid(sgn * std::sqrt(std::max(std::fabs(dotv), 1e-6f)));
            for (int64_t i = 0; i < dim; ++i) Hk[i] = round_to_bf16(Hk[i] + gate * value[i]);
        }
    }
}

}  // namespace moestream
