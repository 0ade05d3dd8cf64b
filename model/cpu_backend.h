// The CPU implementation of the backend ops: multi-threaded over rows (matmul over output rows)
// with a pool sized from the config, fp32 accumulation, bit-identical for any thread count.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/thread_pool.h"

namespace moestream {

class cpu_backend final : public backend {
  public:
    explicit cpu_backend(int threads);
    const char* name() const override { return "cpu"; }
    std::string device_description() const override;
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

    // Memory is host memory: allocations are zero-filled and 256-byte aligned, copies are memcpy.
    void* allocate(size_t bytes) override;
    void release(void* p) override;
    void upload(void* dst, const void* src, size_t bytes) override;
    void download(void* dst, const void* src, size_t bytes) override;
    void copy(void* dst, const void* src, size_t bytes) override;
    void fill(void* dst, uint8_t byte, size_t bytes) override;
    void synchronize() override {}
    bool host_memory() const override { return true; }
    // Copies made at once by the calling thread (memcpy), so the events are empty: the CPU's ops
    // are synchronous too (model/cpu_copy_stream.cpp).
    result<std::unique_ptr<copy_stream>> make_copy_stream(copy_stream_options opts) override;

    void matmul(const weight_view& w, const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride,
                bool round_bf16) override;
    void matmul_batch(std::span<const matmul_job> jobs) override;
    void output_sum(std::span<const output_term> terms, int64_t n, int64_t dim, float* f,
                    const hc_update* upd) override;
    void rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* y,
                  bool round_bf16) override;
    void round_bf16(float* x, int64_t count) override;
    void scale_round(float* x, int64_t count, float s) override;
    void add(float* y, const float* x, int64_t count) override;
    void embed(const weight_view& table, const int32_t* tokens, int64_t n, int copies, float* out) override;
    void stream_mean(const float* H, int64_t n, int hc, int64_t dim, float* out, int64_t out_stride) override;
    void copy_rows(std::span<const row_copy> jobs, int64_t count) override;
    void gather_rows(const float* src, int64_t src_stride, const int64_t* rows, int64_t m, int64_t dim,
                     float* dst) override;
    void pool_pairs(std::span<const pair_pool> jobs, int64_t dim) override;
    void store_keys(std::span<const key_store> jobs, int64_t head_dim) override;
    void dequant_fp8_rows(const uint8_t* values, const uint8_t* scales, int64_t rows, int64_t n,
                          float* out) override;
    void argmax_rows(const float* x, int64_t n, int64_t cols, int32_t* out) override;
    void indexer_select(const indexer_pick& p) override;
    void route(const float* scores, const float* bias, int64_t n, int n_experts, int k, double route_scale,
               bool select, int32_t* picks, float* weights) override;
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
    void order_picks(const int32_t* picks, const float* weights, int64_t n, int k, int32_t* sorted_picks,
                     float* sorted_weights) override;
    void moe_gate_up(const expert_slot_table& t, const float* x, int64_t n, int k, const int32_t* sorted_picks,
                     const float* sorted_weights, float* g, float* u, bool swiglu, float limit) override;
    void moe_down(const expert_slot_table& t, const float* g, int64_t n, int k, const int32_t* sorted_picks,
                  float* y) override;
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
    std::vector<const uint16_t*> key_ptrs_;  // attention: every row's keys, in order
    std::vector<int64_t> key_starts_;        // attention: each row's first key in key_ptrs_
    std::vector<matmul_job> routed_jobs_;    // moe_gate_up / moe_down: one job per assignment
    enum op_id { k_matmul, k_matmul_batch, k_rms_norm, k_rope, k_hc_mixes, k_hc_collapse, k_hc_expand, k_attention,
                 k_swiglu, k_indexer, k_engram, k_quant, k_output_sum, k_select, k_data, k_op_count };
    // Adds the op's wall time to its slot when profiling; nested ops (hc_mixes' matmul) count in both.
    struct timer {
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
    bool profiling_ = false;
    op_time times_[k_op_count] = {{"matmul"}, {"matmul_batch"}, {"rms_norm"}, {"rope"}, {"hc_mixes"}, {"hc_collapse"},
                                  {"hc_expand"}, {"attention"}, {"swiglu"}, {"indexer_scores"}, {"engram_gate"},
                                  {"act_quant"}, {"output_sum"}, {"route_select"}, {"data_moves"}};
};

}  // namespace moestream
