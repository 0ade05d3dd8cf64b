#include "storage/aligned_buffer.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "config/assert.h"

namespace moestream::io {
namespace {

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

std::string errno_text(int e) { return std::generic_category().message(e); }

std::string memlock_limit_text() {
    rlimit rl{};
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
    if (rl.rlim_cur == RLIM_INFINITY) return "unlimited";
    std::string s = std::to_string(rl.rlim_cur / 1024);
    s += " KiB";
    return s;
}

}  // namespace

result<aligned_buffer> aligned_buffer::allocate(size_t bytes, buffer_options opts) {
    aligned_buffer b;
    if (bytes == 0) return b;
    const size_t size = round_up(bytes, kPageAlign);
    // mmap only guarantees 4 KiB alignment; for a huge-page hint to take, the range must start on
    // a 2 MiB boundary, so over-map by 2 MiB and give the unaligned head and tail back.
    const bool huge = opts.huge && size >= kHugeAlign;
    const size_t map_bytes = huge ? size + kHugeAlign : size;
    void* p = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        std::string msg = "cannot map ";
        msg += std::to_string(size);
        msg += " bytes of host memory: ";
        msg += errno_text(errno);
        return make_error(std::move(msg));
    }
    auto* base = static_cast<std::byte*>(p);
    if (huge) {
        const auto addr = reinterpret_cast<uintptr_t>(base);
        auto* aligned = reinterpret_cast<std::byte*>(round_up(addr, kHugeAlign));
        const size_t head = size_t(aligned - base);
        const size_t tail = map_bytes - head - size;
        if (head) munmap(base, head);
        if (tail) munmap(aligned + size, tail);
        base = aligned;
        madvise(base, size, MADV_HUGEPAGE);  // a hint: ignored where THP is off
    }
    b.data_ = base;
    b.size_ = size;
    if (opts.lock) MS_TRY(b.lock());
    return b;
}

status aligned_buffer::lock() {
    if (locked_ || size_ == 0) return {};
    if (mlock(data_, size_) != 0) {
        const int e = errno;
        std::string msg = "cannot lock ";
        msg += std::to_string(size_ >> 20);
        msg += " MiB of host memory in RAM: ";
        msg += errno_text(e);
        msg += " (RLIMIT_MEMLOCK is ";
        msg += memlock_limit_text();
        msg += "; raise it with `ulimit -l` or LimitMEMLOCK=)";
        return make_error(std::move(msg));
    }
    locked_ = true;
    return {};
}

aligned_buffer::aligned_buffer(aligned_buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      locked_(std::exchange(other.locked_, false)) {}

aligned_buffer& aligned_buffer::operator=(aligned_buffer&& other) noexcept {
    if (this != &other) {
        reset();
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        locked_ = std::exchange(other.locked_, false);
    }
    return *this;
}

aligned_buffer::~aligned_buffer() { reset(); }

void aligned_buffer::reset() {
    if (data_) munmap(data_, size_);  // also drops an mlock
    data_ = nullptr;
    size_ = 0;
    locked_ = false;
}

}  // namespace moestream::io
