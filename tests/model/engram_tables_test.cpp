// Engram side tables against the spec's check values and the reference's golden data.
#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "model/engram_tables.h"
#include "model/tokenizer.h"
#include "model/numpy_pcg64.h"
#include "tests/common/test_support.h"

namespace fs = std::filesystem;
namespace engram = moestream::engram;
using moestream::test::fixtures_dir;
using moestream::test::requires_path;
using moestream::test::source_dir;

namespace {

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    BOOST_REQUIRE_MESSAGE(in, "cannot open " << p);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::vector<int64_t> int_array(simdjson::dom::array a) {
    std::vector<int64_t> out;
    for (auto v : a) out.push_back(v.get_int64().value());
    return out;
}

// Minimal safetensors reader: u64 header length, JSON header, raw little-endian data. Only the
// I64 tensors the engram tables use.
struct safetensors_i64 {
    std::map<std::string, std::vector<int64_t>> tensors;

    explicit safetensors_i64(const fs::path& p) {
        const std::string bytes = read_file(p);
        BOOST_REQUIRE(bytes.size() >= 8);
        uint64_t header_len = 0;
        std::memcpy(&header_len, bytes.data(), 8);
        BOOST_REQUIRE(8 + header_len <= bytes.size());
        const char* data = bytes.data() + 8 + header_len;
        simdjson::dom::parser parser;
        simdjson::dom::object header = parser.parse(bytes.data() + 8, header_len).get_object().value();
        for (auto [name, info] : header) {
            if (name == "__metadata__") continue;
            BOOST_REQUIRE(info["dtype"].get_string().value() == "I64");
            const auto range = int_array(info["data_offsets"].get_array().value());
            BOOST_REQUIRE(range.size() == 2 && (range[1] - range[0]) % 8 == 0);
            std::vector<int64_t> values(static_cast<size_t>(range[1] - range[0]) / 8);
            std::memcpy(values.data(), data + range[0], values.size() * 8);
            tensors.emplace(std::string(name), std::move(values));
        }
    }
    const std::vector<int64_t>& at(const std::string& name) const {
        auto it = tensors.find(name);
        BOOST_REQUIRE_MESSAGE(it != tensors.end(), "no tensor " << name);
        return it->second;
    }
};

std::vector<int64_t> flat_primes(const std::vector<engram::layer_tables>& layers) {
    std::vector<int64_t> out;
    for (const auto& l : layers) out.insert(out.end(), l.primes.begin(), l.primes.end());
    return out;
}

fs::path real_tokenizer_json() {
    return source_dir() / ".deps/tokenizer-deepseek_v3/models/tokenizer.json";
}

}  // namespace

BOOST_AUTO_TEST_SUITE(engram_tables)

BOOST_AUTO_TEST_CASE(tiny_primes_offsets_rows) {
    const auto t = engram::compute_primes({1, 4}, 4, 2, 97);
    BOOST_REQUIRE_EQUAL(t.size(), 2u);
    const std::vector<int64_t> p1{97, 101, 103, 107, 109, 113}, o1{0, 97, 198, 301, 408, 517};
    const std::vector<int64_t> p4{127, 131, 137, 139, 149, 151}, o4{0, 127, 258, 395, 534, 683};
    BOOST_TEST(t[0].layer_id == 1);
    BOOST_TEST(t[0].primes == p1, boost::test_tools::per_element());
    BOOST_TEST(t[0].offsets == o1, boost::test_tools::per_element());
    BOOST_TEST(t[0].rows == 630);
    BOOST_TEST(t[1].layer_id == 4);
    BOOST_TEST(t[1].primes == p4, boost::test_tools::per_element());
    BOOST_TEST(t[1].offsets == o4, boost::test_tools::per_element());
    BOOST_TEST(t[1].rows == 834);
}

BOOST_AUTO_TEST_CASE(mini_primes) {
    const auto t = engram::compute_primes({1, 14}, 4, 8, 65536);
    BOOST_REQUIRE_EQUAL(t.size(), 2u);
    const std::vector<int64_t> two_gram{65537, 65539, 65543, 65551, 65557, 65563, 65579, 65581};
    BOOST_TEST(std::vector<int64_t>(t[0].primes.begin(), t[0].primes.begin() + 8) == two_gram,
               boost::test_tools::per_element());
    BOOST_TEST(t[0].primes[8] == 65587);
    BOOST_TEST(t[0].primes[15] == 65651);
    BOOST_TEST(t[0].primes[16] == 65657);
    BOOST_TEST(t[0].primes[23] == 65717);
    BOOST_TEST(t[1].primes.front() == 65719);
    BOOST_TEST(t[1].primes.back() == 65983);
    BOOST_TEST(t[0].rows == 1574980);
    BOOST_TEST(t[1].rows == 1580602);
    for (const auto& l : t) {
        BOOST_TEST(l.offsets.front() == 0);
        BOOST_TEST(l.offsets.back() + l.primes.back() == l.rows);
    }
}

BOOST_AUTO_TEST_CASE(real_primes) {
    const auto t = engram::compute_primes({1, 14}, 4, 8, 16000000);
    BOOST_REQUIRE_EQUAL(t.size(), 2u);
    BOOST_REQUIRE_EQUAL(t[0].primes.size(), 24u);
    BOOST_TEST(t[0].primes[0] == 16000057);
    BOOST_TEST(t[0].primes[1] == 16000079);
    BOOST_TEST(t[0].primes[2] == 16000081);
    BOOST_TEST(t[1].primes[0] == 16000477);
    BOOST_TEST(t[1].primes[1] == 16000487);
    BOOST_TEST(t[1].primes[2] == 16000499);
    BOOST_TEST(t[0].rows == 384006168);
    BOOST_TEST(t[1].rows == 384016682);
    // Globally distinct and, within one order, increasing.
    auto all = flat_primes(t);
    std::sort(all.begin(), all.end());
    BOOST_TEST((std::adjacent_find(all.begin(), all.end()) == all.end()));
}

BOOST_AUTO_TEST_CASE(pcg64_first_draws_follow_numpy) {
    // Two successive next_uint32 calls are the low then high half of one 64-bit output.
    engram::numpy_pcg64 a(42), b(42);
    const uint64_t full = a.next_uint64();
    const uint32_t lo = b.next_uint32(), hi = b.next_uint32();
    BOOST_TEST(lo == static_cast<uint32_t>(full));
    BOOST_TEST(hi == static_cast<uint32_t>(full >> 32));
    BOOST_TEST(a.next_uint64() == b.next_uint64());
}

BOOST_AUTO_TEST_CASE(numpy_known_outputs) {
    // Values numpy prints: default_rng(42).random() == 0.7739560485559633 (53 high bits of the
    // first u64), default_rng(42).integers(0, 10, size=5) == [0, 7, 6, 4, 4] and
    // default_rng(0).integers(0, 10, size=5) == [8, 6, 5, 2, 3]. The integers exercise the
    // 32-bit Lemire path (halves of a 64-bit draw), which multipliers.json never reaches.
    engram::numpy_pcg64 g(42);
    BOOST_TEST(static_cast<double>(g.next_uint64() >> 11) * 0x1.0p-53 == 0.7739560485559633);
    BOOST_TEST(engram::numpy_default_rng_integers(42, 0, 10, 5) == (std::vector<int64_t>{0, 7, 6, 4, 4}),
               boost::test_tools::per_element());
    BOOST_TEST(engram::numpy_default_rng_integers(0, 0, 10, 5) == (std::vector<int64_t>{8, 6, 5, 2, 3}),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(integers_stay_in_range) {
    for (int64_t high : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{1} << 31, (int64_t{1} << 32) + 5,
                         int64_t{1} << 40}) {
        for (int64_t v : engram::numpy_default_rng_integers(12345, -3, high, 64)) {
            BOOST_TEST(v >= -3);
            BOOST_TEST(v < high);
        }
    }
}

BOOST_AUTO_TEST_CASE(multipliers_match_numpy_golden,
                     *requires_path(fixtures_dir() / "engram/multipliers.json")) {
    simdjson::dom::parser parser;
    const auto doc = parser.load((fixtures_dir() / "engram/multipliers.json").string());
    int n_cases = 0;
    const simdjson::dom::array cases = doc["cases"].get_array().value();
    for (auto c : cases) {
        const auto layer_ids = int_array(c["layer_ids"].get_array().value());
        const int max_ngram = static_cast<int>(c["max_ngram_size"].get_int64().value());
        const int64_t vocab = c["compressed_vocab_size"].get_int64().value();
        const auto expected = c["multipliers"].get_array().value();
        BOOST_REQUIRE_EQUAL(expected.size(), layer_ids.size());
        size_t i = 0;
        for (auto row : expected) {
            const auto want = int_array(row.get_array().value());
            const auto got = engram::hash_multipliers(static_cast<int>(layer_ids[i]), max_ngram, vocab);
            BOOST_TEST_INFO("layer " << layer_ids[i] << ", vocab " << vocab << ", max_ngram " << max_ngram);
            BOOST_TEST(got == want, boost::test_tools::per_element());
            for (int64_t m : got) {
                BOOST_TEST(m % 2 == 1);
                BOOST_TEST(m < INT64_MAX / vocab);
            }
            ++i;
        }
        ++n_cases;
    }
    BOOST_TEST(n_cases >= 4);
}

BOOST_AUTO_TEST_CASE(tiny_fixture_tables_match,
                     *requires_path(fixtures_dir() / "dsv41-tiny-bf16/engram_tables.safetensors")) {
    const safetensors_i64 st(fixtures_dir() / "dsv41-tiny-bf16/engram_tables.safetensors");
    const auto& layer_ids = st.at("layer_ids");
    std::vector<int> ids(layer_ids.begin(), layer_ids.end());
    const auto t = engram::compute_primes(ids, 4, 2, 97);
    std::vector<int64_t> offsets, multipliers;
    for (const auto& l : t) {
        offsets.insert(offsets.end(), l.offsets.begin(), l.offsets.end());
        const auto m = engram::hash_multipliers(l.layer_id, 4, 384);
        multipliers.insert(multipliers.end(), m.begin(), m.end());
    }
    BOOST_TEST(flat_primes(t) == st.at("primes"), boost::test_tools::per_element());
    BOOST_TEST(offsets == st.at("offsets"), boost::test_tools::per_element());
    BOOST_TEST(multipliers == st.at("multipliers"), boost::test_tools::per_element());
    // The synthetic map the fixture stores: identity below 256, pairs above.
    const auto& token_map = st.at("token_map");
    BOOST_REQUIRE_EQUAL(token_map.size(), 512u);
    for (int64_t i = 0; i < 512; ++i)
        BOOST_TEST(token_map[static_cast<size_t>(i)] == (i < 256 ? i : 256 + (i - 256) / 2));
    BOOST_TEST(st.at("pad_id").at(0) == 2);
}

BOOST_AUTO_TEST_CASE(byte_level_decoding) {
    BOOST_TEST(engram::decode_byte_level("Hello") == "Hello");
    BOOST_TEST(engram::decode_byte_level("\xC4\xA0world") == " world");  // Ġ is the space byte
    BOOST_TEST(engram::decode_byte_level("\xC4\x8A") == "\n");           // Ċ is 0x0a
    BOOST_TEST(engram::decode_byte_level("\xC3\xA9") == "\xEF\xBF\xBD");  // é alone is byte 0xe9: partial
    BOOST_TEST(engram::decode_byte_level("\xC3\xA6\xC2\xB5\xC4\xAD") == "\xE6\xB5\x8B");  // 测 split to bytes
    // A character outside the byte table: the token's own UTF-8 is kept (added tokens).
    BOOST_TEST(engram::decode_byte_level("<\xEF\xBD\x9CUser\xEF\xBD\x9C>") == "<\xEF\xBD\x9CUser\xEF\xBD\x9C>");
    BOOST_TEST(engram::utf8_lossy("a\xE6\xB5") == "a\xEF\xBF\xBD");
    BOOST_TEST(engram::utf8_lossy("\xF0\x80\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

BOOST_AUTO_TEST_CASE(normalized_keys) {
    const auto key = [](const std::string& s) { return engram::normalize_token_key(s).value(); };
    BOOST_TEST(key(" Hello") == "hello");
    BOOST_TEST(key("Caf\xC3\xA9") == "cafe");
    BOOST_TEST(key(" ") == " ");
    BOOST_TEST(key("  ") == " ");  // collapsed first, then kept as the lone space
    BOOST_TEST(key("\xE2\x80\xA8") == "");  // U+2028: White_Space, stripped
    BOOST_TEST(key(" \t\n a  B ") == "a b");
    BOOST_TEST(key("\xEF\xBC\xA1") == "a");  // fullwidth A: NFKC
    BOOST_TEST(key("\xEF\xAC\x81") == "fi");  // ligature
    // Empty keys fall back to the text, U+FFFD to the raw string.
    const auto tm = engram::build_compressed_token_map({"a", " A", "\n\n", "\xEF\xBF\xBD", "b"},
                                                       {"a", "GA", "CC", "raw", "b"});
    BOOST_REQUIRE(tm.ok());
    BOOST_TEST(tm->map == (std::vector<int32_t>{0, 0, 1, 2, 3}), boost::test_tools::per_element());
    BOOST_TEST(tm->compressed_vocab == 4);
    BOOST_TEST(!engram::build_compressed_token_map({"a"}, {}).ok());
}

// The whole map of the real DeepSeek tokenizer, entry by entry, against the reference's output.
BOOST_AUTO_TEST_CASE(real_token_map_matches_reference,
                     *requires_path(real_tokenizer_json()) *
                         requires_path(fixtures_dir() / "engram/token_map.json")) {
    simdjson::dom::parser tok_parser;
    const auto tok = tok_parser.load(real_tokenizer_json().string());
    // Every id the tokenizer knows: the BPE vocabulary, then added tokens (which win on overlap,
    // as HF's id_to_token looks them up first).
    std::map<int64_t, std::string> id_to_token;
    const simdjson::dom::object vocab = tok["model"]["vocab"].get_object().value();
    const simdjson::dom::array added_tokens = tok["added_tokens"].get_array().value();
    for (auto [text, id] : vocab)
        id_to_token[id.get_int64().value()] = std::string(text);
    for (auto added : added_tokens)
        id_to_token[added["id"].get_int64().value()] = std::string(added["content"].get_string().value());
    BOOST_REQUIRE_EQUAL(id_to_token.rbegin()->first + 1, static_cast<int64_t>(id_to_token.size()));

    std::vector<std::string> decoded, raw;
    for (const auto& [id, text] : id_to_token) {
        raw.push_back(text);
        decoded.push_back(engram::decode_byte_level(text));
    }
    const auto tm = engram::build_compressed_token_map(decoded, raw);
    BOOST_REQUIRE_MESSAGE(tm.ok(), (tm.ok() ? "" : tm.message()));

    simdjson::dom::parser gold_parser;
    const auto gold = gold_parser.load((fixtures_dir() / "engram/token_map.json").string());
    const auto want = int_array(gold["token_map"].get_array().value());
    BOOST_TEST(gold["vocab"].get_int64().value() == static_cast<int64_t>(want.size()));
    BOOST_TEST(tm->compressed_vocab == gold["compressed_vocab_size"].get_int64().value());
    BOOST_REQUIRE_EQUAL(tm->map.size(), want.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (tm->map[i] == want[i]) continue;
        if (++mismatches <= 20)
            BOOST_TEST_MESSAGE("token " << i << " raw '" << raw[i] << "' decoded '" << decoded[i]
                                        << "': got " << tm->map[i] << ", want " << want[i]);
    }
    BOOST_TEST(mismatches == 0u);
}


// The same map through the tokenizer (forge and convert build it this way), padded to 129,280 ids.
BOOST_AUTO_TEST_CASE(token_map_through_the_tokenizer_matches_reference,
                     *requires_path(real_tokenizer_json()) *
                         requires_path(fixtures_dir() / "engram/token_map.json")) {
    auto data = moestream::load_hf_tokenizer(real_tokenizer_json().string(), 129280);
    BOOST_REQUIRE(data.ok());
    auto tok = moestream::tokenizer::create(std::move(*data));
    BOOST_REQUIRE(tok.ok());
    const auto tm = engram::token_map_from_tokenizer(*tok, 2);
    BOOST_REQUIRE_MESSAGE(tm.ok(), (tm.ok() ? "" : tm.message()));
    simdjson::dom::parser gold_parser;
    const auto gold = gold_parser.load((fixtures_dir() / "engram/token_map.json").string());
    const auto want = int_array(gold["token_map"].get_array().value());
    BOOST_TEST(tm->compressed_vocab == gold["compressed_vocab_size"].get_int64().value());
    BOOST_REQUIRE_EQUAL(tm->map.size(), size_t(129280));
    size_t mismatches = 0;
    for (size_t i = 0; i < want.size(); ++i) mismatches += (tm->map[i] != want[i]);
    BOOST_TEST(mismatches == 0u);
    for (size_t i = want.size(); i < tm->map.size(); ++i) BOOST_TEST_REQUIRE(tm->map[i] == tm->map[2]);
    BOOST_TEST(!engram::token_map_from_tokenizer(*tok, 129279).ok());  // a padding id cannot be the pad
}

BOOST_AUTO_TEST_SUITE_END()
