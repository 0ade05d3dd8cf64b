// DeepSeek-V4.1 hyper-parameters (dsv41-architecture.md §2, §7), the forge presets, and the
// tensor inventory of the `deepseek41` target GGUF (§4.2) and the DSpark `dflash` GGUF (§5.5).
// The inventory is the single source of tensor names, shapes and storage types: forge writes it,
// the loader checks a file against it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/dtype.h"
#include "config/result.h"

namespace moestream::dsv41 {

struct hparams {
    // backbone
    int64_t vocab = 129280;
    int64_t dim = 5120;
    int n_layers = 40;  // backbone layers (DSpark stages come after, see n_mtp)
    int n_mtp = 3;      // DSpark stages
    int n_heads = 64;
    int64_t head_dim = 512;
    int64_t rope_dim = 64;  // the last rope_dim dims of each head carry RoPE
    int64_t q_lora_rank = 1280;
    int o_groups = 8;
    int64_t o_lora_rank = 1024;
    int64_t window = 128;
    std::vector<int> compress_ratios;  // n_layers + n_mtp entries
    std::vector<int> kv_source_layers;
    std::vector<int> index_source_layers;
    int candidate_source_layer = 20;
    int64_t candidate_topk_blocks = 2048;
    int64_t candidate_block_size = 8;
    int index_n_heads = 32;
    int64_t index_head_dim = 128;
    int64_t index_topk = 512;
    // RoPE
    double rope_theta = 10000;
    double compress_rope_theta = 160000;
    double rope_factor = 16;
    int64_t original_seq_len = 65536;
    double beta_fast = 32;
    double beta_slow = 1;
    int64_t max_position = 1048576;
    // norms and hyper-connections
    double norm_eps = 1e-20;
    int hc_mult = 4;
    int hc_sinkhorn_iters = 20;
    double hc_eps = 1e-6;
    // MoE
    int n_experts = 384;
    int n_active = 6;
    int n_shared = 1;
    int64_t moe_inter = 2304;
    double route_scale = 1.5;
    bool norm_topk = true;
    double swiglu_limit = 10.0;
    // engram
    std::vector<int> engram_layers{1, 14};
    int engram_max_ngram = 4;
    int engram_n_heads = 8;
    int64_t engram_head_dim = 256;
    int64_t engram_prime_start = 16000000;
    int32_t engram_pad_id = 2;
    // DSpark draft head
    int dspark_n_experts = 128;
    int dspark_n_active = 3;
    int64_t dspark_markov_rank = 256;
    int dspark_block_size = 5;
    int32_t dspark_noise_token = 128799;
    std::vector<int> dspark_target_layers{37, 38, 39};

    int64_t q_dim() const { return int64_t(n_heads) * head_dim; }
    int heads_per_group() const { return n_heads / o_groups; }
    int64_t engram_columns() const { return int64_t(engram_max_ngram - 1) * engram_n_heads; }
    bool is_kv_source(int layer) const;
    bool is_index_source(int layer) const;
    bool is_engram_layer(int layer) const;
};

// Presets of forge: "tiny", "mini-lite", "mini", "flash" (the real shapes).
std::optional<hparams> preset(std::string_view name);
std::vector<std::string_view> preset_names();

// Structural checks (every role of §2.2 consistent, dims multiples of 32, ...). Errors name the field.
status validate(const hparams& hp);

struct tensor_spec {
    std::string name;
    std::vector<int64_t> shape;  // ggml order: shape[0] is the fastest (input) dimension
    ggml_type type;
    enum class role { dense, expert, engram_table, side_table } kind = role::dense;
};

struct storage_policy {
    ggml_type linear = ggml_type::q8_0;      // fp8 weights of the checkpoint
    ggml_type expert = ggml_type::mxfp4;     // routed experts
    ggml_type embedding = ggml_type::bf16;   // token embedding and LM head
    ggml_type bf16_weights = ggml_type::bf16;  // compressor, indexer k/proj, router, engram q/k
};

// §4.2, in file order: dense tensors, then experts (expert-major inside each tensor), then the
// engram tables last so loader prefetch never touches them.
std::vector<tensor_spec> target_tensors(const hparams& hp, const storage_policy& policy = {});
// §5.5: the DSpark `dflash` file.
std::vector<tensor_spec> draft_tensors(const hparams& hp, const storage_policy& policy = {});

// Rows of engram table of the i-th engram layer (sum of its primes), computed from the primes.
int64_t engram_rows(const hparams& hp, size_t engram_index);

// Bytes of one routed expert (gate + up + down) in the given type.
int64_t expert_bytes(const hparams& hp, ggml_type type, bool draft = false);

}  // namespace moestream::dsv41
