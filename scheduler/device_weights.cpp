#include "scheduler/device_weights.h"

#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "model/q8_0_tiles.h"

namespace moestream {
namespace {

constexpr size_t kAlign = 256;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Every dense tensor of a block, as the loader bound it (model_loader.cpp bind_block).
// A weight visitor: the view, and whether only matmuls read it (so that a backend may keep it in
// a matmul's own layout: model/q8_0_tiles.h); tables read by rows (embeddings) and the hc mixes'
// matrices (read by hc_mixes too) are not.
using weight_visitor = std::function<void(weight_view&, bool matmul_only)>;

// out_a is read in groups of o_lora_rank rows (the grouped output projection slices it): whole
// strips of a tiled matrix only when the groups are.
void for_each_tensor(dsv41::layer_weights& lw, bool out_a_groups_whole, const weight_visitor& w,
                     const std::function<void(vector_view&)>& v) {
    for (vector_view* p : {&lw.attn_norm, &lw.attn_sinks, &lw.q_a_norm, &lw.kv_a_norm, &lw.ffn_norm, &lw.exp_probs_b,
                           &lw.hc_attn_base, &lw.hc_attn_scale, &lw.hc_ffn_base, &lw.hc_ffn_scale, &lw.compressor_norm,
                           &lw.index_k_norm, &lw.engram_qk})
        v(*p);
    for (weight_view* p : {&lw.hc_attn_fn, &lw.hc_ffn_fn}) w(*p, false);
    w(lw.out_a, out_a_groups_whole);
    for (weight_view* p : {&lw.q_a, &lw.q_b, &lw.kv, &lw.out_b, &lw.gate_inp, &lw.gate_shexp, &lw.up_shexp,
                           &lw.down_shexp, &lw.compressor_kv, &lw.compressor_gate, &lw.index_k, &lw.index_q_b,
                           &lw.index_proj, &lw.engram_wkv})
        w(*p, true);
}

void for_each_tensor(const dsv41::hparams& hp, dsv41::model_weights& mw, std::optional<dsv41::draft_weights>& dw,
                     const weight_visitor& w, const std::function<void(vector_view&)>& v) {
    const bool groups_whole = hp.o_lora_rank % 8 == 0;
    w(mw.token_embd, false);
    w(mw.output, true);
    v(mw.output_norm);
    for (auto& lw : mw.layers) for_each_tensor(lw, groups_whole, w, v);
    if (!dw) return;
    w(dw->markov_embed, false);
    for (weight_view* p : {&dw->fc, &dw->markov_head, &dw->conf_proj}) w(*p, true);
    for (vector_view* p : {&dw->enc_norm, &dw->output_norm}) v(*p);
    for (auto& lw : dw->stages) for_each_tensor(lw, groups_whole, w, v);
}

size_t view_bytes(const weight_view& w) { return w.empty() ? 0 : size_t(w.rows) * w.row_stride; }
size_t view_bytes(const vector_view& v) { return v.empty() ? 0 : size_t(v.size) * sizeof(float); }

}  // namespace

size_t dense_weight_bytes(const loaded_model& m) {
    dsv41::model_weights mw = m.weights;
    std::optional<dsv41::draft_weights> dw = m.draft;
    size_t total = 0;
    for_each_tensor(
        m.hp, mw, dw, [&](weight_view& w, bool) { total += aligned(view_bytes(w)); },
        [&](vector_view& v) { total += aligned(view_bytes(v)); });
    return total;
}

void tile_q8_0_on_threads(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols, int threads) {
    const int64_t strips = rows / q8_0_tiles::kStripRows, strip = q8_0_tiles::strip_bytes(cols);
    if (strips == 0) return;
    // A thread pays from about a MiB of strips; smaller matrices tile on the calling thread.
    constexpr int64_t kBytesPerThread = int64_t(1) << 20;
    const int64_t n = std::clamp<int64_t>(std::min<int64_t>(threads, strips * strip / kBytesPerThread), 1, strips);
    const auto tile_run = [&](int64_t i) {
        const int64_t s0 = strips * i / n, s1 = strips * (i + 1) / n;
        q8_0_tiles::tile_matrix(src + s0 * strip, dst + s0 * strip, (s1 - s0) * q8_0_tiles::kStripRows, cols);
    };
    std::vector<std::jthread> helpers;
    helpers.reserve(size_t(n - 1));
    for (int64_t i = 1; i < n; ++i) helpers.emplace_back(tile_run, i);
    tile_run(0);
}

result<std::unique_ptr<device_weights>> upload_dense_weights(backend& be, const loaded_model& m) {
    auto out = std::make_unique<device_weights>();
    out->weights = m.weights;
    out->draft = m.draft;
    const size_t total = dense_weight_bytes(m);
    out->memory.bind(be);
    if (!out->memory.try_resize(total))
        return make_error("the " + std::string(be.name()) + " backend has no room for the model's dense weights (" +
                          std::to_string(total >> 20) + " MiB)");
    std::byte* base = out->memory.data();
    size_t at = 0;
    // Dense Q8_0 matrices in the backend's matmul layout where it has one (tiled here on the
    // host, a matrix at a time: the upload copies its source before it returns).
    const bool tile_q8 = be.tiles_q8_0();
    // Threads because flash has ~7 GB of dense Q8_0 (an estimate from its shapes; the time one
    // thread takes on it was not measured).
    const int tiler_threads = int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
    std::vector<uint8_t> tiled;
    for_each_tensor(
        m.hp, out->weights, out->draft,
        [&](weight_view& w, bool matmul_only) {
            if (w.empty()) return;
            if (matmul_only && tile_q8 && w.type == ggml_type::q8_0 && w.layout == weight_layout::rows &&
                q8_0_tiles::tileable(w.rows, w.cols, int64_t(w.row_stride))) {
                tiled.resize(view_bytes(w));
                tile_q8_0_on_threads(static_cast<const uint8_t*>(w.data), tiled.data(), w.rows, w.cols, tiler_threads);
                be.upload(base + at, tiled.data(), tiled.size());
                w.layout = weight_layout::q8_0_tiles;
            } else {
                be.upload(base + at, w.data, view_bytes(w));
            }
            w.data = base + at;
            at += aligned(view_bytes(w));
        },
        [&](vector_view& v) {
            if (v.empty()) return;
            be.upload(base + at, v.data, view_bytes(v));
            v.data = reinterpret_cast<const float*>(base + at);
            at += aligned(view_bytes(v));
        });
    MS_ASSERT(at == total);
    be.synchronize();
    return out;
}

}  // namespace moestream
