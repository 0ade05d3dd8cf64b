// Read-only memory mapping of a whole file (RAII). Model files are mapped rather than read so
// dense tensors are paged in on demand and shared with the page cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "config/result.h"

namespace moestream::storage {

class mapped_file {
public:
    // Maps `path` read-only. An empty file maps to an empty span (mmap cannot map 0 bytes).
    static result<mapped_file> open(const std::string& path);

    mapped_file() = default;
    mapped_file(mapped_file&& other) noexcept;
    mapped_file& operator=(mapped_file&& other) noexcept;
    mapped_file(const mapped_file&) = delete;
    mapped_file& operator=(const mapped_file&) = delete;
    ~mapped_file();

    std::span<const std::byte> bytes() const { return {data_, size_}; }
    uint64_t size() const { return size_; }
    const std::string& path() const { return path_; }

private:
    mapped_file(std::string path, const std::byte* data, size_t size)
        : path_(std::move(path)), data_(data), size_(size) {}
    void reset();

    std::string path_;
    const std::byte* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace moestream::storage
