// The CPU implementation of the backend ops: multi-threaded over rows (matmul over output rows)
// with a pool sized from the config, fp32 accumulation, bit-identical for any thread count.
#pragma once

#include <memory>
#include <vector>

#include "model/backend.h"
#include "model/thread_pool.h"

namespace moestream {

class cpu_backend final : public backend {
  public:
    explicit cpu_backend(int threads);
    const char* name() const override { return "cpu"; }
    int threads() const override { return pool_.size(); }
    thread_pool& pool() { return pool_; }

    // Optional time accounting per op (bench cpu --profile): off by default, a clock read per op.
    struct op_time {
        const char* op;
        int64_t calls = 0;
        double seconds = 0;
    };
    void set_profiling(bool on) { profiling_ = on; }
    std::vector<op_time> profile() const;
    void reset_profile();

    void matmul(const weight_view& w, const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride,
                bool round_bf16) override;
    void matmul_batch(std::span<const matmul_job> jobs) override;
    void output_sum(std::span<const output_term> terms, int64_t n, int64_t dim, float* f,
                    const hc_update* upd) override;
    void rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y,
                  bool round_bf16) override;
    void round_bf16(float* x, int64_t count) override;
    void rope(float* x, int64_t n, int64_t row_stride, int n_heads, int64_t head_dim, int64_t rope_dim,
              const int64_t* pos, const float* freqs, bool inverse) override;
    void hc_mixes(const float* H, int64_t n, int hc, int64_t dim, const weight_view& fn, const float* base,
                  const float* scale, int sinkhorn_iters, float hc_eps, float norm_eps, float* pre, float* post,
                  float* comb, const float* fn_h) override;
    void hc_collapse(const float* H, int64_t n, int hc, int64_t dim, const float* p, float* out) override;
    void hc_expand(const float* f, const float* H, int64_t n, int hc, int64_t dim, const float* post,
                   const float* comb, float* out) override;
    void attention(std::span<const attention_row> rows, int n_heads, int64_t head_dim, float scale,
                   const float* sinks, bool bf16_probs) override;
    void simulate_quant(act_quant_kind kind, float* x, int64_t count) override;
    void swiglu(float* g, const float* u, int64_t n, int64_t inter, float limit, const float* w) override;
    void indexer_scores(const float* q, const float* w, int64_t n, int n_heads, int64_t head_dim, const float* keys,
                        int64_t n_keys, const int64_t* n_visible, float* scores) override;
    void engram_gate(float* H, int64_t n, int hc, int64_t dim, const float* kv, const float* qk,
                     float norm_eps) override;

  private:
    struct tile {
        int32_t job;
        int64_t begin, end;
    };
    thread_pool pool_;
    std::vector<tile> tiles_;              // matmul_batch's work list, reused
    std::vector<int64_t> job_row_bytes_;   // its jobs' weight bytes per output row (0: no rows)
    std::vector<int64_t> share_starts_;    // first tile of each thread's share (equal bytes)
    std::vector<int64_t> run_starts_;      // output_sum: first unit of each thread's run
    enum op_id { k_matmul, k_matmul_batch, k_rms_norm, k_rope, k_hc_mixes, k_hc_collapse, k_hc_expand, k_attention,
                 k_swiglu, k_indexer, k_engram, k_quant, k_output_sum, k_op_count };
    struct timer;
    bool profiling_ = false;
    op_time times_[k_op_count] = {{"matmul"}, {"matmul_batch"}, {"rms_norm"}, {"rope"}, {"hc_mixes"}, {"hc_collapse"},
                                  {"hc_expand"}, {"attention"}, {"swiglu"}, {"indexer_scores"}, {"engram_gate"},
                                  {"act_quant"}, {"output_sum"}};
};

}  // namespace moestream
