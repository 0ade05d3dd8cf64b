// Constrained decoding: an object that restricts which tokens a sequence may produce next, so
// that an output can be guaranteed to have a shape (a forced tool call, a JSON object) instead of
// hoping the model complies. The engine (scheduler/engine.h) consults it for every sampled token
// of a request that carries one: disallowed tokens get -inf logits before sampling (so the
// sampler's chain, seed and log-probabilities work on the allowed tokens only), the sampled token
// is then accepted, and once done() the generation ends with finish_reason "stop" without an
// end-of-sequence token. Stop tokens can only end a constrained request if the constraint allows
// them. Server-side implementations: server/output_constraint.h.
#pragma once

#include <cstdint>
#include <span>

namespace moestream {

// Called on the engine's strand only (never concurrently); one instance per request.
class token_constraint {
  public:
    virtual ~token_constraint() = default;
    // mask[vocab]: 1 = the token may come next, 0 = not. Every entry is written.
    virtual void allowed(std::span<uint8_t> mask) const = 0;
    // The token that was sampled; it was allowed by the latest allowed() (asserted by
    // implementations).
    virtual void accept(int32_t token) = 0;
    // The output is complete: nothing may follow.
    virtual bool done() const = 0;
};

}  // namespace moestream
