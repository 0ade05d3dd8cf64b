// Writer of safetensors files (activation dumps, test inputs): collects named tensors and string
// metadata, then writes an 8-byte little-endian header length, a JSON header padded with spaces so
// the data starts 8-byte aligned, and the tensors' bytes back to back in insertion order (the
// reference implementation rejects gaps between tensors, so there is no per-tensor padding).
//
// JSON object order is not kept by every reader, so the insertion order is also stored as the
// metadata key "order" (comma-separated names); tensor names therefore cannot contain a comma.
// A tensor whose first dimension indexes layers or steps can be marked with mark_stacked(): it is
// listed in the metadata key "stacked" (comma-separated), which `moestream compare` splits into
// one row per leading index.
//
// The file is written to PATH.partial and renamed over PATH only when complete, so a reader never
// sees a half-written file. Every error is a value naming the path (and the tensor).
// Thread safety: none; one writer is filled and written by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "config/result.h"
#include "storage/safetensors.h"

namespace moestream::safetensors {

// Metadata keys the writer manages itself (set_metadata refuses them).
inline constexpr std::string_view kOrderKey = "order";
inline constexpr std::string_view kStackedKey = "stacked";

// The safetensors dtype of a C++ element type, for the typed add() overloads.
template <class T>
constexpr dtype dtype_of() {
    if constexpr (std::is_same_v<T, float>) return dtype::f32;
    else if constexpr (std::is_same_v<T, double>) return dtype::f64;
    else if constexpr (std::is_same_v<T, int64_t>) return dtype::i64;
    else if constexpr (std::is_same_v<T, int32_t>) return dtype::i32;
    else if constexpr (std::is_same_v<T, int16_t>) return dtype::i16;
    else if constexpr (std::is_same_v<T, int8_t>) return dtype::i8;
    else if constexpr (std::is_same_v<T, uint8_t>) return dtype::u8;
    else static_assert(sizeof(T) == 0, "no safetensors dtype for this element type");
}

class writer {
public:
    // Adds a tensor whose bytes are copied now. `shape` is PyTorch order [outer, ..., inner]
    // ([] is a scalar, a 0 anywhere an empty tensor). Errors: empty name, a comma in the name,
    // "__metadata__", a duplicate name, a negative dimension, or a byte count that the shape and
    // dtype do not give.
    status add(std::string name, dtype type, std::vector<int64_t> shape, std::span<const std::byte> bytes);
    // Same, but only the span is kept: the caller keeps the bytes alive and unchanged until
    // write() returns (big activations are not copied twice).
    status add_view(std::string name, dtype type, std::vector<int64_t> shape, std::span<const std::byte> bytes);

    template <class T>
    status add(std::string name, std::vector<int64_t> shape, std::span<const T> values) {
        return add(std::move(name), dtype_of<T>(), std::move(shape), std::as_bytes(values));
    }
    template <class T>
    status add_view(std::string name, std::vector<int64_t> shape, std::span<const T> values) {
        return add_view(std::move(name), dtype_of<T>(), std::move(shape), std::as_bytes(values));
    }

    // String metadata (`__metadata__`); a later call replaces the value. Refuses "order" and
    // "stacked", which the writer fills itself.
    status set_metadata(std::string key, std::string value);
    // Lists an added tensor of rank >= 1 under "stacked": its first dimension is a layer or step index.
    status mark_stacked(std::string_view name);

    size_t size() const { return tensors_.size(); }
    bool contains(std::string_view name) const;

    // Writes the file (PATH.partial, then renamed to PATH). The writer is unchanged and may write again.
    status write(const std::string& path) const;
private:
    struct entry {
        std::string name;
        dtype type;
        std::vector<int64_t> shape;
        bool is_view = false;
        std::vector<std::byte> owned;     // add(): a copy
        std::span<const std::byte> view;  // add_view(): the caller's bytes
        std::span<const std::byte> bytes() const { return is_view ? view : std::span<const std::byte>(owned); }
    };
    status check_new(const std::string& name, dtype type, const std::vector<int64_t>& shape, size_t bytes) const;
    status push(std::string name, dtype type, std::vector<int64_t> shape, std::span<const std::byte> bytes, bool view);
    std::string header() const;  // JSON, padded with spaces to a multiple of 8 bytes

    std::vector<entry> tensors_;  // insertion order = data order
    std::map<std::string, std::string, std::less<>> metadata_;
    std::vector<std::string> stacked_;
};

}  // namespace moestream::safetensors
