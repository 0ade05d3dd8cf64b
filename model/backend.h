// The compute interface the model is written against. Every op works on rows of float
// activations that live in the backend's memory (host memory for the CPU backend). Values that
// the reference keeps in bf16 are held as floats rounded to bf16 (`round_bf16` flags), so the
// same model code runs exact-to-the-reference on any backend; accumulation is fp32 everywhere.
//
// Row-parallel ops must give bit-identical results for a row whatever the other rows of the
// batch are and whatever the thread count (reproducibility, see cpu_matmul.h).
#pragma once

#include <cstdint>
#include <span>

#include "model/act_quant.h"
#include "model/tensor.h"

namespace moestream {

// One query row of a sparse attention: its keys (= values, MQA with K = V) given as pointers to
// head_dim-value vectors stored as model/attention_keys.h says (bf16 bits, since every key is a
// rounded bf16 value, in an order the kernels load without shuffles), window entries first, then
// selected compressed entries.
struct attention_row {
    const float* q = nullptr;       // n_heads * head_dim
    const uint16_t* const* keys = nullptr;
    int64_t n_keys = 0;
    float* out = nullptr;           // n_heads * head_dim
};

// One matmul of a batch: y[r] = W x[r] for r < n (see backend::matmul).
struct matmul_job {
    weight_view w;
    const float* x = nullptr;
    int64_t x_stride = 0;
    int64_t n = 0;
    float* y = nullptr;
    int64_t y_stride = 0;
    bool round_bf16 = false;
    // The router's scores instead: y = router_score(W x) (sqrt of softplus, model/router_score.h),
    // computed in the parallel pass rather than serially after it.
    bool router_scores = false;
    // A SwiGLU pair (an expert's gate and up): with `up` set, W is the gate, u[r] = up x[r] (same
    // rounding as y) and the pass then leaves y[r] = swiglu(y[r], u[r]) as backend::swiglu would
    // (limit, row weights swiglu_w or 1), each tile of rows as soon as both of its halves are
    // computed, so the activation takes no step of its own.
    weight_view up{};
    float* u = nullptr;
    int64_t u_stride = 0;
    float swiglu_limit = 0;
    const float* swiglu_w = nullptr;
};

// The residual-stream update of §3.3 after a sub-layer whose output is f [n, dim]: H[r][j] =
// bf16(post[r][j] f[r] + Σ_i comb[r][i][j] H[r][i]) in place (hc_expand), then, when `next` is
// set, next[r] = bf16(Σ_k pre[r][k] H[r][k]) (hc_collapse: the following sub-layer's input).
struct hc_update {
    float* H = nullptr;           // [n, hc, dim]
    const float* post = nullptr;  // [n, hc]
    const float* comb = nullptr;  // [n, hc, hc]
    const float* pre = nullptr;   // [n, hc], with next
    float* next = nullptr;        // [n, dim] or null
    int hc = 0;
};

// One term of a sub-layer's output (backend::output_sum): m rows y[i] = bf16(W h[i]) (W: [dim,
// cols]), or, with W empty, m rows y[i] computed earlier. Row i adds into output row rows[i]
// (rows null: row i).
struct output_term {
    weight_view w;
    const float* h = nullptr;       // m x w.cols
    const float* y = nullptr;       // m x dim, when w is empty
    const int64_t* rows = nullptr;  // m output rows, or null
    int64_t m = 0;
};

class backend {
  public:
    virtual ~backend() = default;
    virtual const char* name() const = 0;
    virtual int threads() const = 0;

    // y[r] = W x[r] for r < n (x rows of w.cols floats, y rows of w.rows floats; strides in floats).
    virtual void matmul(const weight_view& w, const float* x, int64_t x_stride, int64_t n, float* y,
                        int64_t y_stride, bool round_bf16) = 0;
    // Independent matmuls run as one parallel step (decode's many small ones: the experts of a
    // layer, q_a with kv, the output groups), each value as matmul() would compute it.
    virtual void matmul_batch(std::span<const matmul_job> jobs) = 0;
    // A sub-layer's output and the residual update it feeds, in one parallel pass over slices of
    // dim: f[r] = bf16(Σ_t y_t[i] over the terms' rows i that add into r, the terms in the order
    // given, the sum starting from 0), then `upd` (may be null) from f. The MoE's down projections
    // and their weighted sum, or the attention's output projection, followed by hc_expand and
    // hc_collapse: every value as those separate steps would give it.
    virtual void output_sum(std::span<const output_term> terms, int64_t n, int64_t dim, float* f,
                            const hc_update* upd) = 0;
    // y[r] = w ⊙ x[r] / sqrt(mean(x[r]²) + eps); w may be null (weightless); y may alias x.
    virtual void rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y,
                          bool round_bf16) = 0;
    virtual void round_bf16(float* x, int64_t count) = 0;
    // Interleaved-pair RoPE on the last rope_dim dims of each head: pair i of row r turns by
    // fp32(pos[r]) * freqs[i] (negated when inverse). Result rounded to bf16.
    virtual void rope(float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim, int64_t rope_dim,
                      const int64_t* pos, const float* freqs, bool inverse) = 0;

    // Hyper-connection mixes of §3.3 for n rows of 4 streams (H: [n, hc, dim]); fn [24, hc*dim]
    // (F32 view), base [24], scale [3]. Writes pre [n, hc], post [n, hc], comb [n, hc, hc].
    // fn_h: fn · H per row when the caller already computed it (batched with other matmuls), else null.
    virtual void hc_mixes(const float* H, int64_t n, int hc, int64_t dim, const weight_view& fn, const float* base,
                          const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* pre, float* post,
                          float* comb, const float* fn_h) = 0;
    // out[r] = bf16(Σ_k p[r][k] H[r][k])
    virtual void hc_collapse(const float* H, int64_t n, int hc, int64_t dim, const float* p, float* out) = 0;
    // out[r][j] = bf16(post[r][j] f[r] + Σ_i comb[r][i][j] H[r][i]); out may alias H.
    virtual void hc_expand(const float* f, const float* H, int64_t n, int hc, int64_t dim, const float* post,
                           const float* comb, float* out) = 0;

    // Sparse attention with a per-head sink logit (§3.4.9); output rounded to bf16.
    // With bf16_probs the exp(s - max) weights are rounded to bf16 before they multiply the
    // values (the reference kernel's rounding, §3.8), the denominator still sums fp32 values.
    virtual void attention(std::span<const attention_row> rows, int n_heads, int64_t head_dim, float scale,
                           const float* sinks, bool bf16_probs) = 0;

    // Quantise-dequantise in place as the reference's low-precision activations (§3.8).
    virtual void simulate_quant(act_quant_kind kind, float* x, int64_t count) = 0;

    // SwiGLU with the V4.1 clamps, in place into g: g[r] = bf16(w[r] · silu(min(g, limit)) ⊙ clamp(u, ±limit)).
    // w may be null (weight 1). g and u hold n rows of `inter` floats.
    virtual void swiglu(float* g, const float* u, int64_t n, int64_t inter, float limit, const float* w) = 0;

    // Indexer scores in the reference's bf16 arithmetic (§3.4.6): for row r and entry j <
    // n_visible[r], score = bf16(Σ_h bf16(relu(bf16(q[r]_h · k_j)) · w[r]_h)); later entries get -inf.
    // q [n, n_heads, head_dim], w [n, n_heads], keys [n_keys, head_dim], scores [n, n_keys].
    virtual void indexer_scores(const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim,
                                const float* keys, int64_t n_keys, const int64_t* n_visible, float* scores) = 0;

    // Engram gated write (§3.2 steps 3-6) for n rows: H [n, hc, dim] is updated in place from
    // kv [n, (hc+1)*dim] (hc keys, then the shared value) and qk = q_weight ⊙ k_weight [hc, dim].
    virtual void engram_gate(float* H, int64_t n, int hc, int64_t dim, const float* kv, const float* qk,
                             float norm_eps) = 0;
};

}  // namespace moestream
