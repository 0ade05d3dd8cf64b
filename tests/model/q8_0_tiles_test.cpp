// Tests for model/q8_0_tiles.h, the layout the CUDA backend's tensor-core Q8_0 matmul reads:
// where each lane's words and each row's scales land, written out independently of the header's
// formulas, on the host; the device's matmul over these bytes is checked against the CPU backend
// by tests/cuda.
#include "model/q8_0_tiles.h"

#include <cstring>
#include <random>
#include <vector>

#include "tests/common/test_support.h"

using namespace moestream;
namespace tiles = moestream::q8_0_tiles;

BOOST_AUTO_TEST_SUITE(q8_0_tiles_layout)

// Strip s in the bytes of its 8 rows; unit u at u * 1088 of the strip; lane (g, t)'s first 16
// bytes at (4g + t) * 16 hold words t and t + 4 of blocks 0 and 1 of row g, its second 16 at 512
// + (4g + t) * 16 those of blocks 2 and 3; row g's four fp16 scales at 1024 + 8g. The tiling
// moves bytes only (every source byte appears once).
BOOST_AUTO_TEST_CASE(a_tiled_matrix_has_each_lanes_words_where_the_kernel_loads_them) {
    const int64_t rows = 24, cols = 384, row_bytes = cols / 32 * 34;
    std::vector<uint8_t> src(size_t(rows * row_bytes)), dst(src.size(), 0xEE);
    std::mt19937 rng(11);
    for (auto& b : src) b = uint8_t(rng());
    tiles::tile_matrix(src.data(), dst.data(), rows, cols);
    BOOST_TEST(tiles::strip_bytes(cols) == 8 * row_bytes);
    std::vector<int> seen(src.size(), 0);
    for (int64_t s = 0; s < rows / 8; ++s)
        for (int64_t u = 0; u < cols / 128; ++u) {
            const int64_t unit_at = s * tiles::strip_bytes(cols) + u * 1088;
            const uint8_t* unit = dst.data() + unit_at;
            for (int g = 0; g < 8; ++g) {
                const int64_t row_at = (s * 8 + g) * row_bytes;
                for (int jj = 0; jj < 4; ++jj) {
                    const int64_t blk_at = row_at + (4 * u + jj) * 34;
                    BOOST_TEST(std::memcmp(unit + 1024 + 8 * g + 2 * jj, src.data() + blk_at, 2) == 0);
                    for (int t = 0; t < 4; ++t)
                        for (int h = 0; h < 2; ++h) {
                            // Lane (g, t): blocks 0, 1 in its first 16 bytes, 2, 3 in its second; a
                            // block's word t, then its word t + 4.
                            const int64_t at = (jj < 2 ? 0 : 512) + (4 * g + t) * 16 + (jj % 2) * 8 + h * 4;
                            const int64_t from = blk_at + 2 + 4 * (t + 4 * h);
                            BOOST_TEST(std::memcmp(unit + at, src.data() + from, 4) == 0);
                            for (int b = 0; b < 4; ++b) ++seen[size_t(from + b)];
                        }
                    ++seen[size_t(blk_at)], ++seen[size_t(blk_at + 1)];
                }
            }
        }
    for (int v : seen) BOOST_TEST_REQUIRE(v == 1);
    // Whole strips are a tiled matrix of their own: strip 1 alone tiles to the same bytes.
    std::vector<uint8_t> one(size_t(8 * row_bytes));
    tiles::tile_matrix(src.data() + 8 * row_bytes, one.data(), 8, cols);
    BOOST_TEST(std::memcmp(one.data(), dst.data() + 8 * row_bytes, one.size()) == 0);
}

BOOST_AUTO_TEST_CASE(which_shapes_tile_and_how_rows_are_sliced) {
    BOOST_TEST(tiles::tileable(8, 128, 136));
    BOOST_TEST(tiles::tileable(1280, 5120, 5120 / 32 * 34));
    BOOST_TEST(!tiles::tileable(12, 128, 136));  // rows not whole strips
    BOOST_TEST(!tiles::tileable(8, 64, 68));     // cols not whole units
    BOOST_TEST(!tiles::tileable(8, 128, 160));   // rows not contiguous
    BOOST_TEST(!tiles::tileable(8, tiles::kMaxCols + 128, (tiles::kMaxCols + 128) / 32 * 34));
    BOOST_TEST(tiles::slices(128) == 1);
    BOOST_TEST(tiles::slices(512) == 1);
    BOOST_TEST(tiles::slices(640) == 2);
    BOOST_TEST(tiles::slices(8192) == 16);
}

BOOST_AUTO_TEST_SUITE_END()
