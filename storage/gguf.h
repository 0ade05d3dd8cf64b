// GGUF v3 model files: reading (with split models) and writing (aligned, sharded).
//
// Dense tensors are memory-mapped; expert tensors (3-D, experts along ne[2]) are addressed as
// (shard, absolute file offset, bytes) per expert slice so the streaming tier can read them
// with O_DIRECT instead of touching the mapping.
//
// Thread safety: a model_file is immutable after open(); concurrent const access is safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config/dtype.h"
#include "config/result.h"

namespace moestream::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
inline constexpr uint32_t kVersion = 3;
inline constexpr uint64_t kDefaultAlignment = 32;  // GGUF's default when general.alignment is absent
inline constexpr int kMaxDims = 4;

enum class value_type : uint32_t {
    u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
    string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};
std::string_view value_type_name(value_type t);

// One metadata value. Integers keep their GGUF type in `type` but are stored widened.
struct value {
    value_type type = value_type::u8;
    value_type array_type = value_type::u8;  // element type when type == array
    std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<value>> data;

    static value u32(uint32_t v) { return {value_type::u32, value_type::u8, uint64_t(v)}; }
    static value u64(uint64_t v) { return {value_type::u64, value_type::u8, v}; }
    static value i32(int32_t v) { return {value_type::i32, value_type::u8, int64_t(v)}; }
    static value i64(int64_t v) { return {value_type::i64, value_type::u8, v}; }
    static value f32(float v) { return {value_type::f32, value_type::u8, double(v)}; }
    static value f64(double v) { return {value_type::f64, value_type::u8, v}; }
    static value boolean(bool v) { return {value_type::boolean, value_type::u8, v}; }
    static value str(std::string v) { return {value_type::string, value_type::u8, std::move(v)}; }
    static value array(value_type elem, std::vector<value> items) {
        return {value_type::array, elem, std::move(items)};
    }
    static value u32_array(std::span<const uint32_t> v);
    static value i32_array(std::span<const int32_t> v);
    static value f32_array(std::span<const float> v);
    static value str_array(std::span<const std::string> v);

    bool is_integer() const;
    // Checked conversions: an error names the expected and actual type (and range problems).
    result<uint64_t> as_u64() const;
    result<int64_t> as_i64() const;
    result<double> as_f64() const;
    result<bool> as_bool() const;
    result<std::string> as_string() const;
    const std::vector<value>* as_array() const;  // nullptr unless an array
    std::string to_display(size_t max_items = 8) const;  // for `inspect`

    friend bool operator==(const value&, const value&) = default;
};

struct kv {
    std::string key;
    value val;
};

struct tensor_info {
    std::string name;
    int n_dims = 0;
    std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // ggml order: ne[0] is the fastest dimension
    ggml_type type = ggml_type::f32;
    uint32_t shard = 0;         // which file of a split model
    uint64_t offset = 0;        // relative to that file's data section (as stored in the file)
    uint64_t file_offset = 0;   // absolute offset in that file
    uint64_t bytes = 0;

    int64_t elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

// A byte range of one shard file.
struct file_extent {
    uint32_t shard = 0;
    uint64_t offset = 0;  // absolute file offset
    uint64_t bytes = 0;
};

class model_file {
public:
    // Opens a GGUF file. For a split model pass any shard (`name-0000K-of-0000N.gguf`) or the
    // first; all shards are opened and validated. Every structural problem is an error naming
    // the file (and tensor): bad magic, version, truncation, offsets out of range or overlapping,
    // unknown types, sizes that do not match the type's block size.
    static result<model_file> open(const std::string& path);

    model_file(model_file&&) noexcept;
    model_file& operator=(model_file&&) noexcept;
    ~model_file();

    uint32_t version() const;
    uint64_t alignment() const;
    const std::vector<kv>& metadata() const;
    const value* find(std::string_view key) const;
    // Typed getters with messages like "model.gguf: key 'deepseek41.block_count' is missing".
    result<uint64_t> get_u64(std::string_view key) const;
    result<int64_t> get_i64(std::string_view key) const;
    result<double> get_f64(std::string_view key) const;
    result<bool> get_bool(std::string_view key) const;
    result<std::string> get_string(std::string_view key) const;

    const std::vector<tensor_info>& tensors() const;
    const tensor_info* tensor(std::string_view name) const;

    // Memory-mapped bytes of a tensor (dense access).
    std::span<const std::byte> data(const tensor_info& t) const;
    // Bytes of expert `e` of a 3-D expert tensor (experts along ne[2]).
    file_extent expert_slice(const tensor_info& t, int64_t expert) const;

    size_t shard_count() const;
    const std::string& shard_path(uint32_t shard) const;
    uint64_t shard_size(uint32_t shard) const;

private:
    struct impl;
    explicit model_file(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
};

// Parses a GGUF image held in memory (no mapping, no split siblings). Used by the fuzz target
// and by tests; `name` appears in error messages.
struct parsed_header {
    uint32_t version = 0;
    uint64_t alignment = kDefaultAlignment;
    std::vector<kv> metadata;
    std::vector<tensor_info> tensors;
    uint64_t data_offset = 0;  // start of the data section in the file
};
result<parsed_header> parse(std::span<const std::byte> bytes, std::string_view name);

// ---------------------------------------------------------------------------------------------
// Writer. Tensors are written in the order they are added; each one's bytes come from a callback
// so multi-GB models are produced one tensor at a time.
struct writer_options {
    uint64_t alignment = 4096;  // every tensor starts on this boundary (O_DIRECT-readable)
    uint32_t shards = 1;        // >1: name-0000K-of-0000N.gguf files with split.* metadata
};

using tensor_filler = std::function<void(std::span<std::byte> out)>;

class writer {
public:
    explicit writer(writer_options opts = {});
    void set(std::string key, value v);  // replaces an existing key
    // shape in ggml order (ne[0] fastest). Asserts ne[0] is a multiple of the type's block size.
    void add_tensor(std::string name, ggml_type type, std::vector<int64_t> shape, tensor_filler fill);
    // Writes the file(s); returns the paths written. `path` is the single-file name; with shards
    // the ".gguf" suffix is replaced by "-0000K-of-0000N.gguf".
    result<std::vector<std::string>> write(const std::string& path);

private:
    struct pending_tensor {
        std::string name;
        ggml_type type;
        std::vector<int64_t> shape;
        tensor_filler fill;
    };
    // The kv set of one shard: the user's keys, general.alignment and (split models) split.*.
    std::vector<kv> shard_metadata(uint32_t shard) const;
    // Writes tensors [first, last) with their header to `file`.
    result<void> write_shard(const std::string& file, uint32_t shard, size_t first, size_t last,
                             const std::vector<uint64_t>& sizes);

    writer_options opts_;
    std::vector<kv> metadata_;
    std::vector<pending_tensor> tensors_;
};

// "name-00001-of-00011.gguf" naming used for split models. `shard` is 0-based (as in
// tensor_info::shard and split.no); the number in the name is 1-based, as gguf-split writes it.
std::string split_path(const std::string& single_path, uint32_t shard, uint32_t count);

}  // namespace moestream::gguf
