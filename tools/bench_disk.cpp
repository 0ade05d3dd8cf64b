#include "tools/bench_disk.h"

#include <algorithm>
#include <vector>

#include "storage/aligned_buffer.h"
#include "storage/io_uring_reader.h"

namespace moestream::tools {

double raw_disk_bandwidth(const loaded_model& m, const moestream_config& cfg, uint64_t bytes) {
    io::reader_options o{uint32_t(cfg.io.depth), uint64_t(cfg.io.chunk_kib) * 1024, true};
    auto r = io::uring_reader::open({m.target.shard_path(0)}, o, [](uint64_t, const status&) {});
    if (!r) return 0;
    const uint64_t size = (*r)->file_size(0);
    bytes = std::min(bytes, size / 2) / o.chunk_bytes * o.chunk_bytes;
    auto buf = io::aligned_buffer::allocate(size_t(bytes));
    if (!buf || bytes == 0) return 0;
    std::vector<io::read_request> reqs;
    const uint64_t start = (size - bytes) / 2 / 4096 * 4096;  // the middle of the file: experts
    for (uint64_t off = 0; off < bytes; off += o.chunk_bytes)
        reqs.push_back({0, start + off, o.chunk_bytes, buf->data() + off, 0});
    (*r)->submit(reqs);
    (*r)->wait_idle();
    return (*r)->stats().bandwidth();
}

}  // namespace moestream::tools
