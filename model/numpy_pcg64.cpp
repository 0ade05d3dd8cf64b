#include "model/numpy_pcg64.h"

#include <limits>

#include "config/assert.h"

namespace moestream::engram {

namespace {

// SeedSequence hash constants (bit_generator.pyx).
constexpr uint32_t init_a = 0x43b0d7e5;
constexpr uint32_t mult_a = 0x931e8875;
constexpr uint32_t init_b = 0x8b51f9dd;
constexpr uint32_t mult_b = 0x58f38ded;
constexpr uint32_t mix_mult_l = 0xca01f9dd;
constexpr uint32_t mix_mult_r = 0x4973f715;
constexpr int xshift = 16;
constexpr size_t pool_size = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
    value ^= hash_const;
    hash_const *= mult_a;
    value *= hash_const;
    value ^= value >> xshift;
    return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t r = mix_mult_l * x - mix_mult_r * y;
    r ^= r >> xshift;
    return r;
}

// _int_to_uint32_array: little-endian 32-bit words, a single 0 word for 0.
std::vector<uint32_t> entropy_words(uint64_t n) {
    std::vector<uint32_t> words;
    if (n == 0) words.push_back(0);
    for (; n > 0; n >>= 32) words.push_back(static_cast<uint32_t>(n & 0xffffffffu));
    return words;
}

// SeedSequence.mix_entropy: the pool from which generate_state draws.
std::array<uint32_t, pool_size> mix_entropy(const std::vector<uint32_t>& entropy) {
    std::array<uint32_t, pool_size> pool{};
    uint32_t hash_const = init_a;
    for (size_t i = 0; i < pool_size; ++i)
        pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, hash_const);
    for (size_t src = 0; src < pool_size; ++src)
        for (size_t dst = 0; dst < pool_size; ++dst)
            if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
    for (size_t src = pool_size; src < entropy.size(); ++src)
        for (size_t dst = 0; dst < pool_size; ++dst)
            pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
    return pool;
}

// pcg64.h PCG_DEFAULT_MULTIPLIER_128.
constexpr unsigned __int128 pcg_multiplier =
    (static_cast<unsigned __int128>(0x2360ED051FC65DA4ULL) << 64) | 0x4385DF649FCCF645ULL;

constexpr unsigned __int128 make_u128(uint64_t high, uint64_t low) {
    return (static_cast<unsigned __int128>(high) << 64) | low;
}

}  // namespace

std::vector<uint64_t> seed_sequence_generate_state_u64(uint64_t entropy, size_t n_words) {
    const auto pool = mix_entropy(entropy_words(entropy));
    // generate_state works in 32-bit words, cycling over the pool; u64 words are consecutive
    // pairs read little-endian.
    std::vector<uint32_t> words(2 * n_words);
    uint32_t hash_const = init_b;
    for (size_t i = 0; i < words.size(); ++i) {
        uint32_t v = pool[i % pool_size];
        v ^= hash_const;
        hash_const *= mult_b;
        v *= hash_const;
        v ^= v >> xshift;
        words[i] = v;
    }
    std::vector<uint64_t> out(n_words);
    for (size_t i = 0; i < n_words; ++i)
        out[i] = static_cast<uint64_t>(words[2 * i]) | (static_cast<uint64_t>(words[2 * i + 1]) << 32);
    return out;
}

numpy_pcg64::numpy_pcg64(uint64_t seed) {
    // PCG64._seed_seq: 4 u64 words; pcg64_set_seed takes state = (w0 << 64 | w1) and
    // sequence = (w2 << 64 | w3), then pcg_setseq_128_srandom_r.
    const auto w = seed_sequence_generate_state_u64(seed, 4);
    const unsigned __int128 initstate = make_u128(w[0], w[1]);
    const unsigned __int128 initseq = make_u128(w[2], w[3]);
    state_ = 0;
    inc_ = (initseq << 1) | 1;
    step();
    state_ += initstate;
    step();
}

void numpy_pcg64::step() { state_ = state_ * pcg_multiplier + inc_; }

uint64_t numpy_pcg64::next_uint64() {
    // pcg_setseq_128_xsl_rr_64_random_r: advance, then XSL-RR of the new state.
    step();
    const auto hi = static_cast<uint64_t>(state_ >> 64);
    const auto lo = static_cast<uint64_t>(state_);
    const auto rot = static_cast<unsigned>(state_ >> 122);
    const uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t numpy_pcg64::next_uint32() {
    if (has_uint32_) {
        has_uint32_ = false;
        return uinteger_;
    }
    const uint64_t next = next_uint64();
    has_uint32_ = true;
    uinteger_ = static_cast<uint32_t>(next >> 32);
    return static_cast<uint32_t>(next & 0xffffffffu);
}

uint64_t numpy_pcg64::bounded_lemire_uint64(uint64_t rng) {
    MS_ASSERT(rng != std::numeric_limits<uint64_t>::max());
    const uint64_t rng_excl = rng + 1;
    unsigned __int128 m = static_cast<unsigned __int128>(next_uint64()) * rng_excl;
    uint64_t leftover = static_cast<uint64_t>(m);
    if (leftover < rng_excl) {
        // rng_excl bounds the threshold, so the modulo is only paid on the rare slow path.
        const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - rng) % rng_excl;
        while (leftover < threshold) {
            m = static_cast<unsigned __int128>(next_uint64()) * rng_excl;
            leftover = static_cast<uint64_t>(m);
        }
    }
    return static_cast<uint64_t>(m >> 64);
}

uint32_t numpy_pcg64::bounded_lemire_uint32(uint32_t rng) {
    MS_ASSERT(rng != std::numeric_limits<uint32_t>::max());
    const uint32_t rng_excl = rng + 1;
    uint64_t m = static_cast<uint64_t>(next_uint32()) * rng_excl;
    uint32_t leftover = static_cast<uint32_t>(m);
    if (leftover < rng_excl) {
        const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - rng) % rng_excl;
        while (leftover < threshold) {
            m = static_cast<uint64_t>(next_uint32()) * rng_excl;
            leftover = static_cast<uint32_t>(m);
        }
    }
    return static_cast<uint32_t>(m >> 32);
}

}  // namespace moestream::engram
