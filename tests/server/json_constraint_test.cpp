// The byte-level JSON automaton of constrained decoding: valid documents are accepted whatever
// the split, invalid ones are refused at the first byte that makes them invalid, the minimum
// completion length is exact, and forced endings always end.
#include <boost/test/unit_test.hpp>
#include <random>
#include <simdjson.h>
#include <string>
#include <vector>

#include "server/json_constraint.h"

namespace moestream::test {
namespace {

using server::json_automaton;
using server::json_limits;

json_limits any_value() {
    json_limits l;
    l.object_only = false;
    return l;
}

json_limits with_banned_bar() {
    json_limits l;
    l.banned_char = U'\uFF5C';
    return l;
}

// The index of the first byte refused when feeding one byte at a time; -1 when all are accepted.
long first_refused(std::string_view doc, json_limits limits = {}) {
    json_automaton a(limits);
    for (size_t i = 0; i < doc.size(); ++i)
        if (!a.feed(doc.substr(i, 1))) return long(i);
    return -1;
}

bool parses(const std::string& doc) {
    simdjson::dom::parser p;
    simdjson::dom::element e;
    return p.parse(simdjson::padded_string(doc)).get(e) == simdjson::SUCCESS;
}

const std::vector<std::string> k_valid_objects = {
    "{}",
    "{\"a\":1}",
    "{\"\":0}",
    "{ \"a\" : [ 1 , 2.5 , -0 , 0.25e-3 , 1E+10 , -12e3 ] , \"b\" : { } }",
    "{\"nested\":{\"x\":[[],[{}],[true,false,null]],\"y\":\"z\"}}",
    "{\"s\":\"quote \\\" backslash \\\\ slash \\/ \\b\\f\\n\\r\\t done\"}",
    "{\"u\":\"\\u00e9\\u4E2D\\ud83d\\ude00\\uFFFF\"}",
    "{\"utf8\":\"\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80 \xEF\xBF\xBF \xF4\x8F\xBF\xBF \x7F\"}",
    "{\"w\":\n\t\r [1,\r\n2]}",
    "{\"n\":[0,-0.0,10,123456789,1.5e99,2E-2,999999999999999,-0.123456789012345e-99]}",
};

}  // namespace

BOOST_AUTO_TEST_SUITE(json_constraint)

BOOST_AUTO_TEST_CASE(valid_documents_in_any_split) {
    std::mt19937 rng(7);
    for (const auto& doc : k_valid_objects) {
        BOOST_TEST_REQUIRE(parses(doc), doc);
        BOOST_TEST(first_refused(doc) == -1, doc);
        // Complete exactly at the closing brace, not before.
        json_automaton a;
        for (size_t i = 0; i < doc.size(); ++i) {
            BOOST_TEST(!a.complete(), doc << " at " << i);
            BOOST_TEST_REQUIRE(a.feed(doc.substr(i, 1)));
        }
        BOOST_TEST(a.complete(), doc);
        BOOST_TEST(a.min_bytes_to_complete() == 0u);
        BOOST_TEST(!a.feed(" "), "nothing after the document");
        for (int trial = 0; trial < 20; ++trial) {
            json_automaton b;
            for (size_t i = 0; i < doc.size();) {
                const size_t n = std::min(doc.size() - i, size_t(rng() % 7));
                BOOST_TEST_REQUIRE(b.feed(doc.substr(i, n)), doc << " split at " << i);
                i += n;
            }
            BOOST_TEST(b.complete());
        }
    }
    // Any top-level value when objects are not required.
    for (std::string doc : {"[1,2]", "\"s\"", "true", "null", "-1.5e3", "0"}) {
        BOOST_TEST(first_refused(doc, any_value()) == -1, doc);
        json_automaton a(any_value());
        BOOST_TEST_REQUIRE(a.feed(doc));
        BOOST_TEST(a.complete(), doc);
    }
    // A top-level number may always take more digits.
    json_automaton n(any_value());
    BOOST_TEST_REQUIRE(n.feed("12"));
    BOOST_TEST(n.complete());
    BOOST_TEST(n.feed("3"));
    BOOST_TEST(!n.feed(" "));
}

BOOST_AUTO_TEST_CASE(invalid_prefixes_refused_at_the_right_byte) {
    struct bad_case {
        std::string doc;
        long at;
        json_limits limits;
    };
    json_limits depth3;
    depth3.max_depth = 3;
    const std::vector<bad_case> cases = {
        // numbers
        {"{\"a\":01}", 6, {}},
        {"{\"a\":-}", 6, {}},
        {"{\"a\":-a}", 6, {}},
        {"{\"a\":1.}", 7, {}},
        {"{\"a\":1.e5}", 7, {}},
        {"{\"a\":1e}", 7, {}},
        {"{\"a\":1e+}", 8, {}},
        {"{\"a\":+1}", 5, {}},
        {"{\"a\":.5}", 5, {}},
        {"{\"a\":-01}", 7, {}},
        {"{\"a\":1 2}", 7, {}},
        {"{\"a\":1234567890123456}", 20, {}},  // 16 integer digits
        {"{\"a\":0.1234567890123456}", 22, {}},
        {"{\"a\":1e123}", 9, {}},
        {"{\"a\":-1E+999}", 11, {}},
        // literals
        {"{\"a\":tru}", 8, {}},
        {"{\"a\":nulL}", 8, {}},
        {"{\"a\":True}", 5, {}},
        // escapes
        {"{\"a\":\"\\x\"}", 7, {}},
        {"{\"a\":\"\\u12G4\"}", 10, {}},
        {"{\"a\":\"\\U0041\"}", 7, {}},
        {"{\"a\":\"\\udc00\"}", 9, {}},          // a lone low surrogate, certain at its 2nd digit
        {"{\"a\":\"\\uD800x\"}", 12, {}},        // a high surrogate without its low half
        {"{\"a\":\"\\uD800\\u0041\"}", 14, {}},  // ... followed by something else
        {"{\"a\":\"\\uD800\\uDB00\"}", 15, {}},  // ... or by another high one
        // UTF-8
        {"{\"a\":\"\xC0\x80\"}", 6, {}},          // overlong lead
        {"{\"a\":\"\xE0\x80\x80\"}", 7, {}},      // overlong 3-byte
        {"{\"a\":\"\xED\xA0\x80\"}", 7, {}},      // a surrogate
        {"{\"a\":\"\xF4\x90\x80\x80\"}", 7, {}},  // above U+10FFFF
        {"{\"a\":\"\xF5\x80\"}", 6, {}},
        {"{\"a\":\"\x80\"}", 6, {}},              // lone continuation
        {"{\"a\":\"\xE4\xB8\"}", 8, {}},          // truncated
        {"{\"a\":\"\xFF\"}", 6, {}},
        {"{\"a\":\"line\nbreak\"}", 10, {}},      // raw control character
        {"{\"a\":\"\x01\"}", 6, {}},
        {"{\"\xEF\xBD\x9C\":1}", 4, with_banned_bar()},  // the banned U+FF5C, at its last byte
        // structure
        {"{\"a\":1,}", 7, {}},
        {"{\"a\":[1,]}", 8, {}},
        {"{\"a\":[,1]}", 6, {}},
        {"{,}", 1, {}},
        {"{\"a\":1]", 6, {}},
        {"{\"a\":[1}", 7, {}},
        {"{]", 1, {}},
        {"{\"a\" 1}", 5, {}},
        {"{\"a\"::1}", 5, {}},
        {"{a:1}", 1, {}},
        {"{1:1}", 1, {}},
        {"{\"a\":1 \"b\":2}", 7, {}},
        {"{}}", 2, {}},
        {"{} ", 2, {}},
        {" {}", 0, {}},
        {"[1]", 0, {}},      // objects only
        {"\"s\"", 0, {}},
        {"{'a':1}", 1, {}},
        // bounds
        {"{\"a\":{\"b\":{\"c\":{}}}}", 15, depth3},
        {"{\"a\":[[[]]]}", 7, depth3},
        {"{     \"a\":1}", 5, {}},
        {"{\"a\":1     }", 10, {}},
        {"{\"a\"    \n:1}", 8, {}},
    };
    for (const auto& c : cases) {
        BOOST_TEST(first_refused(c.doc, c.limits) == c.at, "document " << c.doc);
        // feed() of the whole text fails and leaves the state unchanged.
        json_automaton a(c.limits);
        const std::string before = c.doc.substr(0, size_t(c.at));
        BOOST_TEST_REQUIRE(a.feed(before));
        const json_automaton kept = a;
        BOOST_TEST(!a.feed(c.doc.substr(size_t(c.at))));
        BOOST_TEST((a == kept));
    }
    // The escaped form of the banned character is fine, and within the limits all is accepted.
    BOOST_TEST(first_refused("{\"\\uff5c\":\"\xEF\xBD\x9B\"}", with_banned_bar()) == -1);
    BOOST_TEST(first_refused("{\"\xEF\xBD\x9C\":1}") == -1);
    BOOST_TEST(first_refused("{\"a\":{\"b\":[1,2]}}", depth3) == -1);
    BOOST_TEST(first_refused("{    \"a\"    :    1    }") == -1);
}

BOOST_AUTO_TEST_CASE(min_bytes_to_complete_on_a_table_of_states) {
    const std::vector<std::pair<std::string, size_t>> table = {
        {"", 2},                     // {}
        {"{", 1},                    // }
        {"{\"", 4},                  // ":0}
        {"{\"ab", 4},
        {"{\"a\"", 3},               // :0}
        {"{\"a\" ", 3},
        {"{\"a\":", 2},              // 0}
        {"{\"a\":1", 1},
        {"{\"a\":-", 2},
        {"{\"a\":1.", 2},
        {"{\"a\":1e", 2},
        {"{\"a\":1e-", 2},
        {"{\"a\":1e-5", 1},
        {"{\"a\":t", 4},             // rue}
        {"{\"a\":fal", 3},
        {"{\"a\":[", 2},             // ]}
        {"{\"a\":[1,", 3},           // 0]}
        {"{\"a\":1,", 5},            // "":0}
        {"{\"a\":\"", 2},            // "}
        {"{\"a\":\"\\", 3},          // ""}
        {"{\"a\":\"\\u", 6},         // 0000"}
        {"{\"a\":\"\\u12", 4},
        {"{\"a\":\"\\uD", 5},        // D000 is no surrogate
        {"{\"a\":\"\\uD8", 10},      // a high surrogate is certain: 00\uDC00"}
        {"{\"a\":\"\\uDBFF", 8},     // \uDC00"}
        {"{\"a\":\"\\uD800\\", 7},
        {"{\"a\":\"\\uD800\\u", 6},
        {"{\"a\":\"\\uD800\\uDC", 4},
        {"{\"a\":\"\xE4", 4},        // two continuation bytes, ", }
        {"{\"a\":\"\xF0\x9F", 4},
        {"{\"\xC3", 5},              // key: continuation, ", :0}
        {"{\"a\":{\"b\":[1,", 4},    // 0]}}
        {"{\"a\":{\"b\":[{}", 3},
        {"{\"a\":{}}", 0},
    };
    for (const auto& [prefix, min] : table) {
        json_automaton a;
        BOOST_TEST_REQUIRE(a.feed(prefix), prefix);
        BOOST_TEST(a.min_bytes_to_complete() == min, "after " << prefix);
    }
    // Over an alphabet holding every structurally distinct byte, exhaustively up to 3 bytes: no
    // completion is shorter than the minimum. And one of exactly that length exists.
    const std::string alphabet = std::string("{}[]\":,\\ 0-1.eE+tfalsenru5DdCc\x7F") + "\xC3\xA9\xE4\xB8\xF0\x9F\x80";
    for (const auto& [prefix, min] : table) {
        json_automaton a;
        BOOST_TEST_REQUIRE(a.feed(prefix));
        bool shorter = false;
        std::vector<std::pair<json_automaton, size_t>> frontier{{a, 0}};
        while (!frontier.empty() && !shorter) {
            auto [s, d] = frontier.back();
            frontier.pop_back();
            if (s.complete()) {
                shorter = d < min;
                continue;
            }
            if (d + 1 >= min || d >= 3) continue;
            for (char c : alphabet) {
                json_automaton n = s;
                if (n.step(uint8_t(c))) frontier.push_back({n, d + 1});
            }
        }
        BOOST_TEST(!shorter, "a completion shorter than " << min << " after " << prefix);
        size_t steps = 0;
        while (!a.complete() && steps <= min) {
            const size_t m = a.min_bytes_to_complete();
            for (int b = 0; b < 256; ++b) {
                json_automaton n = a;
                if (n.step(uint8_t(b)) && n.min_bytes_to_complete() + 1 == m) {
                    a = n;
                    break;
                }
            }
            ++steps;
        }
        BOOST_TEST((a.complete() && steps == min), "the closing path after " << prefix);
    }
}

// From many random states (random bytes among the accepted ones), the closing path (a byte that
// lowers the minimum) always exists, lowers it by exactly one, and random choices among closing
// bytes complete the document within the minimum; every finished document is valid JSON.
BOOST_AUTO_TEST_CASE(closing_always_terminates) {
    std::mt19937 rng(2024);
    // Bytes a generator would try: JSON syntax, letters, digits, whitespace, UTF-8 pieces, and
    // now and then any byte at all.
    const std::string common("{}[]\":,\\ \n\t0123456789-.eE+truefalsnlbu/ABCDEFabcdef\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\xEF\xBD\x9C");
    int finished = 0;
    for (int trial = 0; trial < 600; ++trial) {
        json_limits limits = with_banned_bar();
        limits.max_depth = uint8_t(1 + rng() % 8);
        json_automaton a(limits);
        std::string doc;
        const int free_steps = int(rng() % 120);
        for (int s = 0; s < free_steps && !a.complete(); ++s) {
            for (int tries = 0; tries < 64; ++tries) {
                const uint8_t b = rng() % 8 == 0 ? uint8_t(rng()) : uint8_t(common[rng() % common.size()]);
                json_automaton n = a;
                if (!n.step(b)) continue;
                // Stay open in the free phase: closing is what is under test.
                if (n.complete()) continue;
                a = n;
                doc.push_back(char(b));
                break;
            }
        }
        const size_t start = a.min_bytes_to_complete();
        size_t steps = 0;
        while (!a.complete()) {
            const size_t m = a.min_bytes_to_complete();
            std::vector<uint8_t> closing;
            for (int b = 0; b < 256; ++b) {
                json_automaton n = a;
                if (!n.step(uint8_t(b))) continue;
                const size_t after = n.min_bytes_to_complete();
                BOOST_TEST_REQUIRE(after + 1 >= m, "a byte lowered the minimum by more than one after " << doc);
                if (after < m) closing.push_back(uint8_t(b));
            }
            BOOST_TEST_REQUIRE(!closing.empty(), "no closing byte after " << doc);
            const uint8_t b = closing[rng() % closing.size()];
            BOOST_TEST_REQUIRE(a.step(b));
            doc.push_back(char(b));
            BOOST_TEST_REQUIRE(++steps <= start);
        }
        BOOST_TEST(steps == start);
        BOOST_TEST_REQUIRE(parses(doc), doc);
        ++finished;
    }
    BOOST_TEST(finished == 600);
}

// Random valid generation agrees with simdjson: every document the automaton completes parses.
BOOST_AUTO_TEST_CASE(random_documents_parse) {
    std::mt19937 rng(99);
    const std::string alphabet("{}[]\":,\\ 0123456789-.eE+truefalsnl u\xC3\xA9\xF0\x9F\x98\x80");
    int complete = 0;
    for (int trial = 0; trial < 400; ++trial) {
        json_automaton a;
        std::string doc;
        for (int s = 0; s < 400 && !a.complete(); ++s) {
            const uint8_t b = uint8_t(alphabet[rng() % alphabet.size()]);
            json_automaton n = a;
            if (!n.step(b)) continue;
            a = n;
            doc.push_back(char(b));
        }
        if (!a.complete()) continue;
        ++complete;
        BOOST_TEST(parses(doc), doc);
    }
    BOOST_TEST(complete > 20);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
