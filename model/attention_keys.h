// How attention keys are stored (attention_row::keys): as bf16 bits (every key the model makes is
// already a rounded bf16 value), and within each whole 32-value chunk of a key with its two
// 16-value halves interleaved: word 2j holds value j, word 2j + 1 value j + 16. One 64-byte load
// then gives both halves as fp32 lanes with one shift or one mask each (the kernels' lanes take
// values j and j + 16 of a chunk), where widening 16 words kept in order costs shuffles that
// bound the attention kernels. The values of a final partial chunk keep their order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/bf16.h"
#include "model/numeric.h"

namespace moestream {

inline constexpr int64_t kKeyChunk = 32;

// The storage index of value d of an n-value key (the CUDA kernels use it too).
MS_HD int64_t key_word(int64_t d, int64_t n) {
    const int64_t chunk = d - d % kKeyChunk;
    if (chunk + kKeyChunk > n) return d;  // the partial tail chunk: in order
    const int64_t j = d % kKeyChunk;
    return chunk + (j < kKeyChunk / 2 ? 2 * j : 2 * (j - kKeyChunk / 2) + 1);
}

// Value d of a stored n-value key.
inline float key_value(const uint16_t* key, int64_t d, int64_t n) { return bf16_value(key[key_word(d, n)]); }

// n_keys keys of n values each (x: row-major floats) into their storage; false (out then partly
// written) if some value is not exactly a bf16 value. Each key's bits are taken in order, then
// every whole chunk's halves are interleaved in place.
inline bool store_attention_keys(const float* x, int64_t n_keys, int64_t n, uint16_t* out) {
    constexpr int64_t half = kKeyChunk / 2;
    bool exact = true;
    for (int64_t k = 0; k < n_keys; ++k, x += n, out += n) {
        exact &= to_bf16_bits_exact(x, n, out);
        for (int64_t c = 0; c + kKeyChunk <= n; c += kKeyChunk) {
            uint16_t in_order[kKeyChunk];
            std::copy_n(out + c, kKeyChunk, in_order);
            for (int64_t j = 0; j < half; ++j) {
                out[c + 2 * j] = in_order[j];
                out[c + 2 * j + 1] = in_order[half + j];
            }
        }
    }
    return exact;
}

}  // namespace moestream
