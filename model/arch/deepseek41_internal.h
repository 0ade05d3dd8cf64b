// Building blocks shared by the backbone forward (deepseek41.cpp) and the DSpark draft
// (deepseek41_dspark.cpp). Internal to model/arch.
#pragma once

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "model/arch/deepseek41.h"
#include "model/attention_keys.h"
#include "model/bf16.h"

namespace moestream::dsv41::detail {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

struct env {
    const hparams& hp;
    backend& be;
    expert_source& experts;
    const model_options& opts;
};

// Rows of one forward: position of each row (several sequences concatenated).
struct rows_info {
    std::vector<int64_t> pos;
    std::vector<int64_t> seq_rows;  // rows its sequence has in this forward (pick sites)
    int64_t n() const { return int64_t(pos.size()); }
};

// Every row's output after the 4-stream hyper-connection bookkeeping of one sub-layer.
struct hc_mix {
    std::vector<float> pre, post, comb, fn_h;
    // The fn · H matmul, for the caller to batch with other work; compute(..., true) then uses it.
    matmul_job job(const env& e, const std::vector<float>& H, int64_t n, const weight_view& fn);
    void compute(const env& e, const std::vector<float>& H, int64_t n, const weight_view& fn, const vector_view& base,
                 const vector_view& scale, bool fn_h_ready = false);
};

// q = RoPE(W_qb · RMSNorm(W_qa · x)) with its latent qr (kept for the indexer) and the window kv
// rows RoPE(RMSNorm(W_kv · x)) from the same input, their matmuls batched: q_a with kv, then q_b with the
// indexer's q_b when the layer has one (qi: unrotated, [n, index heads * index_head_dim]).
// `extra` matmuls (independent of these) join the first parallel step.
void query_and_kv(const env& e, const layer_weights& lw, const float* x, const rows_info& rows, const float* freqs,
                  std::vector<float>& qr, std::vector<float>& q, std::vector<float>& kv, std::vector<float>* qi,
                  std::span<const matmul_job> extra = {});
// Window kv rows: RoPE(RMSNorm(W_kv · x)).
void window_kv(const env& e, const layer_weights& lw, const float* x, const rows_info& rows, const float* freqs,
               std::vector<float>& kv);
// Attention over per-row key lists, de-rotation and the grouped output projection -> out [n, dim];
// `upd` (may be null): the residual update, applied in the output projection's pass.
void attend_and_project(const env& e, const layer_weights& lw, const std::vector<float>& q,
                        std::vector<attention_row>& arows, const rows_info& rows, const float* freqs,
                        std::vector<float>& out, const hc_update* upd = nullptr);
// MoE FFN of §3.5 -> out [n, dim]. `layer` numbers the expert source (n_layers + stage for drafts).
// `extra` matmuls (independent of the MoE) join the router's parallel step.
// `next`: the following layer, whose router predicts its experts when opts.lookahead is on.
// `update` (may be empty): called after the router's step (so `extra` may compute what it needs);
// the residual update it returns is applied in the pass that forms `out`.
status moe(const env& e, const layer_weights& lw, int layer, int n_experts, int n_active, const float* x,
           const rows_info& rows, std::vector<float>& out, std::span<const matmul_job> extra = {},
           const layer_weights* next = nullptr, const std::function<hc_update()>& update = {});

// n_keys attention keys of head_dim values into their storage (model/attention_keys.h): every
// key the model makes is already rounded to bf16 (norm, RoPE and quantisation outputs are), so
// the values are kept; one that is not would be a bug upstream.
inline void store_keys(const float* x, int64_t n_keys, int64_t head_dim, uint16_t* out) {
    const bool exact = store_attention_keys(x, n_keys, head_dim, out);
    MS_ASSERT_MSG(exact, "attention keys must be bf16 values");
}

// Indices of the k largest of v[0..n), ties to the lower index: the one selection rule of the
// router, the indexer and the candidate blocks (the reference's torch.topk leaves the order
// among equal values unspecified, §3.4.8).
void top_k(const float* v, int64_t n, int64_t k, int32_t* out);

// Row `token` of an embedding-like table as floats.
void embedding_row(const weight_view& table, int32_t token, float* out);

// Activation round trip of §3.8 when the act_quant option is on (count: whole rows).
inline void act_quant(const env& e, act_quant_kind kind, float* x, int64_t count) {
    if (e.opts.act_quant) e.be.simulate_quant(kind, x, count);
}

// Observer helper: no-op without an observer.
void observe(const env& e, std::string_view name, int layer, const float* data, std::initializer_list<int64_t> shape);

}  // namespace moestream::dsv41::detail
