// The engine's sequence states and the prefix reuse they allow. A fixed number of states is
// allocated once (max_sequences running + cached_sequences kept): a state is free, held by a
// running sequence, or kept after its sequence finished, in an LRU pool of bounded size. A new
// sequence gets a state that already holds the longest usable prefix of its prompt, taken from a
// kept state or copied from a running one, and then processes only the rest.
//
// A running sequence may also leave a copy of its state at the end of its prompt (keep_prefix):
// a finished state that ran more than `rollback` tokens past its prompt can no longer be
// truncated back there, and chat clients re-tokenize a reply differently from how it was
// generated, so the next turn often parts from the kept state within the reply; the prompt's
// checkpoint still serves the whole earlier prompt.
//
// A state is consistent at every step boundary: a forward either consumes all of an item's tokens
// or changes nothing (model::forward), so tokens() is exactly what its caches hold, whatever
// ended its sequence (a cancel between steps, a stop token, an error). Not thread-safe: the
// engine's strand owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/arch/deepseek41.h"

namespace moestream {

struct prefix_pool_options {
    int64_t running = 8;       // states held by running sequences at most
    int64_t cached = 4;        // kept states (finished sequences, prompt checkpoints) at most
    int64_t context = 8192;    // positions per state
    int64_t rollback = 64;     // how far back a state can be truncated
    int64_t min_copy = 16;     // a copied prefix pays from this length (or from half the prompt)
};

class prefix_pool {
  public:
    prefix_pool(const dsv41::model& m, prefix_pool_options opts);

    struct grant {
        std::unique_ptr<dsv41::sequence_state> state;
        int64_t reused = 0;  // the state holds prompt[0, reused)
        bool copied = false; // from a running sequence or a kept state that stays kept
    };
    // A state for a new sequence with this prompt (fewer than `running` states must be out). With
    // `reuse`, it holds the longest prefix a kept or running state can give (leaving at least the
    // last prompt token to process: its logits are needed); otherwise it is empty. `running` lists
    // the states of the running sequences (read only: their copies go into free states).
    grant acquire(std::span<const int32_t> prompt, bool reuse,
                  std::span<const dsv41::sequence_state* const> running);
    // A finished sequence's state: kept (evicting the least recently used one when the pool is
    // full) when `keep` and non-empty, else freed. `checkpoint`: the id keep_prefix gave for the
    // sequence's prompt, dropped when the kept state covers it (serves every prompt it served in
    // place, see covers()); ignored when that state is no longer kept.
    void give_back(std::unique_ptr<dsv41::sequence_state> state, bool keep, uint64_t checkpoint = 0);
    // Keeps a copy of a running state truncated to its first n tokens (running.can_truncate_to(n)),
    // evicting the least recently used kept state when the pool is full; its id for
    // give_back. 0 when nothing was copied: the pool keeps nothing, or a kept state already
    // covers those tokens (it becomes the most recently used instead).
    uint64_t keep_prefix(const dsv41::sequence_state& running, int64_t n);

    int64_t kept() const { return int64_t(kept_.size()); }
    int64_t free() const { return int64_t(free_.size()); }
    const prefix_pool_options& options() const { return opts_; }

    // How many of `prompt`'s first tokens the state `held` can serve: the common prefix, at most
    // prompt.size() - 1, and only if the state can be truncated there (within rollback, counting
    // verification rows it rolled back: see sequence_state::can_truncate_to); 0 when it cannot.
    int64_t usable(const dsv41::sequence_state& held, std::span<const int32_t> prompt) const;
    // Whether the state `held` can become one holding exactly `tokens`: they are its first tokens
    // and it can be truncated to their end.
    bool covers(const dsv41::sequence_state& held, std::span<const int32_t> tokens) const;

  private:
    struct kept_state {
        std::unique_ptr<dsv41::sequence_state> state;
        uint64_t used = 0;  // LRU clock
        uint64_t id = 0;    // for give_back's checkpoint; never 0
    };
    std::unique_ptr<dsv41::sequence_state> take_free();
    // A free state made a copy of `from` truncated to its first n tokens (from.can_truncate_to(n)).
    std::unique_ptr<dsv41::sequence_state> copy_truncated(const dsv41::sequence_state& from, int64_t n);
    void release(std::unique_ptr<dsv41::sequence_state> s);
    // Frees the least recently used kept state when the pool is full.
    void make_room();
    // Adds a kept state, making room first; its id.
    uint64_t add_kept(std::unique_ptr<dsv41::sequence_state> s);
    // Every state is free, kept or out (held by a running sequence): no more kept than `cached`,
    // no more out than `running`, so a free state is left whenever fewer than `running` are out.
    void check_counts() const;

    prefix_pool_options opts_;
    int64_t total_;
    std::vector<std::unique_ptr<dsv41::sequence_state>> free_;
    std::vector<kept_state> kept_;
    uint64_t clock_ = 0;
    uint64_t next_id_ = 0;
};

}  // namespace moestream
