// Engram side tables (dsv41-architecture.md §3.2): primes, offsets, hash multipliers and the
// compressed token map. The reference computes them at load; we compute them exactly the same
// way (numpy's PCG64 stream reproduced in C++) and store them in the GGUF.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/result.h"

namespace moestream {
class tokenizer;
}

namespace moestream::engram {

struct layer_tables {
    int layer_id = 0;
    std::vector<int64_t> primes;   // [max_ngram-1][n_heads], order-major, head-minor
    std::vector<int64_t> offsets;  // exclusive prefix sum of primes, same order
    int64_t rows = 0;              // sum of primes
    std::vector<int64_t> multipliers;  // [max_ngram], odd, < INT64_MAX / compressed_vocab
};

// Primes: per layer, per n-gram order, cur = prime_start - 1; each head takes the smallest prime
// > cur not used before (globally), cur = that prime.
std::vector<layer_tables> compute_primes(const std::vector<int>& layer_ids, int max_ngram, int n_heads,
                                         int64_t prime_start);

// numpy: np.random.default_rng(seed).integers(low, high, size=n) for int64 (PCG64 + SeedSequence,
// Lemire's bounded integers), bit-exact.
std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high, size_t n);

// The reference's compute_hash_multipliers for one layer.
std::vector<int64_t> hash_multipliers(int layer_id, int max_ngram, int64_t compressed_vocab);

// build_compressed_token_map: `decoded[i]` is token i decoded alone (UTF-8, U+FFFD where the
// bytes are partial) and `raw[i]` its raw vocabulary string. Returns the map and the number of
// distinct keys.
struct token_map {
    std::vector<int32_t> map;
    int64_t compressed_vocab = 0;
};
result<token_map> build_compressed_token_map(const std::vector<std::string>& decoded,
                                             const std::vector<std::string>& raw);

// The key of one token as the reference's normalizer chain makes it (HF `tokenizers`: NFKC, NFD,
// StripAccents, Lowercase, [ \t\r\n]+ -> " ", a lone " " kept through Strip via a private-use
// sentinel, Strip). Before the empty / U+FFFD fallbacks of build_compressed_token_map.
// Errors on invalid UTF-8.
result<std::string> normalize_token_key(std::string_view decoded);

// One byte-level BPE token decoded alone, as HF's ByteLevel decoder does it: every character is
// mapped back through the GPT-2 byte<->unicode table (bytes 33..126, 161..172, 174..255 are
// themselves, the others 256+n in order); a token holding any character outside that table
// (added tokens such as "<｜User｜>") contributes its own UTF-8 bytes. The bytes are then read as
// UTF-8 lossily: each maximal invalid subsequence becomes U+FFFD (Rust's from_utf8_lossy).
std::string decode_byte_level(std::string_view token);

// UTF-8 with each maximal invalid subsequence replaced by U+FFFD (Rust String::from_utf8_lossy).
std::string utf8_lossy(std::string_view bytes);

// The compressed token map of a tokenizer (forge, and convert when a checkpoint has no
// engram_tables.safetensors): its real tokens decoded alone; padding ids (type unused) share the
// compressed id of `pad_id`.
result<token_map> token_map_from_tokenizer(const tokenizer& tok, int32_t pad_id);

}  // namespace moestream::engram
