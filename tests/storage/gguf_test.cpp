// GGUF reader/writer: round trips, split models and every validation error, the latter by
// corrupting real written files.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "storage/gguf.h"
#include "tests/common/test_support.h"

namespace fs = std::filesystem;
using namespace moestream;
using namespace moestream::gguf;

namespace {

std::vector<std::byte> read_all(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(raw.size());
    std::memcpy(out.data(), raw.data(), raw.size());
    return out;
}

void write_all(const fs::path& p, std::span<const std::byte> bytes) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Deterministic tensor contents: byte i of tensor `seed` is a mix of both.
tensor_filler pattern(uint8_t seed) {
    return [seed](std::span<std::byte> out) {
        for (size_t i = 0; i < out.size(); ++i) {
            BOOST_REQUIRE(out[i] == std::byte{0});  // the writer hands out zeroed buffers
            out[i] = std::byte(static_cast<uint8_t>(i * 31 + seed));
        }
    };
}

bool matches_pattern(std::span<const std::byte> data, uint8_t seed) {
    for (size_t i = 0; i < data.size(); ++i)
        if (data[i] != std::byte(static_cast<uint8_t>(i * 31 + seed))) return false;
    return true;
}

// Avoids `"literal" + std::string`, which trips a GCC 12 -Wrestrict false positive.
std::string numbered(std::string prefix, uint64_t n) {
    prefix += std::to_string(n);
    return prefix;
}

value u16v(uint16_t v) { return {value_type::u16, value_type::u8, uint64_t(v)}; }

// Offset of the first occurrence of `needle` in `hay` (asserted present and unique).
size_t find_unique(std::span<const std::byte> hay, std::string_view needle) {
    auto bytes = std::as_bytes(std::span(needle.data(), needle.size()));
    auto it = std::search(hay.begin(), hay.end(), bytes.begin(), bytes.end());
    BOOST_REQUIRE_MESSAGE(it != hay.end(), "marker not found: " << needle);
    auto again = std::search(it + 1, hay.end(), bytes.begin(), bytes.end());
    BOOST_REQUIRE_MESSAGE(again == hay.end(), "marker not unique: " << needle);
    return static_cast<size_t>(it - hay.begin());
}

template <class T>
void poke(std::vector<std::byte>& b, size_t at, T v) {
    BOOST_REQUIRE(at + sizeof(T) <= b.size());
    std::memcpy(b.data() + at, &v, sizeof(T));
}

// A small file used by the corruption tests: alignment 32, three tensors, a few keys.
fs::path write_small(const fs::path& dir) {
    writer w({.alignment = 32, .shards = 1});
    w.set("general.architecture", value::str("tiny"));
    w.set("tiny.block_count", value::u32(2));
    w.set("tiny.vocab", value::str_array(std::vector<std::string>{"a", "bb", "ccc"}));
    w.add_tensor("tok_embd.weight", ggml_type::f32, {4, 3}, pattern(1));
    w.add_tensor("blk.0.ffn_up_exps", ggml_type::q8_0, {32, 2, 3}, pattern(2));
    w.add_tensor("output_norm.weight", ggml_type::f16, {4}, pattern(3));
    auto paths = w.write((dir / "small.gguf").string());
    BOOST_REQUIRE_MESSAGE(paths.ok(), (paths.ok() ? std::string() : paths.message()));
    return dir / "small.gguf";
}

// Offset of the tensor-info fields that follow a tensor's name.
struct info_at {
    size_t n_dims, ne0, type, offset;
};
info_at tensor_fields(std::span<const std::byte> b, std::string_view name, int n_dims) {
    const size_t n = find_unique(b, name) + name.size();
    return {n, n + 4, n + 4 + 8 * size_t(n_dims), n + 4 + 8 * size_t(n_dims) + 4};
}

// Writes `bytes` as a corrupt copy and expects open() to fail mentioning each of `needles`.
void expect_error(const fs::path& dir, const std::string& file, std::span<const std::byte> bytes,
                  std::initializer_list<std::string_view> needles) {
    const auto p = dir / file;
    write_all(p, bytes);
    auto m = model_file::open(p.string());
    BOOST_REQUIRE_MESSAGE(!m.ok(), file << ": expected an error");
    BOOST_TEST_MESSAGE(m.message());
    BOOST_TEST(m.message().find(p.string()) != std::string::npos, m.message());
    for (auto n : needles) BOOST_TEST(m.message().find(n) != std::string::npos, "'" << n << "' in: " << m.message());
    // The in-memory parser agrees.
    BOOST_TEST(!parse(bytes, file).ok());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gguf)

BOOST_AUTO_TEST_CASE(metadata_round_trip_every_type) {
    const auto dir = test::scratch_dir("gguf_metadata");
    std::vector<std::string> many;
    for (int i = 0; i < 100000; ++i) many.push_back(numbered("token_", i));
    const std::vector<kv> expected{
        {"u8", {value_type::u8, value_type::u8, uint64_t(255)}},
        {"i8", {value_type::i8, value_type::u8, int64_t(-128)}},
        {"u16", u16v(65535)},
        {"i16", {value_type::i16, value_type::u8, int64_t(-32768)}},
        {"u32", value::u32(0xffffffffu)},
        {"i32", value::i32(std::numeric_limits<int32_t>::min())},
        {"u64", value::u64(std::numeric_limits<uint64_t>::max())},
        {"i64", value::i64(std::numeric_limits<int64_t>::min())},
        {"f32", value::f32(1.5f)},
        {"f64", value::f64(-2.25e300)},
        {"bool_t", value::boolean(true)},
        {"bool_f", value::boolean(false)},
        {"str", value::str(std::string("h\xc3\xa9llo\0world", 12))},
        {"empty_str", value::str("")},
        {"u32s", value::u32_array(std::vector<uint32_t>{1, 2, 3})},
        {"i32s", value::i32_array(std::vector<int32_t>{-1, 0, 1})},
        {"f32s", value::f32_array(std::vector<float>{0.5f, -1.0f})},
        {"empty_arr", value::array(value_type::i64, {})},
        {"nested", value::array(value_type::array,
                                {value::u32_array(std::vector<uint32_t>{7}),
                                 value::array(value_type::string, {value::str("x"), value::str("yz")}),
                                 value::array(value_type::array, {value::array(value_type::u8, {})})})},
        {"many_strings", value::str_array(many)},
    };
    writer w;
    for (const auto& e : expected) w.set(e.key, e.val);
    w.set("u32", value::u32(0xffffffffu));  // set() replaces, keeping the position
    auto paths = w.write((dir / "m.gguf").string());
    BOOST_REQUIRE(paths.ok());
    BOOST_TEST(paths->size() == 1u);
    BOOST_TEST(!fs::exists(dir / "m.gguf.partial"));

    auto m = model_file::open((dir / "m.gguf").string());
    BOOST_REQUIRE_MESSAGE(m.ok(), (m.ok() ? std::string() : m.message()));
    BOOST_TEST(m->version() == 3u);
    BOOST_TEST(m->tensors().empty());
    BOOST_REQUIRE(m->metadata().size() == expected.size() + 1);  // + general.alignment
    for (size_t i = 0; i < expected.size(); ++i) {
        BOOST_TEST(m->metadata()[i].key == expected[i].key);
        BOOST_TEST((m->metadata()[i].val == expected[i].val), expected[i].key);
    }
    BOOST_TEST(*m->get_u64("general.alignment") == 4096u);
    BOOST_TEST(m->alignment() == 4096u);
    BOOST_TEST(*m->get_i64("i8") == -128);
    BOOST_TEST(*m->get_f64("f32") == 1.5);
    BOOST_TEST(*m->get_bool("bool_t"));
    BOOST_TEST(m->get_string("str")->size() == 12u);
    BOOST_TEST(m->find("many_strings")->as_array()->size() == 100000u);
    BOOST_TEST(m->find("nope") == nullptr);
}

BOOST_AUTO_TEST_CASE(value_conversions_and_getter_errors) {
    BOOST_TEST(!value::i32(-1).as_u64().ok());
    BOOST_TEST(value::i32(-1).as_u64().message().find("negative") != std::string::npos);
    BOOST_TEST(!value::u64(~0ull).as_i64().ok());
    BOOST_TEST(*value::u32(7).as_i64() == 7);
    auto s = value::u32(3).as_string();
    BOOST_REQUIRE(!s.ok());
    BOOST_TEST(s.message() == "expected string, got u32");
    BOOST_TEST(!value::str("1").as_bool().ok());
    BOOST_TEST(value::str("1").as_array() == nullptr);
    BOOST_TEST(value::u32(1).is_integer());
    BOOST_TEST(!value::f32(1).is_integer());
    BOOST_TEST(value::str("a\"b").to_display() == "\"a\\\"b\"");
    BOOST_TEST(value::u32_array(std::vector<uint32_t>{1, 2, 3, 4}).to_display(2) == "[1, 2, ... (4 items)]");
    BOOST_TEST(value_type_name(value_type::boolean) == "bool");

    const auto dir = test::scratch_dir("gguf_getters");
    const auto path = write_small(dir);
    auto m = model_file::open(path.string());
    BOOST_REQUIRE(m.ok());
    auto missing = m->get_u64("tiny.head_count");
    BOOST_REQUIRE(!missing.ok());
    BOOST_TEST(missing.message() == path.string() + ": key 'tiny.head_count' is missing");
    auto wrong = m->get_string("tiny.block_count");
    BOOST_REQUIRE(!wrong.ok());
    BOOST_TEST(wrong.message() == path.string() + ": key 'tiny.block_count': expected string, got u32");
    BOOST_TEST(*m->get_string("general.architecture") == "tiny");
}

BOOST_AUTO_TEST_CASE(tensors_of_several_types) {
    const auto dir = test::scratch_dir("gguf_tensors");
    struct spec {
        std::string name;
        ggml_type type;
        std::vector<int64_t> shape;
        uint64_t bytes;
    };
    const std::vector<spec> specs{
        {"a.f32", ggml_type::f32, {8, 3}, 8 * 3 * 4},
        {"b.f16", ggml_type::f16, {16}, 32},
        {"c.q8_0", ggml_type::q8_0, {64, 2}, 2 * 34 * 2},
        {"d.q4_k", ggml_type::q4_k, {256, 2, 3}, 144 * 2 * 3},
        {"e.bf16", ggml_type::bf16, {5, 1, 1, 2}, 5 * 2 * 2},
        {"f.mxfp4", ggml_type::mxfp4, {32, 4, 5}, 17 * 4 * 5},
        {"g.i32", ggml_type::i32, {3}, 12},
    };
    writer w;
    w.set("general.name", value::str("types"));
    for (size_t i = 0; i < specs.size(); ++i)
        w.add_tensor(specs[i].name, specs[i].type, specs[i].shape, pattern(uint8_t(i)));
    BOOST_REQUIRE(w.write((dir / "t.gguf").string()).ok());

    auto m = model_file::open((dir / "t.gguf").string());
    BOOST_REQUIRE_MESSAGE(m.ok(), (m.ok() ? std::string() : m.message()));
    BOOST_REQUIRE(m->tensors().size() == specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
        const tensor_info* t = m->tensor(specs[i].name);
        BOOST_REQUIRE(t != nullptr);
        BOOST_TEST(t == &m->tensors()[i]);
        BOOST_TEST((t->type == specs[i].type));
        BOOST_TEST(t->n_dims == int(specs[i].shape.size()));
        for (size_t d = 0; d < specs[i].shape.size(); ++d) BOOST_TEST(t->ne[d] == specs[i].shape[d]);
        BOOST_TEST(t->bytes == specs[i].bytes);
        BOOST_TEST(t->file_offset % 4096 == 0u);
        BOOST_TEST(t->offset % 4096 == 0u);
        BOOST_TEST(t->shard == 0u);
        BOOST_TEST(m->data(*t).size() == t->bytes);
        BOOST_TEST(matches_pattern(m->data(*t), uint8_t(i)));
    }
    BOOST_TEST(m->tensor("zzz") == nullptr);
    // Expert slices: experts along ne[2], each ne[0]*ne[1] elements.
    const tensor_info* d = m->tensor("d.q4_k");
    for (int64_t e = 0; e < 3; ++e) {
        auto x = m->expert_slice(*d, e);
        BOOST_TEST(x.shard == 0u);
        BOOST_TEST(x.bytes == 288u);
        BOOST_TEST(x.offset == d->file_offset + uint64_t(e) * 288);
    }
    // The file ends at the last tensor's data, and the padding between tensors is zero.
    BOOST_TEST(m->shard_size(0) == m->tensors().back().file_offset + m->tensors().back().bytes);
    const auto raw = read_all(dir / "t.gguf");
    const auto& a = m->tensors()[0];
    for (size_t i = a.file_offset + a.bytes; i < m->tensors()[1].file_offset; ++i)
        BOOST_REQUIRE(raw[i] == std::byte{0});
}

BOOST_AUTO_TEST_CASE(custom_alignment) {
    const auto dir = test::scratch_dir("gguf_alignment");
    for (uint64_t align : {1ull, 32ull, 64ull, 65536ull}) {
        writer w({.alignment = align});
        w.add_tensor("x", ggml_type::f32, {3}, pattern(1));
        w.add_tensor("y", ggml_type::q8_0, {32}, pattern(2));
        w.add_tensor("z", ggml_type::f16, {7}, pattern(3));
        const auto p = dir / (numbered("a", align) + ".gguf");
        BOOST_REQUIRE(w.write(p.string()).ok());
        auto m = model_file::open(p.string());
        BOOST_REQUIRE_MESSAGE(m.ok(), (m.ok() ? std::string() : m.message()));
        BOOST_TEST(m->alignment() == align);
        BOOST_TEST(*m->get_u64("general.alignment") == align);
        for (const auto& t : m->tensors()) {
            BOOST_TEST(t.file_offset % align == 0u);
            BOOST_TEST(matches_pattern(m->data(t), uint8_t(t.name == "x" ? 1 : t.name == "y" ? 2 : 3)));
        }
    }
}

BOOST_AUTO_TEST_CASE(split_round_trip) {
    const auto dir = test::scratch_dir("gguf_split");
    writer w({.alignment = 256, .shards = 3});
    w.set("general.architecture", value::str("split"));
    const std::vector<std::pair<std::string, int64_t>> tensors{
        {"t0", 1000}, {"t1", 200}, {"t2", 800}, {"t3", 300}, {"t4", 700}, {"t5", 500}, {"t6", 10}};
    for (size_t i = 0; i < tensors.size(); ++i)
        w.add_tensor(tensors[i].first, ggml_type::f32, {tensors[i].second}, pattern(uint8_t(i)));
    auto paths = w.write((dir / "model.gguf").string());
    BOOST_REQUIRE_MESSAGE(paths.ok(), (paths.ok() ? std::string() : paths.message()));
    BOOST_REQUIRE(paths->size() == 3u);
    for (uint32_t s = 0; s < 3; ++s) {
        BOOST_TEST((*paths)[s] == split_path((dir / "model.gguf").string(), s, 3));
        BOOST_TEST(fs::exists((*paths)[s]));
    }
    BOOST_TEST((*paths)[1] == (dir / "model-00002-of-00003.gguf").string());
    BOOST_TEST(!fs::exists(dir / "model.gguf"));

    for (const auto& via : *paths) {  // any shard opens the whole model
        auto m = model_file::open(via);
        BOOST_REQUIRE_MESSAGE(m.ok(), (m.ok() ? std::string() : m.message()));
        BOOST_TEST(m->shard_count() == 3u);
        BOOST_TEST(m->shard_path(0) == (*paths)[0]);
        BOOST_TEST(m->shard_path(2) == (*paths)[2]);
        BOOST_TEST(*m->get_string("general.architecture") == "split");
        BOOST_TEST(*m->get_u64("split.count") == 3u);
        BOOST_TEST(*m->get_i64("split.tensors.count") == 7);
        BOOST_REQUIRE(m->tensors().size() == tensors.size());
        std::vector<uint64_t> per_shard(3);
        uint32_t prev = 0;
        for (size_t i = 0; i < tensors.size(); ++i) {
            const auto& t = m->tensors()[i];
            BOOST_TEST(t.name == tensors[i].first);
            BOOST_TEST(t.shard >= prev);  // in order
            prev = t.shard;
            per_shard[t.shard] += t.bytes;
            BOOST_TEST(t.file_offset % 256 == 0u);
            BOOST_TEST(matches_pattern(m->data(t), uint8_t(i)));
        }
        for (auto b : per_shard) BOOST_TEST(b > 0u);
        // Roughly equal bytes: 14040 total, no shard above half of it.
        for (auto b : per_shard) BOOST_TEST(b < 7020u);
    }
    // Every shard holds the full kv set plus its own split.no.
    for (uint32_t s = 0; s < 3; ++s) {
        auto h = parse(read_all((*paths)[s]), "shard");
        BOOST_REQUIRE(h.ok());
        auto it = std::find_if(h->metadata.begin(), h->metadata.end(), [](const kv& e) { return e.key == "split.no"; });
        BOOST_REQUIRE(it != h->metadata.end());
        BOOST_TEST((it->val.type == value_type::u16));
        BOOST_TEST(*it->val.as_u64() == s);
    }
}

BOOST_AUTO_TEST_CASE(split_errors) {
    const auto dir = test::scratch_dir("gguf_split_errors");
    auto make = [&](const std::string& name) {
        writer w({.alignment = 32, .shards = 3});
        for (int i = 0; i < 4; ++i) w.add_tensor(numbered("t", i), ggml_type::f32, {8}, pattern(uint8_t(i)));
        auto p = w.write((dir / name).string());
        BOOST_REQUIRE(p.ok());
        return p.value();
    };
    // A missing shard is named.
    auto p = make("a.gguf");
    fs::remove(p[2]);
    auto m = model_file::open(p[0]);
    BOOST_REQUIRE(!m.ok());
    BOOST_TEST(m.message().find(p[2]) != std::string::npos, m.message());

    // A shard renamed into another's place disagrees on split.no.
    p = make("b.gguf");
    fs::rename(p[2], p[1]);
    m = model_file::open(p[0]);
    BOOST_REQUIRE(!m.ok());
    BOOST_TEST(m.message().find(p[1]) != std::string::npos, m.message());
    BOOST_TEST(m.message().find("split.no") != std::string::npos, m.message());

    // A shard claiming a different total.
    p = make("c.gguf");
    auto bytes = read_all(p[1]);
    poke<int32_t>(bytes, find_unique(bytes, "split.tensors.count") + 19 + 4, 9);
    write_all(p[1], bytes);
    m = model_file::open(p[2]);
    BOOST_REQUIRE(!m.ok());
    BOOST_TEST(m.message().find("split.tensors.count") != std::string::npos, m.message());

    // A shard renamed to a plain name still says it is one of three.
    p = make("d.gguf");
    fs::rename(p[0], dir / "plain.gguf");
    m = model_file::open((dir / "plain.gguf").string());
    BOOST_REQUIRE(!m.ok());
    BOOST_TEST(m.message().find("split.count") != std::string::npos, m.message());

    // Too few tensors to split.
    writer w({.shards = 4});
    w.add_tensor("only", ggml_type::f32, {1}, pattern(0));
    BOOST_TEST(!w.write((dir / "e.gguf").string()).ok());
}

BOOST_AUTO_TEST_CASE(every_prefix_is_an_error) {
    const auto dir = test::scratch_dir("gguf_prefix");
    const auto path = write_small(dir);
    const auto bytes = read_all(path);
    BOOST_TEST_MESSAGE("small file: " << bytes.size() << " bytes");
    BOOST_REQUIRE(parse(bytes, "small.gguf").ok());
    for (size_t n = 0; n < bytes.size(); ++n) {
        auto r = parse(std::span(bytes).first(n), "small.gguf");
        BOOST_REQUIRE_MESSAGE(!r.ok(), "prefix of " << n << " bytes parsed");
        BOOST_REQUIRE(r.message().starts_with("small.gguf: "));
    }
    // Through files too, on a sample of lengths.
    const auto cut = dir / "cut.gguf";
    for (size_t n = 0; n < bytes.size(); n += 37) {
        write_all(cut, std::span(bytes).first(n));
        auto m = model_file::open(cut.string());
        BOOST_REQUIRE(!m.ok());
        BOOST_TEST(m.message().find(cut.string()) != std::string::npos);
    }
}

BOOST_AUTO_TEST_CASE(header_corruptions) {
    const auto dir = test::scratch_dir("gguf_corrupt_header");
    const auto good = read_all(write_small(dir));

    auto b = good;
    b[0] = std::byte{'X'};
    expect_error(dir, "magic.gguf", b, {"bad magic"});

    for (uint32_t v : {1u, 4u, 0x03000000u}) {  // the last is a big-endian v3
        b = good;
        poke<uint32_t>(b, 4, v);
        expect_error(dir, "version.gguf", b, {"unsupported GGUF version", std::to_string(v)});
    }
    b = good;
    poke<uint32_t>(b, 4, 2);  // v2 is read like v3
    BOOST_TEST(parse(b, "v2").ok());

    b = good;
    poke<uint64_t>(b, 8, uint64_t{1} << 40);
    expect_error(dir, "tensor_count.gguf", b, {"tensor count"});
    b = good;
    poke<uint64_t>(b, 16, ~uint64_t{0});
    expect_error(dir, "kv_count.gguf", b, {"metadata count"});
    b = good;
    poke<uint64_t>(b, 8, 1000);  // plausible but wrong: runs out of bytes somewhere
    expect_error(dir, "tensor_count2.gguf", b, {});

    // Key length beyond the file.
    b = good;
    const size_t key = find_unique(b, "tiny.block_count");
    poke<uint64_t>(b, key - 8, uint64_t{1} << 50);
    expect_error(dir, "keylen.gguf", b, {"key length", "past the end"});

    // Unknown value type, named by key.
    b = good;
    poke<uint32_t>(b, key + 16, 13);
    expect_error(dir, "vtype.gguf", b, {"'tiny.block_count'", "unknown value type 13"});

    // Huge array count and string length inside the array.
    b = good;
    const size_t vocab = find_unique(b, "tiny.vocab") + 10;
    poke<uint64_t>(b, vocab + 4 + 4, uint64_t{1} << 60);
    expect_error(dir, "arrlen.gguf", b, {"'tiny.vocab'", "array of"});
    b = good;
    poke<uint64_t>(b, vocab + 4 + 4 + 8, uint64_t{1} << 33);
    expect_error(dir, "arrstr.gguf", b, {"'tiny.vocab'", "string length"});
    b = good;
    poke<uint32_t>(b, vocab + 4, 99);
    expect_error(dir, "arrtype.gguf", b, {"'tiny.vocab'", "unknown array element type 99"});

    // Duplicate key: a second key renamed to the first (same length, so the layout holds).
    {
        writer w({.alignment = 32});
        w.set("key.aaaa", value::u32(1));
        w.set("key.bbbb", value::u32(2));
        const auto p = dir / "dupkey_src.gguf";
        BOOST_REQUIRE(w.write(p.string()).ok());
        auto d = read_all(p);
        std::memcpy(d.data() + find_unique(d, "key.bbbb"), "key.aaaa", 8);
        expect_error(dir, "dupkey.gguf", d, {"'key.aaaa'", "duplicate key"});
    }

    // general.alignment not a power of two.
    b = good;
    poke<uint32_t>(b, find_unique(b, "general.alignment") + 17 + 4, 48);
    expect_error(dir, "align.gguf", b, {"general.alignment", "power of two"});

    // Deeply nested arrays are refused rather than recursed into.
    {
        value v = value::array(value_type::u8, {});
        for (int i = 0; i < 40; ++i) v = value::array(value_type::array, {v});
        writer w({.alignment = 32});
        w.set("deep", v);
        const auto p = dir / "deep_src.gguf";
        BOOST_REQUIRE(w.write(p.string()).ok());
        expect_error(dir, "deep.gguf", read_all(p), {"'deep'", "nested"});
    }
}

BOOST_AUTO_TEST_CASE(tensor_corruptions) {
    const auto dir = test::scratch_dir("gguf_corrupt_tensors");
    const auto good = read_all(write_small(dir));
    const auto emb = tensor_fields(good, "tok_embd.weight", 2);
    const auto exps = tensor_fields(good, "blk.0.ffn_up_exps", 3);
    const auto norm = tensor_fields(good, "output_norm.weight", 1);

    auto b = good;
    poke<uint32_t>(b, exps.type, 31);
    expect_error(dir, "type31.gguf", b, {"'blk.0.ffn_up_exps'", "unknown tensor type 31"});

    for (uint32_t n : {0u, 5u, 0xffffffffu}) {
        b = good;
        poke<uint32_t>(b, emb.n_dims, n);
        expect_error(dir, "ndims.gguf", b, {"'tok_embd.weight'", "n_dims"});
    }
    b = good;
    poke<uint64_t>(b, emb.ne0 + 8, 0);
    expect_error(dir, "ne0.gguf", b, {"'tok_embd.weight'", "ne[1]=0"});
    b = good;
    poke<uint64_t>(b, emb.ne0, ~uint64_t{0});
    expect_error(dir, "neneg.gguf", b, {"'tok_embd.weight'", "not a positive size"});
    b = good;
    poke<uint64_t>(b, exps.ne0 + 8, uint64_t{1} << 40);
    poke<uint64_t>(b, exps.ne0 + 16, uint64_t{1} << 40);
    expect_error(dir, "overflow.gguf", b, {"'blk.0.ffn_up_exps'", "overflows"});
    b = good;
    poke<uint64_t>(b, exps.ne0, 33);
    expect_error(dir, "block.gguf", b, {"'blk.0.ffn_up_exps'", "block size 32"});

    // Duplicate tensor name: a second tensor renamed to the first (same length).
    {
        writer w({.alignment = 32});
        w.add_tensor("aa", ggml_type::f32, {2}, pattern(0));
        w.add_tensor("bb", ggml_type::f32, {2}, pattern(1));
        const auto p = dir / "dup_src.gguf";
        BOOST_REQUIRE(w.write(p.string()).ok());
        auto d = read_all(p);
        std::memcpy(d.data() + find_unique(d, "bb"), "aa", 2);
        expect_error(dir, "dupname.gguf", d, {"'aa'", "duplicate tensor name"});
    }

    // Misaligned, out of range and overlapping offsets.
    b = good;
    poke<uint64_t>(b, norm.offset, 8);
    expect_error(dir, "misaligned.gguf", b, {"'output_norm.weight'", "misaligned"});
    b = good;
    poke<uint64_t>(b, norm.offset, uint64_t{1} << 20);
    expect_error(dir, "range.gguf", b, {"'output_norm.weight'", "out of the file range"});
    b = good;
    poke<uint64_t>(b, norm.offset, ~uint64_t{0} / 32 * 32);  // offset + data start overflows
    expect_error(dir, "range2.gguf", b, {"'output_norm.weight'", "out of the file range"});
    b = good;
    uint64_t exps_offset;
    std::memcpy(&exps_offset, good.data() + exps.offset, 8);
    poke<uint64_t>(b, norm.offset, exps_offset + 32);  // inside the expert tensor's 204 bytes
    expect_error(dir, "overlap.gguf", b, {"'blk.0.ffn_up_exps' overlaps tensor 'output_norm.weight'"});
    b = good;
    poke<uint64_t>(b, emb.offset, exps_offset);  // same start
    expect_error(dir, "overlap2.gguf", b, {"overlaps", "'tok_embd.weight'", "'blk.0.ffn_up_exps'"});
}

BOOST_AUTO_TEST_CASE(open_errors_and_failed_writes) {
    const auto dir = test::scratch_dir("gguf_open_errors");
    auto m = model_file::open((dir / "absent.gguf").string());
    BOOST_REQUIRE(!m.ok());
    BOOST_TEST(m.message().find("absent.gguf: cannot open") != std::string::npos, m.message());
    m = model_file::open(dir.string());
    BOOST_REQUIRE(!m.ok());
    BOOST_TEST(m.message().find("not a regular file") != std::string::npos, m.message());

    // A writer that cannot create its file reports it; nothing is left behind.
    writer w;
    w.add_tensor("t", ggml_type::f32, {4}, pattern(0));
    auto r = w.write((dir / "no_such_dir" / "x.gguf").string());
    BOOST_REQUIRE(!r.ok());
    BOOST_TEST(r.message().find("x.gguf.partial: cannot create") != std::string::npos, r.message());

    // A filler that throws leaves no partial file.
    writer w2({.shards = 2});
    w2.add_tensor("a", ggml_type::f32, {4}, pattern(0));
    w2.add_tensor("b", ggml_type::f32, {4}, [](std::span<std::byte>) { throw std::runtime_error("boom"); });
    BOOST_CHECK_THROW((void)w2.write((dir / "y.gguf").string()), std::runtime_error);
    BOOST_TEST(fs::is_empty(dir));
}

BOOST_AUTO_TEST_SUITE_END()
