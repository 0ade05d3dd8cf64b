// stop_matcher: the same text cut into any pieces gives the same output as a direct search, and
// nothing is withheld that could not still become a stop string.
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "server/stop_matcher.h"
#include "tests/common/test_support.h"

namespace moestream::server {
namespace {

struct outcome {
    std::string text;
    bool stopped = false;
    std::string matched;
    bool operator==(const outcome&) const = default;
};

std::ostream& operator<<(std::ostream& os, const outcome& o) {
    return os << "{'" << o.text << "', stopped " << o.stopped << ", '" << o.matched << "'}";
}

// The documented rule, spelled out directly: the first end position where some stop string is
// complete; among those ending there, the longest.
outcome reference(std::string_view text, const std::vector<std::string>& stops) {
    for (size_t end = 1; end <= text.size(); ++end) {
        const std::string* best = nullptr;
        for (const auto& s : stops) {
            if (s.empty() || s.size() > end || text.substr(end - s.size(), s.size()) != s) continue;
            if (!best || s.size() > best->size()) best = &s;
        }
        if (best) return {std::string(text.substr(0, end - best->size())), true, *best};
    }
    return {std::string(text), false, ""};
}

// The longest suffix of text that is a proper prefix of a stop string: what must be withheld.
size_t must_withhold(std::string_view text, const std::vector<std::string>& stops) {
    size_t best = 0;
    for (const auto& s : stops)
        for (size_t n = std::min(text.size(), s.empty() ? 0 : s.size() - 1); n > best; --n)
            if (text.substr(text.size() - n) == std::string_view(s).substr(0, n)) best = n;
    return best;
}

using test::cut;

// Feeds the pieces, checking after each push that exactly the ambiguous tail is withheld.
outcome run(const std::vector<std::string>& stops, const std::vector<std::string_view>& pieces) {
    stop_matcher m(stops);
    std::string out, seen;
    for (std::string_view p : pieces) {
        out += m.push(p);
        seen += p;
        if (!m.stopped()) {
            BOOST_TEST(seen.starts_with(out));
            BOOST_TEST(m.withheld_bytes() == must_withhold(seen, stops));
        }
    }
    out += m.finish();
    return {out, m.stopped(), m.matched()};
}

outcome run_whole(const std::vector<std::string>& stops, std::string_view text) { return run(stops, {text}); }

bool valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        const size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (len == 0 || i + len > s.size()) return false;
        for (size_t k = 1; k < len; ++k)
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(stop_matcher_suite)

BOOST_AUTO_TEST_CASE(split_across_two_and_three_pieces) {
    const std::vector<std::string> stops = {"STOP"};
    const std::string text = "hello STOP world";
    const outcome want{"hello ", true, "STOP"};
    BOOST_TEST(run_whole(stops, text) == want);
    for (size_t a = 0; a <= text.size(); ++a) {
        BOOST_TEST(run(stops, cut(text, {a})) == want);
        for (size_t b = a; b <= text.size(); ++b) BOOST_TEST(run(stops, cut(text, {a, b})) == want);
    }
    std::vector<size_t> every_byte;
    for (size_t i = 1; i < text.size(); ++i) every_byte.push_back(i);
    BOOST_TEST(run(stops, cut(text, every_byte)) == want);
}

BOOST_AUTO_TEST_CASE(overlapping_prefixes) {
    // "ab" is complete one byte before "abc" would be: generation stops there.
    BOOST_TEST(run_whole({"ab", "abc"}, "xxabcz") == (outcome{"xx", true, "ab"}));
    BOOST_TEST(run_whole({"abc", "ab"}, "xxabcz") == (outcome{"xx", true, "ab"}));
    // A failed partial match must not hide a match that starts inside it.
    BOOST_TEST(run_whole({"aab"}, "aaab") == (outcome{"a", true, "aab"}));
    BOOST_TEST(run(std::vector<std::string>{"aab"}, {"a", "a", "a", "b"}) == (outcome{"a", true, "aab"}));
    BOOST_TEST(run_whole({"abab"}, "abaabab!") == (outcome{"aba", true, "abab"}));
}

BOOST_AUTO_TEST_CASE(several_stops_first_complete_wins) {
    // "bc" completes before "abcd" could, although "abcd" starts earlier.
    BOOST_TEST(run_whole({"abcd", "bc"}, "xabcdy") == (outcome{"xa", true, "bc"}));
    // Ending at the same byte: the longest, i.e. the earliest start.
    BOOST_TEST(run_whole({"bc", "abc"}, "xabcz") == (outcome{"x", true, "abc"}));
    BOOST_TEST(run_whole({"\n\n", "User:", "###"}, "one\ntwo ### User:") == (outcome{"one\ntwo ", true, "###"}));
}

BOOST_AUTO_TEST_CASE(stop_at_the_very_start_and_after_the_stop) {
    stop_matcher m({"<end>"});
    BOOST_TEST(m.push("<en") == "");
    BOOST_TEST(m.push("d>more") == "");
    BOOST_TEST(m.stopped());
    BOOST_TEST(m.matched() == "<end>");
    BOOST_TEST(m.push("and more") == "");
    BOOST_TEST(m.finish() == "");
}

BOOST_AUTO_TEST_CASE(no_withholding_when_the_text_cannot_match) {
    stop_matcher m({"STOP", "END"});
    BOOST_TEST(m.push("hello") == "hello");
    BOOST_TEST(m.push(" S") == " ");  // "S" may begin "STOP"
    BOOST_TEST(m.push("T") == "");
    BOOST_TEST(m.push("x") == "STx");
    BOOST_TEST(m.push("E") == "");
    BOOST_TEST(m.push("ND") == "");
    BOOST_TEST(m.stopped());
    BOOST_TEST(m.matched() == "END");
}

BOOST_AUTO_TEST_CASE(empty_stop_strings_are_ignored) {
    BOOST_TEST(run_whole({}, "abc") == (outcome{"abc", false, ""}));
    BOOST_TEST(run_whole({"", ""}, "abc") == (outcome{"abc", false, ""}));
    BOOST_TEST(run_whole({"", "b"}, "abc") == (outcome{"a", true, "b"}));
}

BOOST_AUTO_TEST_CASE(finish_releases_the_withheld_tail) {
    stop_matcher m({"STOP"});
    BOOST_TEST(m.push("abc ST") == "abc ");
    BOOST_TEST(m.withheld_bytes() == 2u);
    BOOST_TEST(m.finish() == "ST");
    BOOST_TEST(!m.stopped());
}

BOOST_AUTO_TEST_CASE(multi_byte_characters) {
    const std::vector<std::string> stops = {"。終", "ü!"};
    const std::string text = "日本。語。ü?über。終わり";
    const outcome want{"日本。語。ü?über", true, "。終"};
    // Cut at every character boundary: each emitted piece is valid UTF-8.
    std::vector<size_t> chars;
    for (size_t i = 1; i < text.size(); ++i)
        if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) chars.push_back(i);
    stop_matcher m(stops);
    std::string out;
    for (std::string_view p : cut(text, chars)) {
        const std::string piece = m.push(p);
        BOOST_TEST(valid_utf8(piece));
        out += piece;
    }
    BOOST_TEST((outcome{out, m.stopped(), m.matched()}) == want);
    BOOST_TEST(run(stops, cut(text, chars)) == want);
}

BOOST_AUTO_TEST_CASE(withholding_never_splits_a_character) {
    // A stop string that is not valid UTF-8 (starts with the continuation byte of "é") makes the
    // ambiguous tail start inside a character: the whole character is withheld instead.
    stop_matcher m({"\xA9!"});
    BOOST_TEST(m.push("café") == "caf");
    BOOST_TEST(m.withheld_bytes() == 2u);
    BOOST_TEST(m.push("s") == "és");
}

BOOST_AUTO_TEST_CASE(random_texts_and_cuts_match_the_direct_search) {
    std::mt19937 rng(1234);
    auto random_string = [&](size_t max_len) {
        std::string s(static_cast<size_t>(rng() % max_len + 1), 'a');
        for (char& c : s) c = static_cast<char>('a' + rng() % 3);
        return s;
    };
    for (int round = 0; round < 3000; ++round) {
        std::vector<std::string> stops;
        for (size_t i = 0, n = rng() % 4; i < n; ++i) stops.push_back(random_string(5));
        const std::string text = random_string(40);
        std::vector<size_t> cuts;
        for (size_t i = 1; i < text.size(); ++i)
            if (rng() % 3 == 0) cuts.push_back(i);
        BOOST_TEST_CONTEXT("text " << text << " cuts " << cuts.size() << " stops " << stops.size()) {
            BOOST_TEST(run(stops, cut(text, cuts)) == reference(text, stops));
        }
    }
}

BOOST_AUTO_TEST_CASE(many_long_stop_strings_stay_linear) {
    // 16 stops of 1 KiB that all share a 1023-byte prefix with the text: a search that rescans
    // the withheld tail for every stop on every push would take minutes here.
    std::vector<std::string> stops;
    for (int i = 0; i < 16; ++i) stops.push_back(std::string(1023, 'a') + static_cast<char>('A' + i));
    const std::string text(1 << 20, 'a');
    const auto t0 = std::chrono::steady_clock::now();
    stop_matcher m(stops);
    size_t emitted = 0;
    for (size_t i = 0; i < text.size(); i += 97) emitted += m.push(std::string_view(text).substr(i, 97)).size();
    BOOST_TEST(m.withheld_bytes() == 1023u);
    emitted += m.finish().size();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BOOST_TEST(emitted == text.size());
    BOOST_TEST(!m.stopped());
    BOOST_TEST(seconds < 5.0);
    stop_matcher hit(stops);
    BOOST_TEST(hit.push(text.substr(0, 5000) + "P") == text.substr(0, 5000 - 1023));
    BOOST_TEST(hit.matched() == stops[15]);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::server
