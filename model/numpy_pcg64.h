// numpy's default generator, reproduced bit for bit: np.random.default_rng(seed) is
// SeedSequence(seed) -> PCG64 (128-bit LCG, XSL-RR output), and Generator.integers draws with
// Lemire's bounded method. The reference derives the engram hash multipliers from this stream,
// so a converter that wants to regenerate them must follow numpy's C sources exactly
// (bit_generator.pyx SeedSequence, src/pcg64/pcg64.h, src/distributions/distributions.c).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace moestream::engram {

// SeedSequence(entropy).generate_state(n_words, np.uint64) for a non-negative integer entropy
// and no spawn key (pool size 4).
std::vector<uint64_t> seed_sequence_generate_state_u64(uint64_t entropy, size_t n_words);

// numpy's PCG64 bit generator, including the 32-bit half buffering of next_uint32.
class numpy_pcg64 {
public:
    // Seeded the way np.random.default_rng(seed) does (via SeedSequence).
    explicit numpy_pcg64(uint64_t seed);

    uint64_t next_uint64();
    // Low half of a fresh 64-bit draw first, then its high half on the next call.
    uint32_t next_uint32();

    // distributions.c bounded_lemire_uint64: uniform in [0, rng] for rng < UINT64_MAX.
    uint64_t bounded_lemire_uint64(uint64_t rng);
    // distributions.c buffered_bounded_lemire_uint32: uniform in [0, rng] for rng < UINT32_MAX.
    uint32_t bounded_lemire_uint32(uint32_t rng);

private:
    void step();

    unsigned __int128 state_ = 0;
    unsigned __int128 inc_ = 0;
    bool has_uint32_ = false;
    uint32_t uinteger_ = 0;
};

}  // namespace moestream::engram
