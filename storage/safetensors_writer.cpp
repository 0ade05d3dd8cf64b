#include "storage/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace moestream::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little, "the header length is written as a host integer");

// JSON string literal with the escapes RFC 8259 requires; other UTF-8 bytes pass through.
void append_json_string(std::string& out, std::string_view s) {
    out += '"';
    for (char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
                    out += buf;
                } else {
                    out += c;
                }
        }
    }
    out += '"';
}

std::string join(const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) {
        if (!s.empty()) s += ',';
        s += n;
    }
    return s;
}

// Owns a file descriptor on PATH.partial; unlinks it unless committed (no debris after an error).
class partial_file {
public:
    explicit partial_file(std::string final_path) : final_(std::move(final_path)), temp_(final_ + ".partial") {}
    partial_file(const partial_file&) = delete;
    partial_file& operator=(const partial_file&) = delete;
    ~partial_file() {
        if (fd_ >= 0) ::close(fd_);
        if (!committed_) ::unlink(temp_.c_str());
    }

    status open() {
        fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd_ < 0) return make_error(final_ + ": cannot create " + temp_ + ": " + std::strerror(errno));
        return {};
    }
    status append(std::span<const std::byte> bytes) {
        while (!bytes.empty()) {
            const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return make_error(final_ + ": write failed: " + std::strerror(n < 0 ? errno : EIO));
            bytes = bytes.subspan(size_t(n));
        }
        return {};
    }
    status commit() {
        const int fd = fd_;
        fd_ = -1;
        if (::close(fd) != 0) return make_error(final_ + ": close failed: " + std::strerror(errno));
        if (::rename(temp_.c_str(), final_.c_str()) != 0)
            return make_error(final_ + ": cannot rename from " + temp_ + ": " + std::strerror(errno));
        committed_ = true;
        return {};
    }

private:
    std::string final_, temp_;
    int fd_ = -1;
    bool committed_ = false;
};

}  // namespace

status writer::check_new(const std::string& name, dtype type, const std::vector<int64_t>& shape,
                         size_t bytes) const {
    auto bad = [&](const std::string& what) {
        return make_error(std::string("safetensors writer: tensor '") + name + "': " + what);
    };
    if (name.empty()) return bad("empty name");
    if (name == "__metadata__") return bad("the name is reserved for the metadata object");
    if (name.find(',') != std::string::npos) return bad("names cannot contain ',' (the \"order\" metadata is comma-separated)");
    if (contains(name)) return bad("added twice");
    uint64_t n = 1;
    for (int64_t d : shape) {
        if (d < 0) return bad(std::string("negative dimension ") + std::to_string(d));
        n *= uint64_t(d);
    }
    const int bits = dtype_bits(type);
    if ((n * uint64_t(bits)) % 8) return bad(std::string("odd element count ") + std::to_string(n) + " for a 4-bit dtype");
    const uint64_t expect = n * uint64_t(bits) / 8;
    if (expect != bytes)
        return bad(std::to_string(bytes) + " bytes given but shape and dtype " + std::string(dtype_name(type)) +
                   " need " + std::to_string(expect));
    return {};
}

status writer::push(std::string name, dtype type, std::vector<int64_t> shape, std::span<const std::byte> bytes,
                    bool view) {
    MS_TRY(check_new(name, type, shape, bytes.size()));
    entry e;
    e.name = std::move(name);
    e.type = type;
    e.shape = std::move(shape);
    e.is_view = view;
    if (view) e.view = bytes;
    else e.owned.assign(bytes.begin(), bytes.end());
    tensors_.push_back(std::move(e));
    return {};
}

status writer::add(std::string name, dtype type, std::vector<int64_t> shape, std::span<const std::byte> bytes) {
    return push(std::move(name), type, std::move(shape), bytes, false);
}

status writer::add_view(std::string name, dtype type, std::vector<int64_t> shape,
                        std::span<const std::byte> bytes) {
    return push(std::move(name), type, std::move(shape), bytes, true);
}

status writer::set_metadata(std::string key, std::string value) {
    if (key == kOrderKey || key == kStackedKey)
        return make_error(std::string("safetensors writer: metadata key '") + key + "' is written by the writer itself");
    metadata_[std::move(key)] = std::move(value);
    return {};
}

status writer::mark_stacked(std::string_view name) {
    auto it = std::find_if(tensors_.begin(), tensors_.end(), [&](const entry& e) { return e.name == name; });
    if (it == tensors_.end())
        return make_error(std::string("safetensors writer: mark_stacked: no tensor '") + std::string(name) + "'");
    if (it->shape.empty())
        return make_error(std::string("safetensors writer: mark_stacked: tensor '") + std::string(name) +
                          "' is a scalar (no leading index)");
    if (std::find(stacked_.begin(), stacked_.end(), name) == stacked_.end()) stacked_.emplace_back(name);
    return {};
}

bool writer::contains(std::string_view name) const {
    return std::any_of(tensors_.begin(), tensors_.end(), [&](const entry& e) { return e.name == name; });
}

std::string writer::header() const {
    std::string h = "{\"__metadata__\":{";
    auto meta = [&](std::string_view key, std::string_view value, bool first) {
        if (!first) h += ',';
        append_json_string(h, key);
        h += ':';
        append_json_string(h, value);
    };
    std::vector<std::string> order;
    for (const auto& t : tensors_) order.push_back(t.name);
    meta(kOrderKey, join(order), true);
    if (!stacked_.empty()) meta(kStackedKey, join(stacked_), false);
    for (const auto& [k, v] : metadata_) meta(k, v, false);
    h += '}';
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
        h += ',';
        append_json_string(h, t.name);
        h += ":{\"dtype\":";
        append_json_string(h, dtype_name(t.type));
        h += ",\"shape\":[";
        for (size_t d = 0; d < t.shape.size(); ++d) {
            if (d) h += ',';
            h += std::to_string(t.shape[d]);
        }
        const uint64_t end = offset + t.bytes().size();
        h += "],\"data_offsets\":[";
        h += std::to_string(offset);
        h += ',';
        h += std::to_string(end);
        h += "]}";
        offset = end;
    }
    h += '}';
    // Spaces are JSON whitespace: padding the header keeps the data 8-byte aligned for mmap readers.
    h.resize((h.size() + 7) / 8 * 8, ' ');
    return h;
}

status writer::write(const std::string& path) const {
    const std::string h = header();
    const uint64_t len = h.size();
    partial_file out(path);
    MS_TRY(out.open());
    MS_TRY(out.append(std::as_bytes(std::span(&len, 1))));
    MS_TRY(out.append(std::as_bytes(std::span(h))));
    for (const auto& t : tensors_) MS_TRY(out.append(t.bytes()));
    return out.commit();
}

}  // namespace moestream::safetensors
