#include "storage/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace moestream::storage {
namespace {

error sys_error(const std::string& path, const char* what, int err) {
    return make_error(path + ": " + what + ": " + std::strerror(err));
}

// Closes the descriptor on every path out of open(); the mapping outlives it.
struct fd_guard {
    int fd;
    ~fd_guard() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace

result<mapped_file> mapped_file::open(const std::string& path) {
    fd_guard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (fd.fd < 0) return sys_error(path, "cannot open", errno);
    struct stat st {};
    if (::fstat(fd.fd, &st) != 0) return sys_error(path, "cannot stat", errno);
    if (!S_ISREG(st.st_mode)) return make_error(path + ": not a regular file");
    const auto size = static_cast<size_t>(st.st_size);
    if (size == 0) return mapped_file(path, nullptr, 0);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (p == MAP_FAILED) return sys_error(path, "cannot map", errno);
    return mapped_file(path, static_cast<const std::byte*>(p), size);
}

mapped_file::mapped_file(mapped_file&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

mapped_file& mapped_file::operator=(mapped_file&& other) noexcept {
    if (this != &other) {
        reset();
        path_ = std::move(other.path_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

mapped_file::~mapped_file() { reset(); }

void mapped_file::reset() {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
}

}  // namespace moestream::storage
