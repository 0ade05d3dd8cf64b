#include "tools/bench_disk.h"

#include <algorithm>
#include <cstdio>
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

void print_disk_ceiling(const char* what, double tps, double raw, double bytes_per_token, double resident_tps) {
    const double disk_tps = raw > 0 && bytes_per_token > 0 ? raw / bytes_per_token : 0;
    const double ceiling = disk_tps > 0 && resident_tps > 0 ? std::min(disk_tps, resident_tps) : std::max(disk_tps, resident_tps);
    if (ceiling <= 0) {
        std::printf("new content: %.2f tok/s (%s); no ceiling: neither the disk's bandwidth nor the resident rate was "
                    "measured\n",
                    tps, what);
        return;
    }
    std::printf("new content: %.2f tok/s (%s); ceiling min(%.2f GB/s / %.1f MB read a token = %.2f, resident %.2f) = "
                "%.2f tok/s; ratio %.2f (target >= 0.9)\n",
                tps, what, raw / 1e9, bytes_per_token / 1e6, disk_tps, resident_tps, ceiling, tps / ceiling);
}

}  // namespace moestream::tools
