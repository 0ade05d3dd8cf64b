// Reader of safetensors files (the DeepSeek release checkpoints): an 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the data.
// The file is memory-mapped; every structural problem is an error naming the file and tensor.
//
// Thread safety: a file is immutable after open(); concurrent const access is safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/result.h"
#include "storage/mapped_file.h"

namespace moestream::safetensors {

enum class dtype { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean, f8_e4m3, f8_e5m2, f8_e8m0, f4 };

std::string_view dtype_name(dtype t);
// Bits per element (F4 is 4: two elements a byte).
int dtype_bits(dtype t);

struct tensor {
    std::string name;
    dtype type = dtype::f32;
    std::vector<int64_t> shape;  // as stored: row-major, shape[0] slowest
    uint64_t offset = 0;         // absolute offset in the file
    uint64_t bytes = 0;

    int64_t elements() const;
};

class file {
public:
    static result<file> open(const std::string& path);

    const std::string& path() const { return map_.path(); }
    const std::vector<tensor>& tensors() const { return tensors_; }  // in header order
    const tensor* find(std::string_view name) const;
    std::span<const std::byte> data(const tensor& t) const;
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

private:
    storage::mapped_file map_;
    std::vector<tensor> tensors_;
    std::map<std::string, size_t, std::less<>> index_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace moestream::safetensors
