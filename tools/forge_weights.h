// Deterministic synthetic weights for `moestream forge`, including the routing scheme that makes
// forged models route like real ones (skewed expert popularity, content-dependent routing).
// See docs/forge.md for the scheme and its parameters.
//
// Every tensor is generated in independent chunks whose random streams are keyed by (seed,
// tensor name, chunk), so the bytes do not depend on the number of threads or the machine.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/arch/deepseek41_hparams.h"

namespace moestream::forge {

// Defaults calibrated on mini-lite against the real model's published cache statistics
// (docs/forge.md, "Calibration").
struct routing_scheme {
    int topics = 4096;            // content clusters of tokens (same normalised text, same topic)
    double zipf_exponent = 1.0;   // per-layer expert popularity ~ 1/rank^s, through the router bias
    double bias_scale = 0.28;     // bias units per ln(rank) (router scores are O(1))
    double topic_gain = 0.0;      // router logit gain along an expert's topic direction
    double topic_share = 0.6;     // fraction of an embedding row's energy along its token's topic
    double neighbour_mix = 0.5;   // topic k's direction leans toward topic k+1 (related topics)
    double router_noise = 3.0;    // std of the router logits' random part (logit units)
    double context_gain = 8.0;    // layer 0's attention adds this x sqrt(dim) x the recent tokens'
                                  // mean semantic direction to the residual (0: no context)
    double context_span = 8.0;    // width (tokens) of that attention's recency kernel
};

// The hidden state's semantic coordinates [0, semantic_dims(hp)): topic directions, and the
// context layer 0's attention adds. The next coordinate is the embedding's constant "anchor"
// (layer 0's query and key read it); the LM head reads only the coordinates after it, so the
// next token depends on the current token and not on the slowly changing context (no loops).
int64_t semantic_dims(const dsv41::hparams& hp);

// Topic of each token: tokens whose normalised text (lower case, no leading space/Ġ) is equal
// share a topic; digits, punctuation and CJK get their own topic families.
std::vector<int32_t> token_topics(const std::vector<std::string>& token_text, int topics);

struct forge_context {
    dsv41::hparams hp;
    uint64_t seed = 0;
    routing_scheme routing;
    std::vector<int32_t> topic_of_token;  // [vocab]
    std::vector<int32_t> token_map;       // engram compressed ids [vocab]
    int64_t compressed_vocab = 0;
    std::vector<std::vector<float>> topic_dirs;  // [topics][dim], from topic_direction()
    bool draft = false;  // filling the DSpark head's file (its blk.N are stages: no context layer)
};

// Fills one tensor of the inventory (out is exactly the tensor's bytes).
void fill_tensor(const forge_context& ctx, const dsv41::tensor_spec& spec, std::span<std::byte> out);

// Unit direction of topic k in R^dim, zero outside the semantic coordinates (shared by the
// embedding and the routers).
std::vector<float> topic_direction(const forge_context& ctx, int topic);

}  // namespace moestream::forge
