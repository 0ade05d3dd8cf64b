// Tokenizer tests: golden ids from HF tokenizers (fixtures/tokenizer/encode.json), the
// pre-tokenizer splits, the streaming decoder and round trips.
#include <simdjson.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "model/tokenizer.h"
#include "model/unicode.h"
#include "tests/common/test_support.h"

namespace moestream {
namespace {

std::filesystem::path tokenizer_json() {
    return test::source_dir() / ".deps/tokenizer-deepseek_v3/models/tokenizer.json";
}

// Loaded once for the whole suite: parsing 7.8 MB of JSON per test case would dominate.
const tokenizer& deepseek() {
    static const tokenizer tok = [] {
        auto data = load_hf_tokenizer(tokenizer_json().string(), 129280);
        BOOST_REQUIRE_MESSAGE(data.ok(), (data.ok() ? "" : data.message()));
        auto t = tokenizer::create(std::move(*data));
        BOOST_REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.message()));
        return std::move(*t);
    }();
    return tok;
}

std::string ids_str(const std::vector<int32_t>& ids) {
    std::ostringstream s;
    for (size_t i = 0; i < ids.size(); ++i) s << (i ? "," : "") << ids[i];
    return s.str();
}

// Pieces of the pre-tokenizer, found by encoding each and checking the boundaries through
// decode(): a piece never merges with its neighbours, so encode(a+b) == encode(a)+encode(b)
// exactly when a/b is a piece boundary.
bool is_boundary(const tokenizer& t, std::string_view a, std::string_view b) {
    auto ea = t.encode(a, false), eb = t.encode(b, false);
    ea.insert(ea.end(), eb.begin(), eb.end());
    return t.encode(std::string(a) + std::string(b), false) == ea;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tokenizer_suite)

BOOST_AUTO_TEST_CASE(utf8_decode_and_encode) {
    using namespace unicode;
    for (char32_t cp : {char32_t(0x41), char32_t(0xE9), char32_t(0x20AC), char32_t(0x1F999), char32_t(0x10FFFF)}) {
        const std::string s = to_utf8(cp);
        auto d = decode_utf8(s, 0);
        BOOST_TEST(d.valid);
        BOOST_TEST(uint32_t(d.cp) == uint32_t(cp));
        BOOST_TEST(d.len == s.size());
    }
    // overlong, surrogate, above U+10FFFF, lone continuation, truncated
    for (std::string bad : {"\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80", "\xE2\x82"}) {
        auto d = decode_utf8(bad, 0);
        BOOST_TEST(!d.valid);
    }
    BOOST_TEST(decode_utf8("\xE2\x82", 0).len == 2u);  // the maximal subpart is consumed
    BOOST_TEST(complete_prefix_length("ab\xF0\x9F") == 2u);
    BOOST_TEST(complete_prefix_length("ab\xF0\x9F\xA6\x99") == 6u);
    BOOST_TEST(complete_prefix_length("ab\x80") == 3u);  // invalid, not incomplete: emit now
}

BOOST_AUTO_TEST_CASE(unicode_classes) {
    using namespace unicode;
    auto char_classes = [](char32_t cp) { return unicode::char_classes(cp); };
    BOOST_TEST((char_classes(U'a') & cls_letter));
    BOOST_TEST((char_classes(U'5') & cls_number));
    BOOST_TEST((char_classes(U'½') & cls_number));
    BOOST_TEST((char_classes(U'$') & cls_symbol));
    BOOST_TEST((char_classes(U'$') & cls_ascii_punct));
    BOOST_TEST((char_classes(U'。') & cls_punct));
    BOOST_TEST((char_classes(0x3000) & cls_space));
    BOOST_TEST((char_classes(0x85) & cls_space));
    BOOST_TEST(!(char_classes(0x200B) & cls_space));  // zero width space is not White_Space
    BOOST_TEST((char_classes(U'\n') & cls_newline));
    BOOST_TEST((char_classes(0x301) & cls_mark));
    BOOST_TEST((char_classes(U'語') & cls_cjk));
    BOOST_TEST((char_classes(U'カ') & cls_cjk));
    BOOST_TEST(!(char_classes(U'한') & cls_cjk));
    BOOST_TEST((char_classes(0x1F600) & cls_symbol));
}

BOOST_AUTO_TEST_CASE(golden_encode, *test::requires_path(tokenizer_json()) *
                                        test::requires_path(test::fixtures_dir() / "tokenizer/encode.json")) {
    const tokenizer& tok = deepseek();
    simdjson::dom::parser parser;
    simdjson::dom::element root = parser.load((test::fixtures_dir() / "tokenizer/encode.json").string());
    size_t n = 0;
    for (simdjson::dom::element c : root["cases"].get_array()) {
        const std::string text{std::string_view(c["text"])};
        const std::string decoded{std::string_view(c["decoded"])};
        std::vector<int32_t> want;
        for (int64_t id : c["ids"].get_array()) want.push_back(int32_t(id));
        const auto got = tok.encode(text, true);
        BOOST_TEST(ids_str(got) == ids_str(want), "case " << n << ": " << text);
        BOOST_TEST(tok.decode(got) == decoded, "case " << n);
        ++n;
    }
    BOOST_TEST(n > 50u);
}

BOOST_AUTO_TEST_CASE(vocabulary_layout, *test::requires_path(tokenizer_json())) {
    const tokenizer& tok = deepseek();
    BOOST_TEST(tok.vocab_size() == 129280);
    const auto& d = tok.data();
    BOOST_TEST(d.bos_id == 0);
    BOOST_TEST(d.eos_id == 1);
    BOOST_TEST(d.add_bos);
    BOOST_TEST(!d.chat_template.empty());
    BOOST_TEST(d.token_types[0] == int32_t(token_type::control));
    BOOST_TEST(d.token_types[128803] == int32_t(token_type::user_defined));  // <｜User｜>
    BOOST_TEST(d.token_types[1000] == int32_t(token_type::normal));
    BOOST_TEST(d.token_types[129000] == int32_t(token_type::unused));
    BOOST_TEST(tok.find_added("<｜User｜>") == 128803);
    BOOST_TEST(tok.find_added("<｜User") == -1);
    BOOST_TEST(tok.token_bytes(128803) == "<｜User｜>");
    BOOST_TEST(tok.token_bytes(129000) == "");
    BOOST_TEST(tok.token_bytes(-1) == "");
    // Every placeholder is unique.
    std::set<std::string> seen(d.tokens.begin(), d.tokens.end());
    BOOST_TEST(seen.size() == d.tokens.size());
}

BOOST_AUTO_TEST_CASE(special_tokens_only_when_asked, *test::requires_path(tokenizer_json())) {
    const tokenizer& tok = deepseek();
    const std::string text = "a<｜User｜>b<｜end▁of▁sentence｜>";
    auto with = tok.encode(text, true);
    BOOST_TEST(std::count(with.begin(), with.end(), 128803) == 1);
    BOOST_TEST(with.back() == 1);
    auto without = tok.encode(text, false);
    BOOST_TEST(std::count(without.begin(), without.end(), 128803) == 0);
    BOOST_TEST(std::count(without.begin(), without.end(), 1) == 0);
    BOOST_TEST(tok.decode(without) == text);
    // A prefix of an added token is plain text.
    BOOST_TEST(tok.decode(tok.encode("<｜User", true)) == "<｜User");
}

BOOST_AUTO_TEST_CASE(pre_tokenizer_pieces, *test::requires_path(tokenizer_json())) {
    const tokenizer& tok = deepseek();
    // \p{N}{1,3}: digits in groups of three from the left.
    BOOST_TEST(is_boundary(tok, "123", "4567"));
    BOOST_TEST(is_boundary(tok, "abc", "1"));
    // CJK/kana runs are isolated from Latin text.
    BOOST_TEST(is_boundary(tok, "apple", "工作"));
    BOOST_TEST(is_boundary(tok, "工作", "apple"));
    // ASCII punctuation + letters: "'s", ".cpp".
    BOOST_TEST(is_boundary(tok, "foo", ".cpp"));
    // \s+(?!\S): the last space goes with the next word.
    BOOST_TEST(is_boundary(tok, "x", "   "));
    BOOST_TEST(is_boundary(tok, "  ", " Hello"));
    // \s*[\r\n]+ ends after the last newline.
    BOOST_TEST(is_boundary(tok, " \n\n", "  x"));
    BOOST_TEST(is_boundary(tok, "x", " \n"));
    // ' ?[\p{P}\p{S}]+[\r\n]*' keeps the trailing newlines.
    BOOST_TEST(is_boundary(tok, " {\n", "x"));
    // Exact ids of splits that the golden file exercises only indirectly.
    auto four = tok.encode("3333", false), three = tok.encode("333", false), one = tok.encode("3", false);
    three.insert(three.end(), one.begin(), one.end());
    BOOST_TEST(four == three, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(round_trip, *test::requires_path(tokenizer_json())) {
    const tokenizer& tok = deepseek();
    const std::vector<std::string> texts = {
        "", "a", "Hello, world!\n", "    int x = 42;\r\n\tfoo();\n\n\n",
        "Ünïcödé façade — “quotes” … ½ ⅓ Ⅻ", "日本語のテキストとカタカナ、한국어 텍스트",
        "👩‍👩‍👧‍👦 🇫🇷 ✌🏽 e\u0301", "\x01\x02\x7f control \u200b\u2028\u3000",
        std::string(1000, ' ') + std::string(500, 'a') + std::string(300, '!'),
        "\xff\xfe invalid \xc3 bytes \xe2\x82", "<｜User｜>hi<｜Assistant｜>",
    };
    for (const auto& t : texts) {
        BOOST_TEST(tok.decode(tok.encode(t, false)) == t);
        BOOST_TEST(tok.decode(tok.encode(t, true)) == t);
    }
}

BOOST_AUTO_TEST_CASE(long_piece_matches_short_algorithm, *test::requires_path(tokenizer_json())) {
    // Pieces over 64 bytes take the heap path; a repeated word must tokenize like the sum of
    // its copies where the split makes them separate pieces.
    const tokenizer& tok = deepseek();
    std::string word = "abcdefghijklmnopqrstuvwxyz";
    std::string lng;
    for (int i = 0; i < 10; ++i) lng += word;
    auto ids = tok.encode(lng, false);
    BOOST_TEST(tok.decode(ids) == lng);
    BOOST_TEST(ids.size() < lng.size() / 2);
}

BOOST_AUTO_TEST_CASE(stream_decoder_holds_split_characters) {
    const std::string emoji = "🦙";  // F0 9F A6 99
    utf8_stream_decoder d;
    BOOST_TEST(d.push("a") == "a");
    BOOST_TEST(d.push(emoji.substr(0, 1)) == "");
    BOOST_TEST(d.push(emoji.substr(1, 2)) == "");
    BOOST_TEST(d.push(emoji.substr(3) + "b") == emoji + "b");
    const std::string cjk = "语";  // 3 bytes
    BOOST_TEST(d.push(cjk.substr(0, 2)) == "");
    BOOST_TEST(d.push(cjk.substr(2)) == cjk);
    BOOST_TEST(d.finish() == "");
}

BOOST_AUTO_TEST_CASE(stream_decoder_invalid_bytes) {
    const std::string fffd = "\xEF\xBF\xBD";
    utf8_stream_decoder d;
    BOOST_TEST(d.push("x\xFFy") == "x" + fffd + "y");
    BOOST_TEST(d.push("\x80") == fffd);                 // lone continuation byte
    BOOST_TEST(d.push("\xE8\xAF") == "");                // incomplete: held back
    BOOST_TEST(d.push("z") == fffd + "z");               // broken by a non-continuation
    BOOST_TEST(d.push("\xF0\x9F") == "");
    BOOST_TEST(d.finish() == fffd);                      // cut at the end
    BOOST_TEST(d.finish() == "");
}

BOOST_AUTO_TEST_CASE(stream_decoder_over_real_tokens, *test::requires_path(tokenizer_json())) {
    const tokenizer& tok = deepseek();
    const std::string text = "Emoji 🦙🚀👩‍💻, 价格是1234567元, Ærøskøbing";
    std::string streamed;
    utf8_stream_decoder d;
    for (int32_t id : tok.encode(text, false)) {
        const std::string piece = d.push(tok.token_bytes(id));
        // Every push is valid UTF-8 on its own.
        for (size_t p = 0; p < piece.size();) {
            auto dec = unicode::decode_utf8(piece, p);
            BOOST_REQUIRE(dec.valid);
            p += dec.len;
        }
        streamed += piece;
    }
    streamed += d.finish();
    BOOST_TEST(streamed == text);
}

BOOST_AUTO_TEST_CASE(create_rejects_bad_data) {
    tokenizer_data data;
    BOOST_TEST(!tokenizer::create(data).ok());  // empty
    data.tokens = {"a", "b"};
    data.token_types = {1};
    BOOST_TEST(!tokenizer::create(data).ok());  // types/tokens mismatch
    auto bad = load_hf_tokenizer("/nonexistent/tokenizer.json", 10);
    BOOST_TEST(!bad.ok());
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream
