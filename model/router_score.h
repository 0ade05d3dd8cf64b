// The MoE router's score of one logit (dsv41-architecture.md §3.5): sqrt(softplus(v)) in fp32,
// softplus formed as the reference forms it. One definition for every backend and the model.
#pragma once

#include <cmath>

namespace moestream {

inline float router_score(float v) {
    const float softplus = v > 20.0f ? v : std::log1p(std::exp(v));
    return std::sqrt(softplus);
}

}  // namespace moestream
