// Per-sequence state of the DeepSeek-V4.1 forward (§3.7): window rings, the shared compressed
// caches with their index keys and the ratio-2 pending pairs, DSpark rings, token history.
#include <algorithm>

#include "model/arch/deepseek41.h"

namespace moestream::dsv41 {

sequence_state::sequence_state(const hparams& hp, int64_t max_tokens, int64_t rollback, bool with_draft)
    : max_tokens_(max_tokens), ring_capacity_(hp.window + rollback), rollback_(rollback) {
    MS_ASSERT(max_tokens > 0 && rollback >= 0);
    tokens_.reserve(size_t(max_tokens));
    rings_.resize(size_t(hp.n_layers));
    for (auto& r : rings_) r.assign(size_t(ring_capacity_ * hp.head_dim), 0);
    for (int layer : hp.kv_source_layers) {
        source_cache c;
        c.layer = layer;
        c.ratio = hp.compress_ratios[size_t(layer)];
        MS_ASSERT(c.ratio > 0);
        const int64_t entries = max_tokens / c.ratio;
        c.latents.assign(size_t(entries * hp.head_dim), 0);
        c.index_keys.assign(size_t(entries * hp.index_head_dim), 0.0f);
        if (c.ratio == 2) c.pending.assign(size_t((max_tokens / 2 + 1) * 2 * hp.head_dim), 0.0f);
        sources_.push_back(std::move(c));
    }
    if (with_draft) {
        draft_rings_.resize(size_t(hp.n_mtp));
        for (auto& r : draft_rings_) r.assign(size_t(ring_capacity_ * hp.head_dim), 0);
    }
}

status sequence_state::truncate(int64_t n) {
    if (n < 0 || n > size())
        return make_error("cannot truncate a sequence of " + std::to_string(size()) + " tokens to " + std::to_string(n));
    if (n != 0 && n < size() - rollback_)
        return make_error("cannot truncate back " + std::to_string(size() - n) + " positions: the window rings keep " +
                          std::to_string(rollback_) + " (start the sequence again instead)");
    tokens_.resize(size_t(n));
    for (auto& c : sources_) c.entries = n / c.ratio;
    last_main_hidden_.clear();
    return {};
}

}  // namespace moestream::dsv41
