// Page-aligned host memory owned RAII-style: the destination of O_DIRECT reads (which need 4 KiB
// aligned buffers) and the regions registered with io_uring. Anonymous mmap rather than
// posix_memalign so the pages come zeroed, are returned to the OS on free, and large buffers can
// be asked for transparent huge pages (fewer pages for the kernel to pin when the buffer is
// registered with io_uring or cudaHostRegister'd).
//
// Thread safety: none needed; the owner moves it around, readers use data() concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "config/result.h"

namespace moestream::io {

inline constexpr size_t kPageAlign = 4096;         // O_DIRECT alignment used everywhere
inline constexpr size_t kHugeAlign = size_t(2) << 20;  // x86-64 transparent huge page

struct buffer_options {
    bool lock = false;  // mlock the pages; failure (RLIMIT_MEMLOCK) is an error of allocate()
    bool huge = true;   // buffers of >= 2 MiB: 2 MiB alignment + MADV_HUGEPAGE (a hint only)
};

class aligned_buffer {
public:
    // `bytes` is rounded up to a multiple of 4096. Zero bytes gives an empty buffer.
    static result<aligned_buffer> allocate(size_t bytes, buffer_options opts = {});

    aligned_buffer() = default;
    aligned_buffer(aligned_buffer&& other) noexcept;
    aligned_buffer& operator=(aligned_buffer&& other) noexcept;
    aligned_buffer(const aligned_buffer&) = delete;
    aligned_buffer& operator=(const aligned_buffer&) = delete;
    ~aligned_buffer();

    // mlock after the fact; the error names the size and the RLIMIT_MEMLOCK in force.
    status lock();

    std::byte* data() const { return data_; }
    size_t size() const { return size_; }
    std::span<std::byte> span() const { return {data_, size_}; }
    bool locked() const { return locked_; }

private:
    void reset();

    std::byte* data_ = nullptr;  // the whole mapping (over-allocation for alignment is trimmed)
    size_t size_ = 0;
    bool locked_ = false;
};

}  // namespace moestream::io
