// GGUF parsing (in memory, fully bounds-checked) and model_file (mapped, split-aware).
//
// The parser treats its input as hostile: every read is checked against the end of the image,
// every count is bounded by the bytes left so a forged header cannot make us allocate more than
// a small multiple of the file size, and all size arithmetic is overflow-checked.
#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <limits>
#include <map>
#include <unordered_set>

#include "storage/gguf.h"
#include "storage/mapped_file.h"

namespace moestream::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF fields are copied as host integers");

constexpr int kMaxArrayDepth = 16;  // nesting beyond this is hostile (and would recurse deeply)
constexpr uint64_t kMaxAlignment = uint64_t{1} << 31;  // general.alignment is a u32
// Smallest possible encodings, used to bound forged counts by the bytes that remain.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;               // key length, type, one-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name length, n_dims, ne, type, offset

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

// Size of the smallest encoding of one element of type t (0 for unknown types).
uint64_t min_encoded_size(value_type t) {
    switch (t) {
        case value_type::u8: case value_type::i8: case value_type::boolean: return 1;
        case value_type::u16: case value_type::i16: return 2;
        case value_type::u32: case value_type::i32: case value_type::f32: return 4;
        case value_type::u64: case value_type::i64: case value_type::f64: return 8;
        case value_type::string: return 8;
        case value_type::array: return 12;
    }
    return 0;
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(value_type::f64); }

// Little-endian cursor over the image. Errors carry the file name, the offset and what was
// being read; `context_` names the key or tensor being decoded.
class cursor {
public:
    cursor(std::span<const std::byte> bytes, std::string_view name) : bytes_(bytes), name_(name) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return bytes_.size() - pos_; }
    void set_context(std::string ctx) { context_ = std::move(ctx); }

    error fail(const std::string& msg) const {
        return make_error(std::string(name_) + ": " + (context_.empty() ? "" : context_ + ": ") + msg);
    }

    template <class T>
    result<T> read(const char* what) {
        static_assert(std::is_trivially_copyable_v<T>);
        if (remaining() < sizeof(T)) return truncated(sizeof(T), what);
        T v;
        std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;  // GGUF is little-endian, as are all hosts we build for
    }

    result<std::string> read_string(const char* what) {
        auto len = read<uint64_t>(what);
        if (!len) return len.err();
        if (*len > remaining())
            return fail(std::string(what) + " length " + std::to_string(*len) + " at offset " +
                        std::to_string(pos_ - 8) + " runs past the end of the file (" +
                        std::to_string(remaining()) + " bytes left)");
        std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(*len));
        pos_ += *len;
        return s;
    }

private:
    error truncated(uint64_t need, const char* what) const {
        return fail("truncated: " + std::string(what) + " needs " + std::to_string(need) +
                    " bytes at offset " + std::to_string(pos_) + " but the file is " +
                    std::to_string(bytes_.size()) + " bytes");
    }

    std::span<const std::byte> bytes_;
    std::string_view name_;
    std::string context_;
    uint64_t pos_ = 0;
};

result<value> read_value(cursor& c, value_type t, int depth);

result<value> read_array(cursor& c, int depth) {
    if (depth >= kMaxArrayDepth)
        return c.fail("arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
    auto elem = c.read<uint32_t>("array element type");
    if (!elem) return elem.err();
    if (!known_value_type(*elem)) return c.fail("unknown array element type " + std::to_string(*elem));
    const auto et = static_cast<value_type>(*elem);
    auto count = c.read<uint64_t>("array length");
    if (!count) return count.err();
    if (*count > c.remaining() / min_encoded_size(et))
        return c.fail("array of " + std::to_string(*count) + " " + std::string(value_type_name(et)) +
                      " items cannot fit in the " + std::to_string(c.remaining()) + " bytes left");
    std::vector<value> items;
    items.reserve(static_cast<size_t>(*count));
    for (uint64_t i = 0; i < *count; ++i) {
        auto v = read_value(c, et, depth + 1);
        if (!v) return v.err();
        items.push_back(std::move(v).value());
    }
    return value::array(et, std::move(items));
}

template <class T, class Wide>
result<value> read_scalar(cursor& c, value_type t) {
    auto v = c.read<T>(value_type_name(t).data());
    if (!v) return v.err();
    return value{t, value_type::u8, Wide(*v)};
}

result<value> read_value(cursor& c, value_type t, int depth) {
    switch (t) {
        case value_type::u8: return read_scalar<uint8_t, uint64_t>(c, t);
        case value_type::i8: return read_scalar<int8_t, int64_t>(c, t);
        case value_type::u16: return read_scalar<uint16_t, uint64_t>(c, t);
        case value_type::i16: return read_scalar<int16_t, int64_t>(c, t);
        case value_type::u32: return read_scalar<uint32_t, uint64_t>(c, t);
        case value_type::i32: return read_scalar<int32_t, int64_t>(c, t);
        case value_type::u64: return read_scalar<uint64_t, uint64_t>(c, t);
        case value_type::i64: return read_scalar<int64_t, int64_t>(c, t);
        case value_type::f32: return read_scalar<float, double>(c, t);
        case value_type::f64: return read_scalar<double, double>(c, t);
        case value_type::boolean: {
            auto b = c.read<uint8_t>("bool");
            if (!b) return b.err();
            return value::boolean(*b != 0);
        }
        case value_type::string: {
            auto s = c.read_string("string");
            if (!s) return s.err();
            return value::str(std::move(s).value());
        }
        case value_type::array: return read_array(c, depth);
    }
    return c.fail("unknown value type " + std::to_string(static_cast<uint32_t>(t)));
}

result<void> read_metadata(cursor& c, uint64_t kv_count, parsed_header& h) {
    std::unordered_set<std::string> seen;
    h.metadata.reserve(static_cast<size_t>(kv_count));
    for (uint64_t i = 0; i < kv_count; ++i) {
        c.set_context("metadata entry " + std::to_string(i));
        auto key = c.read_string("key");
        if (!key) return key.err();
        c.set_context("key " + quoted(*key));
        if (!seen.insert(*key).second) return c.fail("duplicate key");
        auto type = c.read<uint32_t>("value type");
        if (!type) return type.err();
        if (!known_value_type(*type)) return c.fail("unknown value type " + std::to_string(*type));
        auto v = read_value(c, static_cast<value_type>(*type), 0);
        if (!v) return v.err();
        h.metadata.push_back({std::move(key).value(), std::move(v).value()});
    }
    c.set_context("");
    return {};
}

result<void> read_alignment(cursor& c, parsed_header& h) {
    for (const auto& e : h.metadata) {
        if (e.key != "general.alignment") continue;
        c.set_context("key 'general.alignment'");
        auto a = e.val.as_u64();
        if (!a) return c.fail(a.message());
        if (*a == 0 || !std::has_single_bit(*a) || *a > kMaxAlignment)
            return c.fail("alignment " + std::to_string(*a) + " is not a power of two in [1, 2^31]");
        h.alignment = *a;
        c.set_context("");
    }
    return {};
}

// Bytes of a tensor of `type` and shape `ne`, or an error on overflow.
result<uint64_t> tensor_bytes(cursor& c, const dtype_traits& dt, const std::array<int64_t, kMaxDims>& ne) {
    if (ne[0] % dt.block_elems != 0)
        return c.fail("ne[0]=" + std::to_string(ne[0]) + " is not a multiple of the " + std::string(dt.name) +
                      " block size " + std::to_string(dt.block_elems));
    int64_t elements = 1;
    int64_t bytes = 0;
    if (__builtin_mul_overflow(ne[0] / dt.block_elems, dt.block_bytes, &bytes))
        return c.fail("tensor size overflows");
    for (int d = 0; d < kMaxDims; ++d) {
        if (__builtin_mul_overflow(elements, ne[d], &elements) ||
            (d > 0 && __builtin_mul_overflow(bytes, ne[d], &bytes)))
            return c.fail("element count overflows");
    }
    return static_cast<uint64_t>(bytes);
}

result<tensor_info> read_tensor_info(cursor& c, uint64_t index) {
    c.set_context("tensor " + std::to_string(index));
    tensor_info t;
    auto name = c.read_string("tensor name");
    if (!name) return name.err();
    t.name = std::move(name).value();
    c.set_context("tensor " + quoted(t.name));
    auto n_dims = c.read<uint32_t>("n_dims");
    if (!n_dims) return n_dims.err();
    if (*n_dims < 1 || *n_dims > static_cast<uint32_t>(kMaxDims))
        return c.fail("n_dims " + std::to_string(*n_dims) + " is outside 1.." + std::to_string(kMaxDims));
    t.n_dims = static_cast<int>(*n_dims);
    for (int d = 0; d < t.n_dims; ++d) {
        auto ne = c.read<uint64_t>("ne");
        if (!ne) return ne.err();
        if (*ne == 0 || *ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            return c.fail("ne[" + std::to_string(d) + "]=" + std::to_string(*ne) + " is not a positive size");
        t.ne[d] = static_cast<int64_t>(*ne);
    }
    auto type = c.read<uint32_t>("tensor type");
    if (!type) return type.err();
    const auto dt = dtype_info(*type);
    if (!dt) return c.fail("unknown tensor type " + std::to_string(*type));
    t.type = dt->type;
    auto bytes = tensor_bytes(c, *dt, t.ne);
    if (!bytes) return bytes.err();
    t.bytes = *bytes;
    auto offset = c.read<uint64_t>("tensor data offset");
    if (!offset) return offset.err();
    t.offset = *offset;
    return t;
}

result<void> read_tensor_infos(cursor& c, uint64_t tensor_count, parsed_header& h) {
    std::unordered_set<std::string> seen;
    h.tensors.reserve(static_cast<size_t>(tensor_count));
    for (uint64_t i = 0; i < tensor_count; ++i) {
        auto t = read_tensor_info(c, i);
        if (!t) return t.err();
        if (!seen.insert(t->name).second) return c.fail("duplicate tensor name");
        h.tensors.push_back(std::move(t).value());
    }
    c.set_context("");
    return {};
}

// Places every tensor in the data section: aligned, inside the file, not overlapping.
result<void> place_tensors(cursor& c, uint64_t file_size, parsed_header& h) {
    const uint64_t header_end = c.pos();
    if (header_end > std::numeric_limits<uint64_t>::max() - (h.alignment - 1))
        return c.fail("header too large");
    h.data_offset = (header_end + h.alignment - 1) / h.alignment * h.alignment;
    for (auto& t : h.tensors) {
        c.set_context("tensor " + quoted(t.name));
        if (t.offset % h.alignment != 0)
            return c.fail("data offset " + std::to_string(t.offset) + " is misaligned (alignment " +
                          std::to_string(h.alignment) + ")");
        uint64_t end = 0;
        if (__builtin_add_overflow(h.data_offset, t.offset, &t.file_offset) ||
            __builtin_add_overflow(t.file_offset, t.bytes, &end) || end > file_size)
            return c.fail("data [" + std::to_string(t.offset) + ", +" + std::to_string(t.bytes) +
                          ") relative to the data section at " + std::to_string(h.data_offset) +
                          " is out of the file range (" + std::to_string(file_size) + " bytes)");
    }
    c.set_context("");
    std::vector<const tensor_info*> by_offset;
    by_offset.reserve(h.tensors.size());
    for (const auto& t : h.tensors) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const tensor_info* a, const tensor_info* b) { return a->file_offset < b->file_offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
        const auto* a = by_offset[i - 1];
        const auto* b = by_offset[i];
        if (a->file_offset + a->bytes > b->file_offset)
            return c.fail("tensor " + quoted(a->name) + " overlaps tensor " + quoted(b->name));
    }
    return {};
}

}  // namespace

result<parsed_header> parse(std::span<const std::byte> bytes, std::string_view name) {
    cursor c(bytes, name);
    parsed_header h;
    auto magic = c.read<uint32_t>("magic");
    if (!magic) return magic.err();
    if (*magic != kMagic) return c.fail("not a GGUF file (bad magic)");
    auto version = c.read<uint32_t>("version");
    if (!version) return version.err();
    // v3 only added big-endian files (whose version reads byte-swapped here), so v2 reads the same.
    if (*version != 3 && *version != 2) {
        const bool big_endian = __builtin_bswap32(*version) == 3 || __builtin_bswap32(*version) == 2;
        return c.fail("unsupported GGUF version " + std::to_string(*version) + " (expected 3)" +
                      (big_endian ? "; this looks like a big-endian GGUF file, which is not supported" : ""));
    }
    h.version = *version;
    auto tensor_count = c.read<uint64_t>("tensor count");
    if (!tensor_count) return tensor_count.err();
    auto kv_count = c.read<uint64_t>("metadata count");
    if (!kv_count) return kv_count.err();
    if (*tensor_count > c.remaining() / kMinTensorInfoBytes)
        return c.fail("tensor count " + std::to_string(*tensor_count) + " cannot fit in the file");
    if (*kv_count > (c.remaining() - *tensor_count * kMinTensorInfoBytes) / kMinKvBytes)
        return c.fail("metadata count " + std::to_string(*kv_count) + " cannot fit in the file");
    MS_TRY(read_metadata(c, *kv_count, h));
    MS_TRY(read_alignment(c, h));
    MS_TRY(read_tensor_infos(c, *tensor_count, h));
    MS_TRY(place_tensors(c, bytes.size(), h));
    return h;
}

// ---------------------------------------------------------------------------------------------
// model_file

namespace {

struct shard_state {
    std::string path;
    storage::mapped_file map;
    parsed_header header;
};

// Recognises "<base>-00002-of-00003.gguf": returns the single-file path "<base>.gguf", the
// 0-based shard and the count.
struct split_name {
    std::string single_path;
    uint32_t shard = 0;
    uint32_t count = 0;
};

std::optional<split_name> parse_split_name(const std::string& path) {
    constexpr std::string_view kSuffix = ".gguf";
    constexpr size_t kTail = 1 + 5 + 4 + 5;  // "-00002-of-00003"
    if (path.size() < kTail + kSuffix.size() || !path.ends_with(kSuffix)) return std::nullopt;
    const std::string_view tail = std::string_view(path).substr(path.size() - kSuffix.size() - kTail, kTail);
    if (tail[0] != '-' || tail.substr(6, 4) != "-of-") return std::nullopt;
    auto number = [](std::string_view digits) -> std::optional<uint32_t> {
        uint32_t v = 0;
        if (!std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
            return std::nullopt;
        std::from_chars(digits.data(), digits.data() + digits.size(), v);
        return v;
    };
    auto k = number(tail.substr(1, 5));
    auto n = number(tail.substr(10, 5));
    if (!k || !n || *k < 1 || *n < 1 || *k > *n) return std::nullopt;
    return split_name{path.substr(0, path.size() - kSuffix.size() - kTail) + std::string(kSuffix), *k - 1, *n};
}

const value* find_in(const std::vector<kv>& md, std::string_view key) {
    for (const auto& e : md)
        if (e.key == key) return &e.val;
    return nullptr;
}

result<shard_state> open_shard(const std::string& path) {
    auto map = storage::mapped_file::open(path);
    if (!map) return map.err();
    auto header = parse(map->bytes(), path);
    if (!header) return header.err();
    return shard_state{path, std::move(map).value(), std::move(header).value()};
}

// Integer split.* key of a shard, or nullopt when absent.
result<std::optional<uint64_t>> split_key(const shard_state& s, std::string_view key) {
    const value* v = find_in(s.header.metadata, key);
    if (v == nullptr) return std::optional<uint64_t>{};
    auto u = v->as_u64();
    if (!u) return make_error(s.path + ": key " + quoted(key) + ": " + u.message());
    return std::optional<uint64_t>{*u};
}

// Checks that shard `index` of `count` says so and agrees on the total tensor count.
result<uint64_t> check_shard(const shard_state& s, uint32_t index, uint32_t count) {
    auto no = split_key(s, "split.no");
    if (!no) return no.err();
    auto n = split_key(s, "split.count");
    if (!n) return n.err();
    auto total = split_key(s, "split.tensors.count");
    if (!total) return total.err();
    if (!*no || !*n || !*total)
        return make_error(s.path + ": shard of a split model lacks split.no, split.count or split.tensors.count");
    if (**n != count)
        return make_error(s.path + ": split.count is " + std::to_string(**n) + " but the name says " +
                          std::to_string(count) + " shards");
    if (**no != index)
        return make_error(s.path + ": split.no is " + std::to_string(**no) + " but the name says shard " +
                          std::to_string(index) + " (0-based)");
    return **total;
}

}  // namespace

struct model_file::impl {
    std::vector<shard_state> shards;
    std::vector<tensor_info> tensors;
    std::map<std::string, size_t, std::less<>> by_name;

    const std::string& name() const { return shards.front().path; }
    const std::vector<kv>& metadata() const { return shards.front().header.metadata; }

    result<const value*> require(std::string_view key) const {
        const value* v = find_in(metadata(), key);
        if (v == nullptr) return make_error(name() + ": key " + quoted(key) + " is missing");
        return v;
    }
    template <class T>
    result<T> get(std::string_view key, result<T> (value::*conv)() const) const {
        auto v = require(key);
        if (!v) return v.err();
        auto r = ((**v).*conv)();
        if (!r) return make_error(name() + ": key " + quoted(key) + ": " + r.message());
        return r;
    }

    // Collects every shard's tensors, tagging each with its shard and rejecting duplicate names.
    result<void> index_tensors() {
        for (uint32_t s = 0; s < shards.size(); ++s) {
            for (auto t : shards[s].header.tensors) {
                t.shard = s;
                if (!by_name.emplace(t.name, tensors.size()).second)
                    return make_error(shards[s].path + ": tensor " + quoted(t.name) +
                                      " also appears in an earlier shard");
                tensors.push_back(std::move(t));
            }
        }
        return {};
    }
};

result<model_file> model_file::open(const std::string& path) {
    auto p = std::make_unique<impl>();
    auto first = open_shard(path);
    if (!first) return first.err();
    auto declared = split_key(*first, "split.count");
    if (!declared) return declared.err();
    const auto split = parse_split_name(path);
    if (!split || (split->count == 1 && !*declared)) {
        // A single file. One that claims to be part of a split model but is not named like one
        // would silently lose tensors, so it is an error.
        if (*declared && **declared > 1)
            return make_error(path + ": split.count is " + std::to_string(**declared) +
                              " but the name does not follow <name>-0000K-of-0000N.gguf");
        p->shards.push_back(std::move(first).value());
    } else {
        uint64_t total = 0;
        for (uint32_t s = 0; s < split->count; ++s) {
            result<shard_state> shard =
                s == split->shard ? std::move(first) : open_shard(split_path(split->single_path, s, split->count));
            if (!shard) return shard.err();
            auto t = check_shard(*shard, s, split->count);
            if (!t) return t.err();
            if (s > 0 && *t != total)
                return make_error(shard->path + ": split.tensors.count is " + std::to_string(*t) + " but shard 1 says " +
                                  std::to_string(total));
            total = *t;
            p->shards.push_back(std::move(shard).value());
        }
        uint64_t found = 0;
        for (const auto& s : p->shards) found += s.header.tensors.size();
        if (found != total)
            return make_error(p->name() + ": split.tensors.count is " + std::to_string(total) + " but the " +
                              std::to_string(split->count) + " shards hold " + std::to_string(found) + " tensors");
    }
    MS_TRY(p->index_tensors());
    return model_file(std::move(p));
}

model_file::model_file(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
model_file::model_file(model_file&&) noexcept = default;
model_file& model_file::operator=(model_file&&) noexcept = default;
model_file::~model_file() = default;

uint32_t model_file::version() const { return impl_->shards.front().header.version; }
uint64_t model_file::alignment() const { return impl_->shards.front().header.alignment; }
const std::vector<kv>& model_file::metadata() const { return impl_->metadata(); }
const value* model_file::find(std::string_view key) const { return find_in(impl_->metadata(), key); }

result<uint64_t> model_file::get_u64(std::string_view key) const { return impl_->get(key, &value::as_u64); }
result<int64_t> model_file::get_i64(std::string_view key) const { return impl_->get(key, &value::as_i64); }
result<double> model_file::get_f64(std::string_view key) const { return impl_->get(key, &value::as_f64); }
result<bool> model_file::get_bool(std::string_view key) const { return impl_->get(key, &value::as_bool); }
result<std::string> model_file::get_string(std::string_view key) const {
    return impl_->get(key, &value::as_string);
}

const std::vector<tensor_info>& model_file::tensors() const { return impl_->tensors; }

const tensor_info* model_file::tensor(std::string_view name) const {
    auto it = impl_->by_name.find(name);
    return it == impl_->by_name.end() ? nullptr : &impl_->tensors[it->second];
}

std::span<const std::byte> model_file::data(const tensor_info& t) const {
    MS_ASSERT(t.shard < impl_->shards.size());
    const auto bytes = impl_->shards[t.shard].map.bytes();
    MS_ASSERT_MSG(t.file_offset <= bytes.size() && t.bytes <= bytes.size() - t.file_offset,
                  "tensor_info does not belong to this model_file");
    return bytes.subspan(t.file_offset, t.bytes);
}

file_extent model_file::expert_slice(const tensor_info& t, int64_t expert) const {
    // ne[3] must be 1: experts are the outermost dimension. A 2-D tensor is one expert (ggml
    // drops trailing dimensions of size 1 when it writes n_dims).
    MS_ASSERT(t.shard < impl_->shards.size());
    MS_ASSERT(t.ne[3] == 1);
    MS_ASSERT_MSG(expert >= 0 && expert < t.ne[2], "expert index out of range");
    const uint64_t slice = t.bytes / static_cast<uint64_t>(t.ne[2]);
    return {t.shard, t.file_offset + static_cast<uint64_t>(expert) * slice, slice};
}

size_t model_file::shard_count() const { return impl_->shards.size(); }

const std::string& model_file::shard_path(uint32_t shard) const {
    MS_ASSERT(shard < impl_->shards.size());
    return impl_->shards[shard].path;
}

uint64_t model_file::shard_size(uint32_t shard) const {
    MS_ASSERT(shard < impl_->shards.size());
    return impl_->shards[shard].map.size();
}

}  // namespace moestream::gguf
