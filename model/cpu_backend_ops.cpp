// The CPU backend's memory and its small ops: data movement (embedding rows, gathers, key stores,
// engram rows), the streams' mean, the ratio-2 pooling, and the selections (router, indexer,
// argmax). Each computes exactly what the model's host loops computed before they became ops,
// so the CPU forward keeps its bits.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>

#include "model/attention_keys.h"
#include "model/bf16.h"
#include "model/cpu_backend.h"
#include "model/quant.h"
#include "model/top_k.h"

namespace moestream {
namespace {

constexpr size_t kAlign = 256;

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

}  // namespace

std::string cpu_backend::device_description() const {
    return std::to_string(pool_.size()) + " threads, kernels " + quant::kernel_isa();
}

void* cpu_backend::allocate(size_t bytes) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (p) std::memset(p, 0, rounded);
    return p;
}

void cpu_backend::release(void* p) { std::free(p); }

void cpu_backend::upload(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
}

void cpu_backend::download(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
}

void cpu_backend::copy(void* dst, const void* src, size_t bytes) {
    if (bytes) std::memmove(dst, src, bytes);
}

void cpu_backend::fill(void* dst, uint8_t byte, size_t bytes) {
    if (bytes) std::memset(dst, byte, bytes);
}

void cpu_backend::scale_round(float* x, int64_t count, float s) {
    for (int64_t i = 0; i < count; ++i) x[i] = round_to_bf16(x[i] * s);
}

void cpu_backend::add(float* y, const float* x, int64_t count) {
    for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

void cpu_backend::embed(const weight_view& table, const int32_t* tokens, int64_t n, int copies, float* out) {
    timer t_(*this, k_data);
    const int64_t dim = table.cols;
    for (int64_t r = 0; r < n; ++r) {
        float* h = out + r * copies * dim;
        quant::dequantize_row(table.type, table.row(tokens[r]), h, dim);
        round_to_bf16(h, dim);
        for (int k = 1; k < copies; ++k) std::copy_n(h, dim, h + k * dim);
    }
}

void cpu_backend::stream_mean(const float* H, int64_t n, int hc, int64_t dim, float* out, int64_t out_stride) {
    timer t_(*this, k_data);
    for (int64_t r = 0; r < n; ++r)
        for (int64_t d = 0; d < dim; ++d) {
            float s = 0;
            for (int j = 0; j < hc; ++j) s += H[(r * hc + j) * dim + d];
            out[r * out_stride + d] = round_to_bf16(s / float(hc));
        }
}

void cpu_backend::copy_rows(std::span<const row_copy> jobs, int64_t count) {
    timer t_(*this, k_data);
    for (const auto& j : jobs) std::copy_n(j.src, count, j.dst);
}

void cpu_backend::gather_rows(const float* src, int64_t src_stride, const int64_t* rows, int64_t m, int64_t dim,
                              float* dst) {
    timer t_(*this, k_data);
    for (int64_t i = 0; i < m; ++i) std::copy_n(src + rows[i] * src_stride, dim, dst + i * dim);
}

void cpu_backend::pool_pairs(std::span<const pair_pool> jobs, int64_t dim) {
    timer t_(*this, k_data);
    for (const auto& j : jobs)
        for (int64_t ch = 0; ch < dim; ++ch) {
            const float m = std::max(j.z0[ch], j.z1[ch]);
            const float e0 = std::exp(j.z0[ch] - m), e1 = std::exp(j.z1[ch] - m);
            j.out[ch] = (e0 * j.a0[ch] + e1 * j.a1[ch]) / (e0 + e1);
        }
}

void cpu_backend::store_keys(std::span<const key_store> jobs, int64_t head_dim) {
    timer t_(*this, k_data);
    for (const auto& j : jobs) {
        const bool exact = store_attention_keys(j.src, j.count, head_dim, j.dst);
        MS_ASSERT_MSG(exact, "attention keys must be bf16 values");
    }
}

void cpu_backend::dequant_fp8_rows(const uint8_t* values, const uint8_t* scales, int64_t rows, int64_t n,
                                   float* out) {
    timer t_(*this, k_data);
    for (int64_t r = 0; r < rows; ++r) quant::dequantize_fp8_row_scaled(values + r * n, scales + r * (n / 32), n, out + r * n);
    round_to_bf16(out, rows * n);
}

void cpu_backend::argmax_rows(const float* x, int64_t n, int64_t cols, int32_t* out) {
    timer t_(*this, k_select);
    for (int64_t r = 0; r < n; ++r) {
        const float* v = x + r * cols;
        out[r] = int32_t(std::max_element(v, v + cols) - v);  // the first maximum: the lowest index
    }
}

void cpu_backend::route(const float* scores, const float* bias, int64_t n, int n_experts, int k, double route_scale,
                        bool select, int32_t* picks, float* weights) {
    timer t_(*this, k_select);
    thread_local std::vector<float> biased;
    biased.resize(size_t(n_experts));
    for (int64_t r = 0; r < n; ++r) {
        const float* s = scores + r * n_experts;
        int32_t* p = picks + r * k;
        if (select) {
            for (int i = 0; i < n_experts; ++i) biased[size_t(i)] = s[i] + bias[i];
            top_k(biased.data(), n_experts, k, p);
        }
        if (!weights) continue;
        float sum = 0;
        for (int j = 0; j < k; ++j) {
            MS_ASSERT_MSG(p[j] >= 0 && p[j] < n_experts, "router pick out of range");
            sum += s[p[j]];
        }
        for (int j = 0; j < k; ++j) weights[r * k + j] = float(s[p[j]] / (sum + 1e-20f) * route_scale);
    }
}

void cpu_backend::order_picks(const int32_t* picks, const float* weights, int64_t n, int k, int32_t* sorted_picks,
                              float* sorted_weights) {
    timer t_(*this, k_select);
    for (int64_t r = 0; r < n; ++r) {
        int32_t order[64];
        MS_ASSERT(k >= 1 && k <= 64);
        for (int j = 0; j < k; ++j) order[j] = j;
        const int32_t* p = picks + r * k;
        std::sort(order, order + k, [&](int32_t a, int32_t b) { return p[a] < p[b]; });
        for (int j = 0; j < k; ++j) {
            MS_ASSERT_MSG(j == 0 || p[order[j]] != p[order[j - 1]], "a row picked one expert twice");
            sorted_picks[j * n + r] = p[order[j]];
            sorted_weights[j * n + r] = weights[r * k + order[j]];
        }
    }
}

// The slot-table ops as the host-scheduled MoE runs them: one matmul job per assignment (a row's
// value never depends on the other rows of a job, so the bits are the same).
void cpu_backend::moe_gate_up(const expert_slot_table& t, const float* x, int64_t n, int k, const int32_t* sorted_picks,
                              const float* sorted_weights, float* g, float* u, bool swiglu, float limit) {
    const int64_t inter = t.gate.rows, dim = t.gate.cols;
    routed_jobs_.clear();
    for (int64_t a = 0; a < n * k; ++a) {
        const int64_t r = a % n;
        const int32_t slot = t.slot_of[sorted_picks[a]];
        MS_ASSERT_MSG(slot >= 0, "a routed expert without a slot");
        matmul_job gate{t.gate.in(t.base, t.slot_bytes, slot), x + r * dim, dim, 1, g + a * inter, inter, true};
        const weight_view up = t.up.in(t.base, t.slot_bytes, slot);
        if (swiglu) {
            gate.up = up;
            gate.u = u + a * inter;
            gate.u_stride = inter;
            gate.swiglu_limit = limit;
            gate.swiglu_w = sorted_weights + a;
            routed_jobs_.push_back(gate);
        } else {
            routed_jobs_.push_back(gate);
            routed_jobs_.push_back({up, x + r * dim, dim, 1, u + a * inter, inter, true});
        }
    }
    matmul_batch(routed_jobs_);
}

void cpu_backend::moe_down(const expert_slot_table& t, const float* g, int64_t n, int k, const int32_t* sorted_picks,
                           float* y) {
    const int64_t inter = t.down.cols, dim = t.down.rows;
    routed_jobs_.clear();
    for (int64_t a = 0; a < n * k; ++a) {
        const int32_t slot = t.slot_of[sorted_picks[a]];
        MS_ASSERT_MSG(slot >= 0, "a routed expert without a slot");
        routed_jobs_.push_back({t.down.in(t.base, t.slot_bytes, slot), g + a * inter, inter, 1, y + a * dim, dim, true});
    }
    matmul_batch(routed_jobs_);
}

void cpu_backend::indexer_select(const indexer_pick& p) {
    timer t_(*this, k_select);
    constexpr float inf = std::numeric_limits<float>::infinity();
    thread_local std::vector<float> bscore;
    thread_local std::vector<int32_t> order;
    const int64_t n_total = p.n_total;
    MS_ASSERT(n_total >= 1 && p.topk >= 1);
    for (int64_t t = 0; t < p.rows; ++t) {
        float* s = p.scores + t * n_total;
        const int64_t n_vis = p.n_visible[t];
        if (p.cand == indexer_pick::candidates::source) {
            // Level 1: blocks of block_size, block score = max, the block of the newest visible
            // entry pinned, the top topk_blocks kept (§3.4.7).
            const int64_t bs = p.block_size;
            const int64_t n_blocks = (n_total + bs - 1) / bs;
            bscore.assign(size_t(n_blocks), -inf);
            for (int64_t j = 0; j < n_total; ++j) bscore[size_t(j / bs)] = std::max(bscore[size_t(j / bs)], s[j]);
            const int64_t pin = floor_div(n_vis - 1, bs);
            if (pin >= 0) bscore[size_t(pin)] = inf;
            const int64_t keep = std::min(p.topk_blocks, n_blocks);
            order.resize(size_t(keep));
            top_k(bscore.data(), n_blocks, keep, order.data());
            uint8_t* mask = p.mask + t * p.mask_stride;
            std::fill_n(mask, n_total, uint8_t(0));
            for (int64_t k = 0; k < keep; ++k) {
                const int64_t b = order[size_t(k)];
                if (bscore[size_t(b)] == -inf) continue;
                for (int64_t j = b * bs; j < std::min(n_total, (b + 1) * bs); ++j) mask[j] = 1;
            }
        } else if (p.cand == indexer_pick::candidates::consumer) {
            const uint8_t* mask = p.mask + t * p.mask_stride;
            for (int64_t j = 0; j < n_total; ++j)
                if (j >= p.mask_len || !mask[j]) s[j] = -inf;
        }
        // Level 2: top-k over every entry present, ties to the lower index, back in index order;
        // entries this row cannot see become -1.
        const int64_t k = std::min(p.topk, n_total);
        int32_t* ids = p.selection + t * p.topk;
        std::fill_n(ids, p.topk, -1);
        if (k == n_total) {  // every entry is picked (short contexts): index order, no sort
            std::iota(ids, ids + k, 0);
        } else {
            top_k(s, n_total, k, ids);
            std::sort(ids, ids + k);
        }
        for (int64_t j = 0; j < k; ++j)
            if (ids[j] >= n_vis) ids[j] = -1;
    }
}

}  // namespace moestream
