// `convert` end to end on a release-format checkpoint that ships NO engram_tables.safetensors (as
// the release does): the converter must build the engram side tables itself, the compressed token
// map from the folder's tokenizer.json and the multipliers from numpy's PCG64 stream.
//
// The checkpoint is the dsv41-tiny-bf16 fixture grown to the real DeepSeek vocabulary (129,280
// ids): config.json with vocab_size 129280, the DSpark noise token of the release, another engram
// prime start (engram_num_embeddings recomputed from the primes) and the golden compressed
// vocabulary size; model.safetensors with the fixture's tensors, except the vocabulary-sized ones
// (embed, head, DSpark Markov head), regenerated with deterministic pseudo-random values of the
// fixture tensor's dtype and scale, and the engram tables, re-sampled from the fixture's rows to
// the new row counts; the real tokenizer.json and tokenizer_config.json beside them.
//
// Checked: the stored token map equals the reference's (fixtures/engram/token_map.json) entry for
// entry, padding ids share the pad id's key; the multipliers equal multipliers.json where it has
// the (layer, n-gram size, compressed vocabulary) and the C++ PCG64 port otherwise; primes and
// offsets are the primes of config.json and add up to the table rows; the GGUF's tokenizer encodes
// the golden texts as HF does; the converted model loads and runs a prefill, a decode step and a
// DSpark draft with finite outputs of the right size. Bad inputs: no tokenizer.json and no
// engram_tables.safetensors; a tokenizer with more ids than config.json's vocab_size.
//
// The tokenizer is the set-up's copy, found through paths.deps_dir of the configuration
// (MOESTREAM_DEPS_DIR or the build's default); the tests are skipped with the reason without it.
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "../common/test_support.h"
#include "config/config.h"
#include "fixture_model.h"
#include "model/engram_tables.h"
#include "model/quant.h"
#include "model/tokenizer.h"
#include "scheduler/model_gguf.h"
#include "storage/gguf.h"
#include "storage/safetensors_writer.h"
#include "tools/convert_checkpoint.h"

namespace moestream::test {
namespace {

namespace fs = std::filesystem;
using safetensors::dtype;

const char* kBase = "dsv41-tiny-bf16";
constexpr int64_t kVocab = 129280;      // the release's vocab_size
constexpr int64_t kPrimeStart = 1000;   // engram_vocab_size: not the fixture's 97, so the rows change

// ---- inputs -----------------------------------------------------------------------------------
// The DeepSeek tokenizer folder: paths.deps_dir of the configuration (MOESTREAM_DEPS_DIR, else the
// build's default .deps), as `moestream forge` finds it.
fs::path tokenizer_dir() {
    static const fs::path dir = [] {
        const std::vector<std::string> none;
        auto a = cli::args::parse(none, config_option_specs());
        std::string deps = (source_dir() / ".deps").string();
        if (a.ok())
            if (auto c = load_config(*a); c.ok()) deps = c->paths.deps_dir;
        return fs::path(deps) / "tokenizer-deepseek_v3" / "models";
    }();
    return dir;
}
fs::path tokenizer_json() { return tokenizer_dir() / "tokenizer.json"; }
fs::path golden_token_map() { return fixtures_dir() / "engram" / "token_map.json"; }
fs::path golden_multipliers() { return fixtures_dir() / "engram" / "multipliers.json"; }
fs::path base_dir() { return fixtures_dir() / kBase; }

// Skipped, with what is missing and how to get it, when an input is absent.
struct inputs_present {
    boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
        const std::pair<fs::path, const char*> need[] = {
            {tokenizer_json(), "the DeepSeek tokenizer (scripts/setup.sh fetches it; MOESTREAM_DEPS_DIR relocates it)"},
            {base_dir() / "model.safetensors", "the golden fixtures"},
            {base_dir() / "config.json", "the golden fixtures"},
            {golden_token_map(), "the golden fixtures"},
            {golden_multipliers(), "the golden fixtures"},
        };
        for (const auto& [p, what] : need)
            if (!fs::exists(p)) {
                boost::test_tools::assertion_result r(false);
                r.message() << "skipped: " << p.string() << " is absent (" << what << ")";
                return r;
            }
        return true;
    }
};
auto needs_inputs() { return boost::unit_test::precondition(inputs_present{}); }

// ---- deterministic values -----------------------------------------------------------------------
uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
uint64_t name_seed(std::string_view s) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
    return h;
}

float element(const safetensors::file& f, const safetensors::tensor& t, size_t i) {
    const auto b = f.data(t);
    if (t.type == dtype::f32) {
        float v;
        std::memcpy(&v, b.data() + 4 * i, 4);
        return v;
    }
    uint16_t h;
    std::memcpy(&h, b.data() + 2 * i, 2);
    return quant::bf16_to_f32(h);
}

// A fixture tensor [old_vocab, cols] regrown to [kVocab, cols]: uniform values with the fixture
// tensor's RMS, in its dtype.
std::vector<std::byte> regrown(const safetensors::file& f, const safetensors::tensor& t) {
    BOOST_TEST_REQUIRE((t.type == dtype::f32 || t.type == dtype::bf16), t.name << ": unexpected dtype");
    double ss = 0;
    for (size_t i = 0; i < size_t(t.elements()); ++i) ss += double(element(f, t, i)) * element(f, t, i);
    double rms = std::sqrt(ss / double(t.elements()));
    if (!(rms > 0)) rms = 0.02;
    const double amp = rms * std::sqrt(3.0);
    const size_t n = size_t(kVocab * t.shape[1]);
    const size_t width = t.type == dtype::f32 ? 4 : 2;
    std::vector<std::byte> out(n * width);
    uint64_t s = name_seed(t.name);
    for (size_t i = 0; i < n; ++i) {
        s = splitmix(s);
        const float v = float(amp * (double(s >> 11) * 0x1.0p-53 * 2.0 - 1.0));
        if (width == 4) {
            std::memcpy(out.data() + 4 * i, &v, 4);
        } else {
            const uint16_t h = quant::f32_to_bf16(v);
            std::memcpy(out.data() + 2 * i, &h, 2);
        }
    }
    return out;
}

// An engram table (values or scales, one row per hash bucket) re-sampled to `rows` rows: row r is
// a fixture row chosen by (layer, r), the same for the values and the scales.
std::vector<std::byte> resampled(const safetensors::file& f, const safetensors::tensor& t, int layer, int64_t rows) {
    const int64_t old_rows = t.shape[0];
    const size_t row_bytes = size_t(t.bytes / uint64_t(old_rows));
    const auto src = f.data(t);
    std::vector<std::byte> out(size_t(rows) * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
        const uint64_t from = splitmix(uint64_t(layer) * 0x100000001ull + uint64_t(r)) % uint64_t(old_rows);
        std::memcpy(out.data() + size_t(r) * row_bytes, src.data() + from * row_bytes, row_bytes);
    }
    return out;
}

// ---- the checkpoint ------------------------------------------------------------------------------
// The fixture's config.json with some fields replaced (every replaced field must exist there).
void write_config(const fs::path& out, const std::map<std::string, std::string>& replace) {
    simdjson::dom::parser parser;
    simdjson::dom::object root;
    BOOST_TEST_REQUIRE(parser.load((base_dir() / "config.json").string()).get(root) == simdjson::SUCCESS);
    std::string text = "{\n";
    std::set<std::string> done;
    for (auto [key, val] : root) {
        const std::string k(key);
        auto it = replace.find(k);
        text += (text.size() > 2 ? ",\n  \"" : "  \"") + k + "\": " + (it != replace.end() ? it->second : simdjson::minify(val));
        if (it != replace.end()) done.insert(k);
    }
    text += "\n}\n";
    for (const auto& [k, v] : replace) BOOST_TEST_REQUIRE(done.count(k) == 1u, "config.json of the fixture has no " << k);
    std::ofstream(out) << text;
}

std::string int_list(const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
}

// The array under `key` (named: iterating a temporary's array trips GCC's dangling-pointer warning).
simdjson::dom::array array_at(simdjson::dom::element e, std::string_view key) {
    simdjson::dom::array a;
    BOOST_TEST_REQUIRE(e[key].get(a) == simdjson::SUCCESS, "no array '" << key << "'");
    return a;
}

struct golden_map {
    std::vector<int32_t> map;  // [tokenizer ids]
    int64_t compressed = 0;
};
const golden_map& golden() {
    static const golden_map g = [] {
        golden_map out;
        simdjson::dom::parser parser;
        simdjson::dom::element doc;
        BOOST_TEST_REQUIRE(parser.load(golden_token_map().string()).get(doc) == simdjson::SUCCESS);
        const auto arr = array_at(doc, "token_map");
        for (auto v : arr) out.map.push_back(int32_t(v.get_int64().value()));
        out.compressed = doc["compressed_vocab_size"].get_int64().value();
        BOOST_TEST_REQUIRE(doc["vocab"].get_int64().value() == int64_t(out.map.size()));
        return out;
    }();
    return g;
}

struct converted {
    fs::path dir, target, draft;
    dsv41::hparams hp;
    std::map<std::string, std::string> config;  // the replaced config.json fields
    std::vector<std::string> log;
    double seconds = 0;
};

// The hparams the converted checkpoint must have (the fixture's with the replaced fields).
dsv41::hparams grown_hparams() {
    auto base = convert::read_config((base_dir() / "config.json").string());
    BOOST_TEST_REQUIRE(base.ok(), (base.ok() ? "" : base.message()));
    dsv41::hparams hp = *base;
    hp.vocab = kVocab;
    hp.dspark_noise_token = dsv41::hparams{}.dspark_noise_token;  // the release's (128799)
    hp.engram_prime_start = kPrimeStart;
    return hp;
}

std::map<std::string, std::string> grown_config(const dsv41::hparams& hp) {
    std::vector<int64_t> rows;
    for (const auto& l : engram::compute_primes(hp.engram_layers, hp.engram_max_ngram, hp.engram_n_heads,
                                                hp.engram_prime_start))
        rows.push_back(l.rows);
    return {{"vocab_size", std::to_string(hp.vocab)},
            {"dspark_noise_token_id", std::to_string(hp.dspark_noise_token)},
            {"engram_vocab_size", std::to_string(hp.engram_prime_start)},
            {"engram_num_embeddings", int_list(rows)},
            {"engram_compressed_vocab_size", std::to_string(golden().compressed)}};
}

// Builds the checkpoint folder (once per process) and converts it (target + draft).
const converted& checkpoint() {
    static std::unique_ptr<converted> cached;
    if (cached) return *cached;
    auto c = std::make_unique<converted>();
    c->dir = scratch_dir("convert-tokenizer/checkpoint");
    const fs::path out = scratch_dir("convert-tokenizer/out");
    c->target = out / "target.gguf";
    c->draft = out / "draft.gguf";
    c->hp = grown_hparams();
    c->config = grown_config(c->hp);
    write_config(c->dir / "config.json", c->config);

    const auto base_path = (base_dir() / "model.safetensors").string();
    auto base = safetensors::file::open(base_path);
    BOOST_TEST_REQUIRE(base.ok(), (base.ok() ? "" : base.message()));
    auto base_hp = convert::read_config((base_dir() / "config.json").string());
    BOOST_TEST_REQUIRE(base_hp.ok());
    safetensors::writer w;
    std::deque<std::vector<std::byte>> owned;
    int regrown_n = 0, resampled_n = 0;
    for (const auto& t : base->tensors()) {
        if (t.shape.size() == 2 && t.shape[0] == base_hp->vocab) {
            owned.push_back(regrown(*base, t));
            BOOST_TEST_REQUIRE(w.add_view(t.name, t.type, {kVocab, t.shape[1]}, owned.back()).ok());
            ++regrown_n;
            continue;
        }
        if (t.name.starts_with("layers.") && (t.name.ends_with(".engram.embed.weight") || t.name.ends_with(".engram.embed.scale"))) {
            const int layer = std::stoi(t.name.substr(7));
            const auto it = std::find(c->hp.engram_layers.begin(), c->hp.engram_layers.end(), layer);
            BOOST_TEST_REQUIRE((it != c->hp.engram_layers.end()));
            const int64_t rows = dsv41::engram_rows(c->hp, size_t(it - c->hp.engram_layers.begin()));
            owned.push_back(resampled(*base, t, layer, rows));
            BOOST_TEST_REQUIRE(w.add_view(t.name, t.type, {rows, t.shape[1]}, owned.back()).ok());
            ++resampled_n;
            continue;
        }
        BOOST_TEST_REQUIRE(w.add_view(t.name, t.type, t.shape, base->data(t)).ok());
    }
    for (const auto& [k, v] : base->metadata())
        if (k != safetensors::kOrderKey && k != safetensors::kStackedKey) BOOST_TEST_REQUIRE(w.set_metadata(k, v).ok());
    BOOST_TEST_REQUIRE(regrown_n == 4);  // embed, head, the Markov head's embed and head
    BOOST_TEST_REQUIRE(resampled_n == 2 * int(c->hp.engram_layers.size()));
    BOOST_TEST_REQUIRE(w.write((c->dir / "model.safetensors").string()).ok());
    fs::copy_file(tokenizer_json(), c->dir / "tokenizer.json");
    if (fs::exists(tokenizer_dir() / "tokenizer_config.json"))
        fs::copy_file(tokenizer_dir() / "tokenizer_config.json", c->dir / "tokenizer_config.json");
    BOOST_TEST_REQUIRE(!fs::exists(c->dir / "engram_tables.safetensors"));

    convert::options o{c->dir.string(), c->target.string(), c->draft.string(), 1};
    const auto t0 = std::chrono::steady_clock::now();
    auto st = convert::convert_checkpoint(o, [&](std::string_view line) { c->log.emplace_back(line); });
    c->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string all;
    for (const auto& l : c->log) all += "\n  " + l;
    BOOST_TEST_REQUIRE(st.ok(), "convert: " << (st.ok() ? "" : st.message()) << all);
    BOOST_TEST_MESSAGE("converted " << c->dir.string() << " in " << c->seconds << " s:" << all);
    cached = std::move(c);
    return *cached;
}

template <class T>
std::vector<T> tensor_values(const gguf::model_file& f, const std::string& name, ggml_type type,
                             std::vector<int64_t> ne) {
    const auto* t = f.tensor(name);
    BOOST_TEST_REQUIRE(t != nullptr, "no tensor " << name);
    BOOST_TEST_REQUIRE((t->type == type), name << " has type " << int(t->type));
    for (size_t i = 0; i < ne.size(); ++i) BOOST_TEST_REQUIRE(t->ne[i] == ne[i], name << " ne[" << i << "]");
    std::vector<T> out(size_t(t->elements()));
    const auto bytes = f.data(*t);
    BOOST_TEST_REQUIRE(bytes.size() == out.size() * sizeof(T));
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
}

bool is_prime(int64_t n) {
    if (n < 2) return false;
    for (int64_t d = 2; d * d <= n; ++d)
        if (n % d == 0) return false;
    return true;
}

// A folder holding the converted checkpoint's model.safetensors (linked) and the given files.
fs::path bad_checkpoint(const std::string& name) {
    const auto& good = checkpoint();
    const auto dir = scratch_dir("convert-tokenizer/" + name);
    fs::create_symlink(good.dir / "model.safetensors", dir / "model.safetensors");
    return dir;
}

std::string convert_error(const fs::path& dir) {
    const auto out = dir / "out.gguf";
    convert::options o{dir.string(), out.string(), "", 1};
    auto st = convert::convert_checkpoint(o, [](std::string_view) {});
    BOOST_TEST(!fs::exists(out), "a failed conversion left " << out.string());
    return st.ok() ? std::string() : st.message();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(convert_tokenizer)

BOOST_AUTO_TEST_CASE(engram_tables_computed_from_tokenizer, *needs_inputs()) {
    const auto& c = checkpoint();
    const auto& hp = c.hp;
    const auto& gold = golden();
    bool computed_line = false;
    for (const auto& l : c.log)
        computed_line |= l.find("engram tables: computed from") != std::string::npos &&
                         l.find("compressed vocabulary " + std::to_string(gold.compressed)) != std::string::npos;
    BOOST_TEST(computed_line, "the converter did not report computing the tables from tokenizer.json");

    auto mf = gguf::model_file::open(c.target.string());
    BOOST_TEST_REQUIRE(mf.ok(), (mf.ok() ? "" : mf.message()));
    auto back = read_hparams(*mf);
    BOOST_TEST_REQUIRE(back.ok(), (back.ok() ? "" : back.message()));
    BOOST_TEST(back->vocab == kVocab);
    BOOST_TEST(back->dspark_noise_token == hp.dspark_noise_token);
    BOOST_TEST(back->engram_prime_start == kPrimeStart);
    auto compressed_md = mf->get_u64("deepseek41.engram_compressed_vocab_size");
    BOOST_TEST_REQUIRE(compressed_md.ok());
    BOOST_TEST(int64_t(*compressed_md) == gold.compressed);

    // Token map: the reference's, entry for entry; padding ids share the pad id's key.
    const auto map = tensor_values<int32_t>(*mf, "engram_token_map.weight", ggml_type::i32, {kVocab});
    BOOST_TEST_REQUIRE(gold.map.size() < map.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < gold.map.size(); ++i)
        if (map[i] != gold.map[i] && ++mismatches <= 10)
            BOOST_TEST_MESSAGE("token " << i << ": stored " << map[i] << ", reference " << gold.map[i]);
    BOOST_TEST(mismatches == 0u, mismatches << " of " << gold.map.size() << " token map entries differ");
    size_t pad_mismatches = 0;
    for (size_t i = gold.map.size(); i < map.size(); ++i) pad_mismatches += map[i] != map[size_t(hp.engram_pad_id)];
    BOOST_TEST(pad_mismatches == 0u, "padding ids not mapped to the pad id's key");
    BOOST_TEST(int64_t(std::set<int32_t>(map.begin(), map.end()).size()) == gold.compressed);

    // Multipliers: multipliers.json's row where it has (layer, n-gram size, compressed vocabulary),
    // numpy's stream through the C++ port otherwise; odd and below INT64_MAX / compressed.
    const int64_t n_eng = int64_t(hp.engram_layers.size());
    const auto mult = tensor_values<int64_t>(*mf, "engram_multipliers.weight", ggml_type::i64,
                                             {hp.engram_max_ngram, n_eng});
    simdjson::dom::parser parser;
    simdjson::dom::element mdoc;
    BOOST_TEST_REQUIRE(parser.load(golden_multipliers().string()).get(mdoc) == simdjson::SUCCESS);
    int golden_rows = 0;
    for (int64_t e = 0; e < n_eng; ++e) {
        const int layer = hp.engram_layers[size_t(e)];
        const std::vector<int64_t> got(mult.begin() + e * hp.engram_max_ngram, mult.begin() + (e + 1) * hp.engram_max_ngram);
        for (int64_t m : got) {
            BOOST_TEST(m % 2 == 1);
            BOOST_TEST(m < INT64_MAX / gold.compressed);
        }
        BOOST_TEST(got == engram::hash_multipliers(layer, hp.engram_max_ngram, gold.compressed),
                   boost::test_tools::per_element());
        const auto cases = array_at(mdoc, "cases");
        for (auto cs : cases) {
            if (cs["max_ngram_size"].get_int64().value() != hp.engram_max_ngram ||
                cs["compressed_vocab_size"].get_int64().value() != gold.compressed)
                continue;
            size_t i = 0;
            const auto rows = array_at(cs, "multipliers"), ids = array_at(cs, "layer_ids");
            for (auto id : ids) {
                if (id.get_int64().value() == layer) {
                    std::vector<int64_t> want;
                    simdjson::dom::array row;
                    BOOST_TEST_REQUIRE(rows.at(i).get(row) == simdjson::SUCCESS);
                    for (auto v : row) want.push_back(v.get_int64().value());
                    BOOST_TEST(got == want, boost::test_tools::per_element());
                    ++golden_rows;
                }
                ++i;
            }
        }
    }
    BOOST_TEST_MESSAGE(golden_rows << " multiplier rows checked against multipliers.json, all " << n_eng
                                   << " against the PCG64 port");
    BOOST_TEST(golden_rows >= 1, "multipliers.json has no row for this setting (layer 1, 4-grams, compressed "
                                     << gold.compressed << ")");

    // Primes and offsets: the primes of config.json (prime start, n-gram orders, heads), distinct,
    // increasing within an order; offsets their exclusive prefix sum; the sum the table rows.
    const int64_t cols = hp.engram_columns();
    const auto primes = tensor_values<int64_t>(*mf, "engram_primes.weight", ggml_type::i64, {cols, n_eng});
    const auto offsets = tensor_values<int64_t>(*mf, "engram_offsets.weight", ggml_type::i64, {cols, n_eng});
    const auto tables = engram::compute_primes(hp.engram_layers, hp.engram_max_ngram, hp.engram_n_heads, kPrimeStart);
    std::set<int64_t> distinct(primes.begin(), primes.end());
    BOOST_TEST(distinct.size() == primes.size());
    for (int64_t e = 0; e < n_eng; ++e) {
        const auto& t = tables[size_t(e)];
        const std::vector<int64_t> p(primes.begin() + e * cols, primes.begin() + (e + 1) * cols);
        const std::vector<int64_t> o(offsets.begin() + e * cols, offsets.begin() + (e + 1) * cols);
        BOOST_TEST(p == t.primes, boost::test_tools::per_element());
        BOOST_TEST(o == t.offsets, boost::test_tools::per_element());
        int64_t sum = 0;
        for (int64_t k = 0; k < cols; ++k) {
            BOOST_TEST(is_prime(p[size_t(k)]), p[size_t(k)] << " is not prime");
            BOOST_TEST(p[size_t(k)] >= kPrimeStart);
            if (k % hp.engram_n_heads) BOOST_TEST(p[size_t(k)] > p[size_t(k) - 1]);
            BOOST_TEST(o[size_t(k)] == sum);
            sum += p[size_t(k)];
        }
        const int layer = hp.engram_layers[size_t(e)];
        const auto* embd = mf->tensor("blk." + std::to_string(layer) + ".engram_embd.weight");
        const auto* scale = mf->tensor("blk." + std::to_string(layer) + ".engram_embd_scale.weight");
        BOOST_TEST_REQUIRE((embd && scale));
        BOOST_TEST(embd->ne[1] == sum);
        BOOST_TEST(scale->ne[1] == sum);
        BOOST_TEST(sum == t.rows);
    }
    // engram_num_embeddings written into config.json is what the converter accepted.
    std::vector<int64_t> rows;
    for (const auto& t : tables) rows.push_back(t.rows);
    BOOST_TEST(c.config.at("engram_num_embeddings") == int_list(rows));
    BOOST_TEST_MESSAGE("conversion took " << c.seconds << " s");
}

BOOST_AUTO_TEST_CASE(converted_model_tokenizes_loads_and_runs, *needs_inputs()) {
    const auto& c = checkpoint();
    // The GGUF's tokenizer (tokenizer.ggml.* written from tokenizer.json + tokenizer_config.json)
    // encodes the golden texts as HF does.
    auto tok = load_tokenizer(c.target.string());
    BOOST_TEST_REQUIRE(tok.ok(), (tok.ok() ? "" : tok.message()));
    BOOST_TEST(tok->vocab_size() == kVocab);
    if (fs::exists(tokenizer_dir() / "tokenizer_config.json")) {
        BOOST_TEST(tok->data().bos_id == tok->find_added("<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"));
        BOOST_TEST(!tok->data().chat_template.empty());
    }
    std::vector<int32_t> ids{tok->data().bos_id};
    const auto encode_json = fixtures_dir() / "tokenizer" / "encode.json";
    if (fs::exists(encode_json)) {
        simdjson::dom::parser parser;
        simdjson::dom::element doc;
        BOOST_TEST_REQUIRE(parser.load(encode_json.string()).get(doc) == simdjson::SUCCESS);
        int cases = 0;
        const auto all = array_at(doc, "cases");
        for (auto cs : all) {
            std::vector<int32_t> want;
            const auto want_ids = array_at(cs, "ids");
            for (auto v : want_ids) want.push_back(int32_t(v.get_int64().value()));
            // Added tokens in the text are split out as HF does (as the tokenizer suite encodes them).
            const auto got = tok->encode(std::string(cs["text"].get_string().value()), true);
            BOOST_TEST(got == want, "encode '" << cs["text"].get_string().value() << "'");
            for (int32_t id : got)
                if (ids.size() < 24) ids.push_back(id);
            ++cases;
        }
        BOOST_TEST_MESSAGE(cases << " golden encode cases through the converted file's tokenizer");
    } else {
        BOOST_TEST_MESSAGE("fixtures/tokenizer/encode.json absent: golden encodings not checked");
        ids = tok->encode("Hello, world! \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C", false);
    }
    // The prompt must reach past the fixture's 512 ids, where the embedding was regrown.
    BOOST_TEST_REQUIRE(*std::max_element(ids.begin(), ids.end()) >= 512);

    auto files = load_model(c.target.string(), c.draft.string());
    BOOST_TEST_REQUIRE(files.ok(), (files.ok() ? "" : files.message()));
    const loaded_model& lm = **files;
    const auto& hp = lm.hp;
    BOOST_TEST(hp.vocab == kVocab);
    BOOST_TEST_REQUIRE(lm.draft.has_value());
    // The loader's side tables are the file's.
    auto mf = gguf::model_file::open(c.target.string());
    BOOST_TEST_REQUIRE(mf.ok());
    const auto map = tensor_values<int32_t>(*mf, "engram_token_map.weight", ggml_type::i32, {kVocab});
    BOOST_TEST((std::vector<int32_t>(lm.weights.engram.token_map.begin(), lm.weights.engram.token_map.end()) == map));
    BOOST_TEST(lm.weights.engram.multipliers ==
               tensor_values<int64_t>(*mf, "engram_multipliers.weight", ggml_type::i64, {hp.engram_max_ngram}));
    for (size_t e = 0; e < hp.engram_layers.size(); ++e)
        BOOST_TEST(lm.weights.layers[size_t(hp.engram_layers[e])].engram_rows == dsv41::engram_rows(hp, e));

    // Hash rows of the real prompt stay inside each column's prime-sized slice of the table.
    const int64_t cols = hp.engram_columns(), n_eng = int64_t(hp.engram_layers.size());
    std::vector<int64_t> rows(size_t(cols * n_eng));
    for (int64_t p = 0; p < int64_t(ids.size()); ++p) {
        dsv41::engram_hash(hp, lm.weights.engram, ids, p, rows);
        for (int64_t k = 0; k < cols * n_eng; ++k) {
            const int64_t off = lm.weights.engram.offsets[size_t(k)], prime = lm.weights.engram.primes[size_t(k)];
            BOOST_TEST_REQUIRE((rows[size_t(k)] >= off && rows[size_t(k)] < off + prime),
                               "pos " << p << " column " << k << ": row " << rows[size_t(k)]);
        }
    }

    cpu_backend backend(2);
    resident_experts experts(lm);
    dsv41::model mdl(hp, lm.weights, &*lm.draft, experts, backend);
    dsv41::sequence_state seq(backend, hp, 64, 8, true);
    auto finite = [](const std::vector<float>& v) {
        return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
    };
    std::vector<float> logits;
    dsv41::forward_item prefill{&seq, ids, true};
    auto st = mdl.forward({&prefill, 1}, logits);
    BOOST_TEST_REQUIRE(st.ok(), (st.ok() ? "" : st.message()));
    BOOST_TEST_REQUIRE(logits.size() == ids.size() * size_t(kVocab));
    BOOST_TEST(finite(logits));
    const auto [lo, hi] = std::minmax_element(logits.end() - kVocab, logits.end());
    BOOST_TEST(*hi > *lo, "the last row's logits are constant");
    // A decode step with the greedy token, then a DSpark draft (the Markov head is vocab-sized too).
    const int32_t next = int32_t(std::max_element(logits.end() - kVocab, logits.end()) - (logits.end() - kVocab));
    dsv41::forward_item step{&seq, {&next, 1}, false};
    st = mdl.forward({&step, 1}, logits);
    BOOST_TEST_REQUIRE(st.ok(), (st.ok() ? "" : st.message()));
    BOOST_TEST_REQUIRE(logits.size() == size_t(kVocab));
    BOOST_TEST(finite(logits));
    const int32_t after = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    dsv41::draft_output out;
    st = mdl.draft(seq, after, out);
    BOOST_TEST_REQUIRE(st.ok(), (st.ok() ? "" : st.message()));
    const size_t B = size_t(hp.dspark_block_size);
    BOOST_TEST(out.tokens.size() == B);
    BOOST_TEST(out.logits.size() == B * size_t(kVocab));
    BOOST_TEST(out.confidence.size() == B);
    BOOST_TEST(finite(out.logits));
    BOOST_TEST(finite(out.confidence));
    for (int32_t t : out.tokens) BOOST_TEST((t >= 0 && t < kVocab));
}

BOOST_AUTO_TEST_CASE(no_tokenizer_and_no_engram_tables_is_named, *needs_inputs()) {
    const auto dir = bad_checkpoint("no-tokenizer");
    fs::copy_file(checkpoint().dir / "config.json", dir / "config.json");
    const auto msg = convert_error(dir);
    BOOST_TEST_MESSAGE("no tokenizer: " << msg);
    BOOST_TEST_REQUIRE(!msg.empty(), "converted without tokenizer.json nor engram_tables.safetensors");
    BOOST_TEST(msg.find("tokenizer.json") != std::string::npos, msg);
    BOOST_TEST(msg.find("engram_tables.safetensors") != std::string::npos, msg);
    BOOST_TEST(msg.find(dir.string()) != std::string::npos, msg);
}

BOOST_AUTO_TEST_CASE(tokenizer_vocabulary_beyond_vocab_size_is_refused, *needs_inputs()) {
    const auto& good = checkpoint();
    // config.json's vocab_size below the tokenizer's 128,815 ids.
    {
        const auto dir = bad_checkpoint("small-vocab");
        auto cfg = good.config;
        cfg["vocab_size"] = "128000";
        cfg["dspark_noise_token_id"] = "127999";
        write_config(dir / "config.json", cfg);
        fs::copy_file(good.dir / "tokenizer.json", dir / "tokenizer.json");
        const auto msg = convert_error(dir);
        BOOST_TEST_MESSAGE("vocab_size 128000: " << msg);
        BOOST_TEST_REQUIRE(!msg.empty(), "converted a 128,815-id tokenizer into vocab_size 128000");
        BOOST_TEST(msg.find("tokenizer.json") != std::string::npos, msg);
        BOOST_TEST(msg.find("vocab_size 128000") != std::string::npos, msg);
        BOOST_TEST(msg.find(std::to_string(golden().map.size() - 1)) != std::string::npos, msg);
    }
    // A tokenizer.json with an added token past config.json's 129,280.
    {
        const auto dir = bad_checkpoint("big-tokenizer");
        fs::copy_file(good.dir / "config.json", dir / "config.json");
        std::ifstream in(good.dir / "tokenizer.json", std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        std::string text = ss.str();
        const auto at = text.find("\"added_tokens\"");
        BOOST_TEST_REQUIRE(at != std::string::npos);
        const auto bracket = text.find('[', at);
        BOOST_TEST_REQUIRE(bracket != std::string::npos);
        text.insert(bracket + 1, "{\"id\": 129300, \"content\": \"<extra_token>\", \"single_word\": false, \"lstrip\": false, "
                                 "\"rstrip\": false, \"normalized\": false, \"special\": true},");
        std::ofstream(dir / "tokenizer.json", std::ios::binary) << text;
        const auto msg = convert_error(dir);
        BOOST_TEST_MESSAGE("tokenizer with id 129300: " << msg);
        BOOST_TEST_REQUIRE(!msg.empty(), "converted a tokenizer with id 129300 into vocab_size 129280");
        BOOST_TEST(msg.find("tokenizer.json") != std::string::npos, msg);
        BOOST_TEST(msg.find("129300") != std::string::npos, msg);
        BOOST_TEST(msg.find("vocab_size 129280") != std::string::npos, msg);
    }
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace moestream::test
