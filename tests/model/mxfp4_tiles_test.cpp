// Tests for model/mxfp4_tiles.h, the layout the CUDA backend's tensor-core matmul reads: every
// claim of its header checked here against values computed independently (e2m1 written out
// below, fp16 decoded by hand), on the host; the device's tiler and matmul are checked against
// these functions by tests/cuda.
#include "model/mxfp4_tiles.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "config/assert.h"
#include "tests/common/test_support.h"

using namespace moestream;
namespace tiles = moestream::mxfp4_tiles;

namespace {

double e2m1(unsigned code) {
    static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

// An fp16 value from its bits (subnormals included), written out.
double fp16_value(uint16_t h) {
    const int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    MS_ASSERT(exp != 31);
    const double v = exp == 0 ? std::ldexp(double(man), -24) : std::ldexp(1024.0 + man, exp - 25);
    return sign ? -v : v;
}

// The elements of qs word q (byte k: element 4t+k low, 4t+16+k high) each fragment half holds,
// as offsets from 4t: d0 (0, 2), d1 (16, 18), d2 (1, 3), d3 (17, 19).
constexpr int kElement[4][2] = {{0, 2}, {16, 18}, {1, 3}, {17, 19}};

unsigned nibble_of_element(uint32_t q, int off) {
    const int k = off & 15;
    const unsigned byte = (q >> (8 * k)) & 0xFFu;
    return off >= 16 ? byte >> 4 : byte & 15u;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(mxfp4_tiles_layout)

// The rows kernel's fragments hold each element's e2m1 value times 2^-14 where its comment says.
BOOST_AUTO_TEST_CASE(fragments_of_a_word_are_the_elements_times_2_to_the_minus_14) {
    std::mt19937 rng(5);
    for (int i = 0; i < 20000; ++i) {
        const uint32_t q = i < 256 ? uint32_t(i) * 0x01010101u : uint32_t(rng());
        const auto f = tiles::fragments_of_word(q);
        for (int r = 0; r < 4; ++r) {
            BOOST_TEST((f.d[r] & ~tiles::kFragmentMask) == 0u);
            for (int h = 0; h < 2; ++h) {
                const uint16_t half = uint16_t(f.d[r] >> (16 * h));
                const double want = std::ldexp(e2m1(nibble_of_element(q, kElement[r][h])), -14);
                BOOST_TEST(fp16_value(half) == want);
            }
        }
    }
}

// The tiled word gives the same fragments with the tiled extraction, for every value of every
// byte (each fragment half depends on one nibble) and random words; and the tiling moves bits,
// never makes or drops one.
BOOST_AUTO_TEST_CASE(tiled_words_decode_to_the_same_fragments) {
    std::mt19937 rng(7);
    for (int i = 0; i < 4 * 256 + 100000; ++i) {
        const uint32_t q = i < 4 * 256 ? uint32_t(i % 256) << (8 * (i / 256)) : uint32_t(rng());
        const uint32_t w = tiles::tiled_word(q);
        const auto want = tiles::fragments_of_word(q), got = tiles::fragments_of_tiled(w);
        for (int r = 0; r < 4; ++r) BOOST_TEST(got.d[r] == want.d[r]);
        BOOST_TEST(std::popcount(w) == std::popcount(q));
    }
    // Each single bit of a word lands on a distinct bit of the tiled word (a permutation).
    uint32_t seen = 0;
    for (int b = 0; b < 32; ++b) {
        const uint32_t w = tiles::tiled_word(1u << b);
        BOOST_TEST(std::popcount(w) == 1);
        BOOST_TEST((seen & w) == 0u);
        seen |= w;
    }
    BOOST_TEST(seen == 0xFFFFFFFFu);
    BOOST_TEST(tiles::bit_reverse(0x00000001u) == 0x80000000u);
    BOOST_TEST(tiles::bit_reverse(0x12345678u) == 0x1E6A2C48u);
}

// A tiled matrix: strip s in the bytes of its 8 rows; unit u at u * 544 of the strip, lane
// (g, t)'s 16 bytes the tiled words of qs word t of blocks 4u..4u+3 of row g, row g's 4 scales at
// 512 + 4g; and which shapes can be tiled.
BOOST_AUTO_TEST_CASE(a_tiled_matrix_has_each_lanes_words_where_the_kernel_loads_them) {
    const int64_t rows = 16, cols = 256, row_bytes = cols / 32 * 17;
    std::vector<uint8_t> src(size_t(rows * row_bytes)), dst(src.size(), 0xEE);
    std::mt19937 rng(9);
    for (auto& b : src) b = uint8_t(rng());
    tiles::tile_matrix(src.data(), dst.data(), rows, cols);
    BOOST_TEST(tiles::strip_bytes(cols) == 8 * row_bytes);
    for (int64_t s = 0; s < rows / 8; ++s)
        for (int64_t u = 0; u < cols / 128; ++u) {
            const uint8_t* unit = dst.data() + s * tiles::strip_bytes(cols) + u * 544;
            for (int g = 0; g < 8; ++g) {
                const uint8_t* row = src.data() + (s * 8 + g) * row_bytes;
                for (int jj = 0; jj < 4; ++jj) {
                    const uint8_t* blk = row + (4 * u + jj) * 17;
                    BOOST_TEST(unit[512 + 4 * g + jj] == blk[0]);
                    for (int t = 0; t < 4; ++t) {
                        uint32_t q, w;
                        std::memcpy(&q, blk + 1 + 4 * t, 4);
                        std::memcpy(&w, unit + (4 * g + t) * 16 + 4 * jj, 4);
                        BOOST_TEST(w == tiles::tiled_word(q));
                    }
                }
            }
        }
    BOOST_TEST(tiles::tileable(8, 128, 68));
    BOOST_TEST(tiles::tileable(2304, 5120, 5120 / 32 * 17));
    BOOST_TEST(!tiles::tileable(12, 128, 68));             // rows not whole strips
    BOOST_TEST(!tiles::tileable(8, 64, 34));               // cols not whole units
    BOOST_TEST(!tiles::tileable(8, 128, 80));              // rows not contiguous
    BOOST_TEST(!tiles::tileable(8, tiles::kMaxCols + 128, (tiles::kMaxCols + 128) / 32 * 17));
}

BOOST_AUTO_TEST_SUITE_END()
