// Per-sequence state of the DeepSeek-V4.1 forward (§3.7): window rings, the shared compressed
// caches with their index keys and the ratio-2 pending pairs, DSpark rings, token history. The
// arrays sit in one backend allocation, carved here.
#include <algorithm>

#include "model/arch/deepseek41.h"

namespace moestream::dsv41 {

// Offsets of every part in the sequence's memory (each aligned to 256 bytes).
struct sequence_state::layout {
    size_t total = 0;
    std::vector<size_t> rings, draft_rings, latents, index_keys, pending;
    size_t main_hidden = 0;

    layout(const hparams& hp, int64_t max_tokens, int64_t ring_capacity, bool with_draft) {
        const auto take = [&](size_t bytes) {
            const size_t at = total;
            total += (bytes + 255) / 256 * 256;
            return at;
        };
        const size_t ring_bytes = size_t(ring_capacity * hp.head_dim) * sizeof(uint16_t);
        for (int l = 0; l < hp.n_layers; ++l) rings.push_back(take(ring_bytes));
        for (int layer : hp.kv_source_layers) {
            const int ratio = hp.compress_ratios[size_t(layer)];
            MS_ASSERT(ratio > 0);
            const int64_t entries = max_tokens / ratio;
            latents.push_back(take(size_t(entries * hp.head_dim) * sizeof(uint16_t)));
            index_keys.push_back(take(size_t(entries * hp.index_head_dim) * sizeof(float)));
            pending.push_back(ratio == 2 ? take(size_t((max_tokens / 2 + 1) * 2 * hp.head_dim) * sizeof(float)) : 0);
        }
        if (with_draft) {
            for (int s = 0; s < hp.n_mtp; ++s) draft_rings.push_back(take(ring_bytes));
            main_hidden = take(hp.dspark_target_layers.size() * size_t(hp.dim) * sizeof(float));
        }
    }
};

size_t sequence_state::memory_bytes(const hparams& hp, int64_t max_tokens, int64_t rollback, bool with_draft) {
    return layout(hp, max_tokens, hp.window + rollback, with_draft).total;
}

sequence_state::sequence_state(backend& be, const hparams& hp, int64_t max_tokens, int64_t rollback, bool with_draft)
    : be_(&be), max_tokens_(max_tokens), ring_capacity_(hp.window + rollback), rollback_(rollback) {
    MS_ASSERT(max_tokens > 0 && rollback >= 0);
    const layout at(hp, max_tokens, ring_capacity_, with_draft);
    memory_.bind(be);
    memory_.resize(at.total);  // zero-filled
    std::byte* base = memory_.data();
    tokens_.reserve(size_t(max_tokens));
    for (size_t off : at.rings) rings_.push_back(reinterpret_cast<uint16_t*>(base + off));
    for (size_t i = 0; i < hp.kv_source_layers.size(); ++i) {
        source_cache c;
        c.layer = hp.kv_source_layers[i];
        c.ratio = hp.compress_ratios[size_t(c.layer)];
        c.latents = reinterpret_cast<uint16_t*>(base + at.latents[i]);
        c.index_keys = reinterpret_cast<float*>(base + at.index_keys[i]);
        if (c.ratio == 2) c.pending = reinterpret_cast<float*>(base + at.pending[i]);
        sources_.push_back(c);
    }
    if (with_draft) {
        for (size_t off : at.draft_rings) draft_rings_.push_back(reinterpret_cast<uint16_t*>(base + off));
        last_main_hidden_ = reinterpret_cast<float*>(base + at.main_hidden);
        main_hidden_size_ = int64_t(hp.dspark_target_layers.size()) * hp.dim;
    }
}

int64_t sequence_state::truncation_floor(int64_t rows_ahead) const {
    // Every truncate() kept size() >= floor, and a forward moves both ends up together.
    MS_ASSERT(rows_ahead >= 0 && rings_written_ >= size() && rings_written_ - size() <= rollback_);
    // Position n's forward reads the window - 1 positions before it from the rings and the draft
    // at size n reads `window` (n - window .. n - 1); they are held from written - capacity on:
    // n - window >= written - (window + rollback).
    const int64_t written = std::max(rings_written_, size() + rows_ahead);
    return std::max<int64_t>(0, written - rollback_);
}

status sequence_state::truncate(int64_t n) {
    if (n < 0 || n > size())
        return make_error("cannot truncate a sequence of " + std::to_string(size()) + " tokens to " + std::to_string(n));
    if (!can_truncate_to(n))
        return make_error("cannot truncate a sequence of " + std::to_string(size()) + " tokens back to " +
                          std::to_string(n) + ": the window rings keep what it needs only from " +
                          std::to_string(truncation_floor()) + " on (rollback " + std::to_string(rollback_) + ", " +
                          std::to_string(rings_written_ - size()) +
                          " rolled-back positions written past the end; start the sequence again instead)");
    tokens_.resize(size_t(n));
    for (auto& c : sources_) c.entries = n / c.ratio;
    has_main_hidden_ = false;
    // Starting over: nothing before position 0 is ever read, so no slot is stale any more.
    if (n == 0) rings_written_ = 0;
    return {};
}

void sequence_state::copy_from(const sequence_state& other) {
    MS_ASSERT_MSG(other.be_ == be_ && other.memory_.size() == memory_.size() && other.max_tokens_ == max_tokens_ &&
                      other.ring_capacity_ == ring_capacity_ && other.sources_.size() == sources_.size() &&
                      other.draft_rings_.size() == draft_rings_.size(),
                  "copy_from needs a sequence of the same shape");
    be_->copy(memory_.data(), other.memory_.data(), memory_.bytes());
    tokens_ = other.tokens_;
    rings_written_ = other.rings_written_;
    for (size_t i = 0; i < sources_.size(); ++i) sources_[i].entries = other.sources_[i].entries;
    has_main_hidden_ = other.has_main_hidden_;
}

std::vector<float> sequence_state::last_main_hidden() const {
    std::vector<float> out;
    if (!has_main_hidden_) return out;
    out.resize(size_t(main_hidden_size_));
    be_->download(out.data(), last_main_hidden_, out.size() * sizeof(float));
    return out;
}

}  // namespace moestream::dsv41
