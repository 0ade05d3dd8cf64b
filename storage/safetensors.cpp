#include "storage/safetensors.h"

#include <simdjson.h>

#include <algorithm>
#include <cstring>
#include <optional>

namespace moestream::safetensors {
namespace {

struct dtype_entry {
    dtype type;
    std::string_view name;
    int bits;
};
// Names as the safetensors format spells them; U8 appears for e8m0 scales in some exports.
constexpr dtype_entry kDtypes[] = {
    {dtype::f64, "F64", 64},         {dtype::f32, "F32", 32},         {dtype::f16, "F16", 16},
    {dtype::bf16, "BF16", 16},       {dtype::i64, "I64", 64},         {dtype::i32, "I32", 32},
    {dtype::i16, "I16", 16},         {dtype::i8, "I8", 8},            {dtype::u8, "U8", 8},
    {dtype::boolean, "BOOL", 8},     {dtype::f8_e4m3, "F8_E4M3", 8},  {dtype::f8_e5m2, "F8_E5M2", 8},
    {dtype::f8_e8m0, "F8_E8M0", 8},  {dtype::f4, "F4", 4},
};

std::optional<dtype> parse_dtype(std::string_view s) {
    for (const auto& e : kDtypes)
        if (e.name == s) return e.type;
    return std::nullopt;
}

// Safetensors headers are capped at 100 MB by the reference implementation; a larger length is
// a corrupt file, not a big one.
constexpr uint64_t kMaxHeader = 100ull << 20;

result<tensor> parse_entry(std::string_view fname, std::string_view name, simdjson::dom::element el,
                           uint64_t data_start, uint64_t data_size) {
    auto bad = [&](const std::string& what) {
        return make_error(std::string(fname) + ": tensor '" + std::string(name) + "': " + what);
    };
    simdjson::dom::object obj;
    if (el.get(obj) != simdjson::SUCCESS) return bad("header entry is not an object");
    std::string_view dt;
    if (obj["dtype"].get(dt) != simdjson::SUCCESS) return bad("missing or non-string 'dtype'");
    auto type = parse_dtype(dt);
    if (!type) return bad("unknown dtype '" + std::string(dt) + "'");
    tensor t;
    t.name = std::string(name);
    t.type = *type;
    simdjson::dom::array shape;
    if (obj["shape"].get(shape) != simdjson::SUCCESS) return bad("missing or non-array 'shape'");
    for (auto d : shape) {
        int64_t v = 0;
        if (d.get(v) != simdjson::SUCCESS || v < 0) return bad("shape entries must be non-negative integers");
        t.shape.push_back(v);
    }
    simdjson::dom::array offs;
    if (obj["data_offsets"].get(offs) != simdjson::SUCCESS || offs.size() != 2)
        return bad("'data_offsets' must be [begin, end]");
    uint64_t begin = 0, end = 0;
    if (offs.at(0).get(begin) != simdjson::SUCCESS || offs.at(1).get(end) != simdjson::SUCCESS)
        return bad("'data_offsets' must be non-negative integers");
    if (begin > end || end > data_size)
        return bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   ") out of range (data section holds " + std::to_string(data_size) + " bytes; truncated file?)");
    const int64_t n = t.elements();
    const int bits = dtype_bits(t.type);
    if ((n * bits) % 8) return bad("odd element count " + std::to_string(n) + " for a 4-bit dtype");
    const uint64_t expect = uint64_t(n) * uint64_t(bits) / 8;
    if (end - begin != expect)
        return bad("holds " + std::to_string(end - begin) + " bytes but its shape and dtype need " +
                   std::to_string(expect));
    t.offset = data_start + begin;
    t.bytes = end - begin;
    return t;
}

}  // namespace

std::string_view dtype_name(dtype t) {
    for (const auto& e : kDtypes)
        if (e.type == t) return e.name;
    MS_ASSERT_MSG(false, "unknown safetensors dtype");
    return {};
}

int dtype_bits(dtype t) {
    for (const auto& e : kDtypes)
        if (e.type == t) return e.bits;
    MS_ASSERT_MSG(false, "unknown safetensors dtype");
    return 0;
}

int64_t tensor::elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

result<file> file::open(const std::string& path) {
    auto map = storage::mapped_file::open(path);
    if (!map) return map.err();
    const auto bytes = map->bytes();
    auto bad = [&](const std::string& what) { return make_error(path + ": " + what); };
    if (bytes.size() < 8) return bad("truncated: " + std::to_string(bytes.size()) + " bytes, no header length");
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes.data(), 8);  // little-endian hosts only (x86-64, aarch64)
    if (header_len > kMaxHeader) return bad("header length " + std::to_string(header_len) + " is implausible");
    if (header_len > bytes.size() - 8)
        return bad("truncated: header of " + std::to_string(header_len) + " bytes but the file holds " +
                   std::to_string(bytes.size()));
    const uint64_t data_start = 8 + header_len;
    const uint64_t data_size = bytes.size() - data_start;

    simdjson::dom::parser parser;
    simdjson::padded_string json(reinterpret_cast<const char*>(bytes.data()) + 8, size_t(header_len));
    simdjson::dom::object root;
    if (parser.parse(json).get(root) != simdjson::SUCCESS) return bad("header is not a JSON object");

    file f;
    for (auto [key, val] : root) {
        if (key == "__metadata__") {
            simdjson::dom::object md;
            if (val.get(md) != simdjson::SUCCESS) return bad("__metadata__ is not an object");
            for (auto [mk, mv] : md) {
                std::string_view s;
                if (mv.get(s) != simdjson::SUCCESS) return bad("__metadata__ value '" + std::string(mk) + "' is not a string");
                f.metadata_[std::string(mk)] = std::string(s);
            }
            continue;
        }
        auto t = parse_entry(path, key, val, data_start, data_size);
        if (!t) return t.err();
        if (f.index_.count(t->name)) return bad("tensor '" + t->name + "' appears twice");
        f.index_.emplace(t->name, f.tensors_.size());
        f.tensors_.push_back(std::move(*t));
    }
    // Overlap check on the sorted ranges (empty tensors overlap nothing).
    std::vector<const tensor*> order;
    for (const auto& t : f.tensors_)
        if (t.bytes) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < order.size(); ++i)
        if (order[i]->offset < order[i - 1]->offset + order[i - 1]->bytes)
            return bad("tensors '" + order[i - 1]->name + "' and '" + order[i]->name + "' overlap");
    f.map_ = std::move(*map);
    return f;
}

const tensor* file::find(std::string_view name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> file::data(const tensor& t) const {
    MS_ASSERT(t.offset + t.bytes <= map_.size());
    return map_.bytes().subspan(t.offset, t.bytes);
}

}  // namespace moestream::safetensors
