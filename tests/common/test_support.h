// Helpers shared by the Boost.Test suites.
#pragma once

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace moestream::test {

// ../shared (fixtures and docs), as configured at build time, or where the environment's
// MOESTREAM_SHARED_DIR says (a GPU machine, where the fixtures travel inside the checkout).
inline std::filesystem::path shared_dir() {
    if (const char* env = std::getenv("MOESTREAM_SHARED_DIR"); env && *env) return env;
    return MOESTREAM_SHARED_DIR;
}
inline std::filesystem::path fixtures_dir() { return shared_dir() / "fixtures"; }
inline std::filesystem::path source_dir() { return MOESTREAM_SOURCE_DIR; }
inline std::filesystem::path binary_dir() { return MOESTREAM_BINARY_DIR; }

// A fresh, empty scratch folder under the build tree for one test.
inline std::filesystem::path scratch_dir(const std::string& name) {
    auto p = binary_dir() / "test-scratch" / name;
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    return p;
}

// Precondition decorator: the test is reported as skipped, with the reason, when the path is
// missing (fixtures live outside the repository; CI has them, a bare clone may not).
struct path_exists {
    std::filesystem::path path;
    boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
        boost::test_tools::assertion_result r(std::filesystem::exists(path));
        if (!r) r.message() << "skipped: " << path.string() << " is absent";
        return r;
    }
};

inline auto requires_path(std::filesystem::path p) {
    return boost::unit_test::precondition(path_exists{std::move(p)});
}

// text split at the given ascending offsets (cuts.size() + 1 pieces, empty ones included): for
// feeding streaming parsers the same text in different chunkings.
inline std::vector<std::string_view> cut(std::string_view text, const std::vector<size_t>& cuts) {
    std::vector<std::string_view> pieces;
    size_t from = 0;
    for (size_t c : cuts) {
        pieces.push_back(text.substr(from, c - from));
        from = c;
    }
    pieces.push_back(text.substr(from));
    return pieces;
}

}  // namespace moestream::test
