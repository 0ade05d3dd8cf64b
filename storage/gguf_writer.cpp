// GGUF writer: aligned tensors, optional sharding into gguf-split style files, written to
// temporary names and renamed only once every shard is complete.
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "storage/gguf.h"

namespace moestream::gguf {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF fields are copied as host integers");

constexpr size_t kWriteBuffer = size_t{8} << 20;  // few large write() calls instead of many small

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t bytes_of(ggml_type type, const std::vector<int64_t>& shape) {
    const auto& dt = dtype_info(type);
    uint64_t bytes = static_cast<uint64_t>(row_bytes(dt, shape[0]));
    for (size_t d = 1; d < shape.size(); ++d) bytes *= static_cast<uint64_t>(shape[d]);
    return bytes;
}

// Serialises the header (kv set and tensor infos) into memory.
class header_builder {
public:
    template <class T>
    void put(T v) {
        static_assert(std::is_trivially_copyable_v<T>);
        put_bytes(&v, sizeof(T));
    }
    void put_string(std::string_view s) {
        put<uint64_t>(s.size());
        put_bytes(s.data(), s.size());
    }
    void put_value(const value& v) {
        switch (v.type) {
            case value_type::u8: return put_unsigned<uint8_t>(v);
            case value_type::u16: return put_unsigned<uint16_t>(v);
            case value_type::u32: return put_unsigned<uint32_t>(v);
            case value_type::u64: return put_unsigned<uint64_t>(v);
            case value_type::i8: return put_signed<int8_t>(v);
            case value_type::i16: return put_signed<int16_t>(v);
            case value_type::i32: return put_signed<int32_t>(v);
            case value_type::i64: return put_signed<int64_t>(v);
            case value_type::f32: return put<float>(static_cast<float>(alt<double>(v)));
            case value_type::f64: return put<double>(alt<double>(v));
            case value_type::boolean: return put<uint8_t>(alt<bool>(v) ? 1 : 0);
            case value_type::string: return put_string(alt<std::string>(v));
            case value_type::array: return put_array(v);
        }
        MS_ASSERT_MSG(false, "gguf::writer: unknown value type");
    }
    std::vector<std::byte>& bytes() { return out_; }

private:
    // The value's variant must hold the alternative its type implies; anything else is a bug in
    // the caller that would otherwise produce a corrupt file.
    template <class T>
    static const T& alt(const value& v) {
        const T* p = std::get_if<T>(&v.data);
        MS_ASSERT_MSG(p != nullptr, "gguf::value holds data that does not match its type");
        return *p;
    }
    template <class T>
    void put_unsigned(const value& v) {
        const uint64_t x = alt<uint64_t>(v);
        MS_ASSERT_MSG(x <= std::numeric_limits<T>::max(), "gguf::value out of range for its type");
        put<T>(static_cast<T>(x));
    }
    template <class T>
    void put_signed(const value& v) {
        const int64_t x = alt<int64_t>(v);
        MS_ASSERT_MSG(x >= std::numeric_limits<T>::min() && x <= std::numeric_limits<T>::max(),
                      "gguf::value out of range for its type");
        put<T>(static_cast<T>(x));
    }
    void put_array(const value& v) {
        const auto& items = alt<std::vector<value>>(v);
        put<uint32_t>(static_cast<uint32_t>(v.array_type));
        put<uint64_t>(items.size());
        for (const auto& item : items) {
            MS_ASSERT_MSG(item.type == v.array_type, "gguf array item type differs from the element type");
            put_value(item);
        }
    }

    // resize + memcpy rather than insert(): GCC 12 warns falsely (-Wstringop-overflow) on the latter.
    void put_bytes(const void* p, size_t n) {
        if (n == 0) return;
        const size_t at = out_.size();
        out_.resize(at + n);
        std::memcpy(out_.data() + at, p, n);
    }

    std::vector<std::byte> out_;
};

// Buffered output to a file descriptor; large blocks bypass the buffer.
class file_out {
public:
    explicit file_out(std::string path) : path_(std::move(path)) {}
    ~file_out() {
        if (fd_ >= 0) ::close(fd_);
    }
    file_out(const file_out&) = delete;
    file_out& operator=(const file_out&) = delete;

    result<void> open() {
        fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) return sys_error("cannot create");
        buf_.reserve(kWriteBuffer);
        return {};
    }
    result<void> append(std::span<const std::byte> data) {
        if (buf_.size() + data.size() > kWriteBuffer) MS_TRY(flush());
        if (data.size() >= kWriteBuffer) return write_all(data);
        buf_.insert(buf_.end(), data.begin(), data.end());
        return {};
    }
    result<void> pad_to(uint64_t offset) {
        MS_ASSERT(offset >= written_ + buf_.size());
        static const std::array<std::byte, 4096> zeros{};
        while (written_ + buf_.size() < offset) {
            const uint64_t n = std::min<uint64_t>(zeros.size(), offset - written_ - buf_.size());
            MS_TRY(append(std::span(zeros.data(), n)));
        }
        return {};
    }
    uint64_t position() const { return written_ + buf_.size(); }
    result<void> close() {
        MS_TRY(flush());
        const int fd = std::exchange(fd_, -1);
        if (::close(fd) != 0) return sys_error("cannot close");
        return {};
    }

private:
    result<void> flush() {
        auto r = write_all(buf_);
        buf_.clear();
        return r;
    }
    result<void> write_all(std::span<const std::byte> data) {
        while (!data.empty()) {
            const ssize_t n = ::write(fd_, data.data(), data.size());
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return sys_error("write failed");
            data = data.subspan(static_cast<size_t>(n));
            written_ += static_cast<uint64_t>(n);
        }
        return {};
    }
    error sys_error(const char* what) const { return make_error(path_ + ": " + what + ": " + std::strerror(errno)); }

    std::string path_;
    int fd_ = -1;
    std::vector<std::byte> buf_;
    uint64_t written_ = 0;
};

// Removes temporary files unless the write completed (also when a filler throws).
struct temp_files {
    std::vector<std::string> paths;
    bool committed = false;
    ~temp_files() {
        if (!committed)
            for (const auto& p : paths) ::unlink(p.c_str());
    }
};

void set_in(std::vector<kv>& md, std::string key, value v) {
    for (auto& e : md) {
        if (e.key == key) {
            e.val = std::move(v);
            return;
        }
    }
    md.push_back({std::move(key), std::move(v)});
}

value u16_value(uint32_t v) { return {value_type::u16, value_type::u8, uint64_t(v)}; }

}  // namespace

writer::writer(writer_options opts) : opts_(opts) {
    MS_ASSERT_MSG(opts_.alignment > 0 && std::has_single_bit(opts_.alignment) &&
                      opts_.alignment <= (uint64_t{1} << 31),
                  "gguf::writer alignment must be a power of two that fits general.alignment (u32)");
    MS_ASSERT_MSG(opts_.shards >= 1 && opts_.shards <= 65535, "gguf::writer shards must be in 1..65535 (split.count is u16)");
}

void writer::set(std::string key, value v) { set_in(metadata_, std::move(key), std::move(v)); }

void writer::add_tensor(std::string name, ggml_type type, std::vector<int64_t> shape, tensor_filler fill) {
    MS_ASSERT_MSG(!shape.empty() && shape.size() <= static_cast<size_t>(kMaxDims), "tensor needs 1..4 dimensions");
    for (int64_t n : shape) MS_ASSERT_MSG(n > 0, "tensor dimensions must be positive");
    MS_ASSERT_MSG(shape[0] % dtype_info(type).block_elems == 0, "ne[0] must be a multiple of the block size");
    for (const auto& t : tensors_) MS_ASSERT_MSG(t.name != name, "duplicate tensor name");
    MS_ASSERT(fill != nullptr);
    tensors_.push_back({std::move(name), type, std::move(shape), std::move(fill)});
}

namespace {

// First tensor index of each shard (plus the end): in order, cutting when a shard has reached
// its share of the bytes, but never leaving a later shard without a tensor.
std::vector<size_t> shard_starts(const std::vector<uint64_t>& sizes, uint32_t shards) {
    std::vector<size_t> starts{0};
    unsigned __int128 total = 0, acc = 0;
    for (uint64_t s : sizes) total += s;
    size_t in_shard = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        const size_t shard = starts.size() - 1;
        const size_t shards_left = shards - shard;
        // Cut where the shard boundary falls before this tensor's midpoint: the shard then ends
        // nearer its share than it would by taking the tensor.
        const bool share_reached = (2 * acc + sizes[i]) * shards > 2 * total * (shard + 1);
        const bool must_cut = sizes.size() - i < shards_left;  // the rest need one tensor each
        if (in_shard > 0 && shard + 1 < shards && (share_reached || must_cut)) {
            starts.push_back(i);
            in_shard = 0;
        }
        acc += sizes[i];
        ++in_shard;
    }
    starts.push_back(sizes.size());
    return starts;
}

}  // namespace

std::vector<kv> writer::shard_metadata(uint32_t shard) const {
    std::vector<kv> md = metadata_;
    set_in(md, "general.alignment", value::u32(static_cast<uint32_t>(opts_.alignment)));
    if (opts_.shards > 1) {  // the types gguf-split writes, so llama.cpp reads our shards
        set_in(md, "split.no", u16_value(shard));
        set_in(md, "split.count", u16_value(opts_.shards));
        set_in(md, "split.tensors.count", value::i32(static_cast<int32_t>(tensors_.size())));
    }
    return md;
}

result<void> writer::write_shard(const std::string& file, uint32_t shard, size_t first, size_t last,
                                 const std::vector<uint64_t>& sizes) {
    const std::vector<kv> md = shard_metadata(shard);
    header_builder h;
    h.put<uint32_t>(kMagic);
    h.put<uint32_t>(kVersion);
    h.put<uint64_t>(last - first);
    h.put<uint64_t>(md.size());
    for (const auto& e : md) {
        h.put_string(e.key);
        h.put<uint32_t>(static_cast<uint32_t>(e.val.type));
        h.put_value(e.val);
    }
    uint64_t offset = 0;  // relative to the data section
    std::vector<uint64_t> offsets;
    for (size_t i = first; i < last; ++i) {
        const auto& t = tensors_[i];
        h.put_string(t.name);
        h.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
        for (int64_t n : t.shape) h.put<uint64_t>(static_cast<uint64_t>(n));
        h.put<uint32_t>(static_cast<uint32_t>(t.type));
        offset = round_up(offset, opts_.alignment);
        h.put<uint64_t>(offset);
        offsets.push_back(offset);
        offset += sizes[i];
    }
    const uint64_t data_offset = round_up(h.bytes().size(), opts_.alignment);

    file_out out(file);
    MS_TRY(out.open());
    MS_TRY(out.append(h.bytes()));
    // No padding after the last tensor: the file ends where its data does, so any truncation
    // is detectable as a tensor running past the end.
    for (size_t i = first; i < last; ++i) {
        MS_TRY(out.pad_to(data_offset + offsets[i - first]));
        std::vector<std::byte> buf(sizes[i]);
        tensors_[i].fill(buf);
        MS_TRY(out.append(buf));
    }
    return out.close();
}

result<std::vector<std::string>> writer::write(const std::string& path) {
    const uint32_t n_shards = opts_.shards;
    if (n_shards > 1 && tensors_.size() < n_shards)
        return make_error(path + ": cannot split " + std::to_string(tensors_.size()) + " tensors into " +
                          std::to_string(n_shards) + " shards");
    std::vector<uint64_t> sizes;
    for (const auto& t : tensors_) sizes.push_back(bytes_of(t.type, t.shape));
    const auto starts = shard_starts(sizes, n_shards);
    MS_ASSERT(starts.size() == n_shards + 1);

    std::vector<std::string> finals;
    temp_files temps;
    for (uint32_t s = 0; s < n_shards; ++s) {
        finals.push_back(n_shards == 1 ? path : split_path(path, s, n_shards));
        temps.paths.push_back(finals.back() + ".partial");
    }
    for (uint32_t s = 0; s < n_shards; ++s) MS_TRY(write_shard(temps.paths[s], s, starts[s], starts[s + 1], sizes));
    for (uint32_t s = 0; s < n_shards; ++s) {
        if (::rename(temps.paths[s].c_str(), finals[s].c_str()) != 0) {
            auto err = make_error(finals[s] + ": cannot rename from " + temps.paths[s] + ": " + std::strerror(errno));
            for (uint32_t done = 0; done < s; ++done) ::unlink(finals[done].c_str());  // no partial model
            return err;
        }
    }
    temps.committed = true;
    return finals;
}

std::string split_path(const std::string& single_path, uint32_t shard, uint32_t count) {
    MS_ASSERT(shard < count && count <= 99999);
    constexpr std::string_view kSuffix = ".gguf";
    const std::string base =
        single_path.ends_with(kSuffix) ? single_path.substr(0, single_path.size() - kSuffix.size()) : single_path;
    char tail[32];
    std::snprintf(tail, sizeof tail, "-%05u-of-%05u.gguf", shard + 1, count);
    return base + tail;
}

}  // namespace moestream::gguf
