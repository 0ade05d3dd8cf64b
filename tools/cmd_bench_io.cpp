// `moestream bench io`: how close the engine's reader (io::uring_reader) comes to the file
// system's raw O_DIRECT bandwidth at the same chunk size and depth. The raw figure comes from a
// minimal io_uring loop (one buffer per slot, resubmit on completion, nothing else), so the
// ratio isolates the reader's own cost: chunking, request bookkeeping, the reaper thread and
// callbacks. The target is >= 90% (../shared/docs/streaming-anchors.md section 5.1: the engine
// must keep the drive at depth, not merely issue reads).
#include <fcntl.h>
#include <liburing.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "config/assert.h"
#include "config/config.h"
#include "storage/aligned_buffer.h"
#include "storage/gguf.h"
#include "storage/io_uring_reader.h"
#include "tools/command.h"

namespace moestream::tools {
namespace {

constexpr std::string_view kName = "bench io";
constexpr uint64_t kFixedRequest = uint64_t(6) << 20;  // request size when FILE has no experts

const cli::option_spec kOptions[] = {
    {"file", "FILE", "file to read: a deepseek41 GGUF (its experts are read) or any large file"},
    {"depth", "N", "reads in flight (default: the engine's io.depth, 64)"},
    {"chunk", "KiB", "read size, a multiple of 4 (default: the engine's io.chunk_kib, 1024)"},
    {"seconds", "S", "time limit of each measurement (default 10)"},
    {"bytes", "GiB", "data read by each measurement (default: the whole file, at most 4)"},
    {"rounds", "N", "raw and engine measurements alternate N times; the verdict is the median round (default 3)"},
};

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

double cpu_seconds() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const auto tv = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
    return tv(ru.ru_utime) + tv(ru.ru_stime);
}

std::string errno_text(int e) { return std::strerror(e); }

double gib(uint64_t b) { return double(b) / double(uint64_t(1) << 30); }

struct measurement {
    uint64_t bytes = 0;
    double seconds = 0;
    double cpu = 0;
    double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0; }
};

// ---------------------------------------------------------------------------------------------
// (a) The raw loop: chunk-sized reads at `depth`, sequential (wrapping) or at random
// chunk-aligned offsets, until `amount` bytes or `limit_s` seconds.
result<measurement> raw_read(const std::string& path, uint64_t file_size, bool direct, uint32_t depth, uint64_t chunk,
                             uint64_t amount, double limit_s, bool random) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (direct ? O_DIRECT : 0));
    if (fd < 0) {
        std::string m = "cannot open ";
        m += path;
        m += ": ";
        m += errno_text(errno);
        return make_error(std::move(m));
    }
    io_uring ring{};
    if (int rc = io_uring_queue_init(depth, &ring, 0); rc < 0) {
        ::close(fd);
        std::string m = "io_uring unavailable: ";
        m += errno_text(-rc);
        return make_error(std::move(m));
    }
    auto buf = io::aligned_buffer::allocate(size_t(depth) * chunk);
    if (!buf) {
        io_uring_queue_exit(&ring);
        ::close(fd);
        return buf.err();
    }
    const uint64_t slots_in_file = std::max<uint64_t>(1, file_size / chunk);
    std::mt19937_64 rng(random ? 1234 : 0);
    uint64_t next_seq = 0, issued = 0;
    uint32_t in_flight = 0;
    measurement m;
    std::string error;
    const double cpu0 = cpu_seconds();
    const auto t0 = clock_type::now();
    const auto issue = [&](uint32_t slot) {
        const uint64_t idx = random ? rng() % slots_in_file : next_seq++ % slots_in_file;
        const uint64_t len = std::min(chunk, file_size - idx * chunk);
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        MS_ASSERT(sqe);  // at most `depth` in flight in a ring of `depth` entries
        io_uring_prep_read(sqe, fd, buf->data() + size_t(slot) * chunk, unsigned(len), idx * chunk);
        io_uring_sqe_set_data64(sqe, slot);
        issued += len;
        ++in_flight;
    };
    const auto may_issue = [&] { return error.empty() && issued < amount && seconds_since(t0) < limit_s; };
    for (uint32_t s = 0; s < depth && may_issue(); ++s) issue(s);
    while (in_flight > 0) {
        io_uring_submit(&ring);
        io_uring_cqe* cqe = nullptr;
        if (int rc = io_uring_wait_cqe(&ring, &cqe); rc < 0) {
            if (rc == -EINTR) continue;
            error = errno_text(-rc);
            break;
        }
        unsigned head, n = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            ++n;
            --in_flight;
            if (cqe->res < 0 && error.empty()) error = errno_text(-cqe->res);
            if (cqe->res > 0) m.bytes += uint64_t(cqe->res);
            if (may_issue()) issue(uint32_t(io_uring_cqe_get_data64(cqe)));
        }
        io_uring_cq_advance(&ring, n);
    }
    m.seconds = seconds_since(t0);
    m.cpu = cpu_seconds() - cpu0;
    io_uring_queue_exit(&ring);
    ::close(fd);
    if (!error.empty()) {
        std::string msg = path;
        msg += ": raw read failed: ";
        msg += error;
        return make_error(std::move(msg));
    }
    return m;
}

// ---------------------------------------------------------------------------------------------
// (b) The engine: whole experts (gate/up/down extents) or fixed 6 MiB requests, in random order,
// each landing in one slot of a registered pool, a new one submitted whenever a slot frees.
struct job {
    std::vector<io::read_request> parts;  // dst filled in at submission
    uint64_t bytes = 0;
};

struct workload {
    std::vector<std::string> paths;  // the shards (or FILE)
    std::vector<job> jobs;
    std::string what;  // for the report
};

// Experts of every layer of a deepseek41 GGUF, or nothing when FILE is not one.
std::vector<job> expert_jobs(const gguf::model_file& f) {
    std::vector<job> out;
    static const char* kParts[3] = {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"};
    for (int layer = 0;; ++layer) {
        const gguf::tensor_info* t[3];
        bool any = false, all = true;
        for (int p = 0; p < 3; ++p) {
            std::string name = "blk.";
            name += std::to_string(layer);
            name += '.';
            name += kParts[p];
            t[p] = f.tensor(name);
            any = any || t[p];
            all = all && t[p] && t[p]->n_dims == 3;
        }
        if (!any) {
            if (layer > 8) break;  // dense leading layers have no experts; stop after a run of none
            continue;
        }
        if (!all) continue;
        for (int64_t e = 0; e < t[0]->ne[2]; ++e) {
            job j;
            for (const auto* ti : t) {
                const auto x = f.expert_slice(*ti, e);
                j.parts.push_back({x.shard, x.offset, x.bytes, nullptr, 0});
                j.bytes += x.bytes;
            }
            out.push_back(std::move(j));
        }
    }
    return out;
}

workload make_workload(const std::string& file, uint64_t file_size, uint64_t amount) {
    workload w;
    std::mt19937_64 rng(99);
    char magic[4] = {};
    if (FILE* fp = std::fopen(file.c_str(), "rb")) {
        if (std::fread(magic, 1, 4, fp) != 4) magic[0] = 0;
        std::fclose(fp);
    }
    if (std::memcmp(magic, "GGUF", 4) == 0) {
        auto f = gguf::model_file::open(file);
        if (!f) {
            std::printf("note: %s looks like GGUF but does not open (%s); using fixed requests\n", file.c_str(),
                        f.message().c_str());
        } else {
            auto jobs = expert_jobs(*f);
            if (!jobs.empty()) {
                std::shuffle(jobs.begin(), jobs.end(), rng);
                uint64_t total = 0;
                size_t n = 0;
                while (n < jobs.size() && total < amount) total += jobs[n++].bytes;
                jobs.resize(n);
                for (uint32_t s = 0; s < f->shard_count(); ++s) w.paths.push_back(f->shard_path(s));
                w.what = std::to_string(n);
                w.what += " experts in random order, each 3 requests (gate/up/down, ";
                w.what += std::to_string(jobs.front().bytes >> 10);
                w.what += " KiB per expert)";
                w.jobs = std::move(jobs);
                return w;
            }
            std::printf("note: %s has no blk.N.ffn_{gate,up,down}_exps.weight tensors; using fixed requests\n",
                        file.c_str());
        }
    }
    w.paths = {file};
    const uint64_t req = std::min(kFixedRequest, file_size);
    const uint64_t max_off = (file_size - req) / io::kReadAlign;
    for (uint64_t total = 0; total < amount; total += req) {
        const uint64_t off = (max_off ? rng() % (max_off + 1) : 0) * io::kReadAlign;
        w.jobs.push_back({{{0, off, req, nullptr, 0}}, req});
    }
    w.what = std::to_string(w.jobs.size());
    w.what += " requests of ";
    w.what += std::to_string(req >> 10);
    w.what += " KiB at random 4 KiB-aligned offsets";
    return w;
}

struct engine_result {
    measurement m;
    io::reader_stats stats;
    bool fixed = false;
    std::string notes;
};

result<engine_result> engine_read(const workload& w, io::reader_options opts, double limit_s) {
    // Slots: each holds one job's parts at 4 KiB-aligned places; enough of them that twice the
    // device depth in bytes can be queued, so the reader is never starved by the driver.
    uint64_t slot_bytes = 0;
    for (const auto& j : w.jobs) {
        uint64_t s = 0;
        for (const auto& p : j.parts) s += io::uring_reader::staging_bytes(p.offset, p.bytes);
        slot_bytes = std::max(slot_bytes, s);
    }
    const uint64_t want = 2 * uint64_t(opts.depth) * opts.chunk_bytes;
    const size_t n_slots = size_t(std::clamp<uint64_t>((want + slot_bytes - 1) / slot_bytes + 2, 4, 8192));
    auto pool = io::aligned_buffer::allocate(n_slots * slot_bytes);
    if (!pool) return pool.err();

    std::mutex mu;
    std::condition_variable cv;
    std::vector<uint32_t> free_slots;
    std::vector<int> parts_left(n_slots, 0);
    std::string first_error;
    for (size_t s = n_slots; s-- > 0;) free_slots.push_back(uint32_t(s));
    auto opened = io::uring_reader::open(w.paths, opts, [&](uint64_t tag, const status& st) {
        std::lock_guard lk(mu);
        if (!st && first_error.empty()) first_error = st.message();
        const auto slot = uint32_t(tag >> 2);
        if (--parts_left[slot] == 0) {
            free_slots.push_back(slot);
            cv.notify_one();
        }
    });
    if (!opened) return opened.err();
    auto& reader = **opened;
    engine_result r;
    const std::span<std::byte> regions[] = {pool->span()};
    if (auto st = reader.register_buffers(regions); st)
        r.fixed = true;
    else
        std::printf("note: %s; the engine uses plain reads\n", st.message().c_str());

    const double cpu0 = cpu_seconds();
    const auto t0 = clock_type::now();
    std::vector<io::read_request> batch;
    for (const auto& j : w.jobs) {
        if (seconds_since(t0) >= limit_s) break;
        uint32_t slot;
        {
            std::unique_lock lk(mu);
            cv.wait(lk, [&] { return !free_slots.empty(); });
            if (!first_error.empty()) break;
            slot = free_slots.back();
            free_slots.pop_back();
            parts_left[slot] = int(j.parts.size());
        }
        batch.clear();
        std::byte* dst = pool->data() + size_t(slot) * slot_bytes;
        for (size_t p = 0; p < j.parts.size(); ++p) {
            auto q = j.parts[p];
            q.dst = dst;
            q.tag = uint64_t(slot) << 2 | p;
            dst += io::uring_reader::staging_bytes(q.offset, q.bytes);
            batch.push_back(q);
        }
        reader.submit(batch);
    }
    reader.wait_idle();
    r.m.seconds = seconds_since(t0);
    r.m.cpu = cpu_seconds() - cpu0;
    r.stats = reader.stats();
    r.m.bytes = r.stats.device_bytes;
    r.notes = reader.notes();
    if (!first_error.empty()) return make_error(first_error);
    return r;
}

// ---------------------------------------------------------------------------------------------
bool fio_on_path() {
    const char* path = std::getenv("PATH");
    if (!path) return false;
    const std::string_view all = path;
    size_t start = 0;
    while (start <= all.size()) {
        size_t end = all.find(':', start);
        if (end == std::string_view::npos) end = all.size();
        const std::string_view dir = all.substr(start, end - start);
        // std::filesystem::path rather than string appends (GCC 12 -Wrestrict false positive).
        const auto candidate = std::filesystem::path(dir.empty() ? std::string_view(".") : dir) / "fio";
        if (::access(candidate.c_str(), X_OK) == 0) return true;
        start = end + 1;
    }
    return false;
}

std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) {
        if (c == '\'')
            q += "'\\''";
        else
            q += c;
    }
    q += '\'';
    return q;
}

// fio with the raw loop's pattern; prints its summary lines.
void run_fio(const std::string& file, bool random, uint32_t depth, uint64_t chunk, uint64_t amount, double limit_s) {
    std::string cmd = "fio --name=moestream-bench-io --readonly --direct=1 --ioengine=io_uring --filename=";
    cmd += shell_quote(file);
    cmd += " --bs=";
    cmd += std::to_string(chunk >> 10);
    cmd += "k --iodepth=";
    cmd += std::to_string(depth);
    cmd += random ? " --rw=randread" : " --rw=read";
    cmd += " --size=";
    cmd += std::to_string(amount / chunk * chunk);
    cmd += " --runtime=";
    cmd += std::to_string(std::max(1, int(limit_s)));
    cmd += " 2>&1";
    std::printf("fio %s: %s\n", random ? "random" : "sequential", cmd.c_str());
    std::fflush(stdout);
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) {
        std::printf("  (cannot start fio: %s)\n", errno_text(errno).c_str());
        return;
    }
    char line[1024];
    bool any = false;
    while (std::fgets(line, sizeof line, p)) {
        const std::string_view l = line;
        if (l.find("IOPS=") != std::string_view::npos || l.find("READ:") != std::string_view::npos ||
            l.find("rror") != std::string_view::npos) {
            std::printf("  %s", line);
            any = true;
        }
    }
    const int rc = pclose(p);
    if (!any || rc != 0) std::printf("  (fio exited with status %d)\n", rc);
}

// ---------------------------------------------------------------------------------------------
int run(const cli::args& a) {
    auto file = a.require("file");
    if (!file) return usage_error(kName, file.message());
    const io_settings defaults{};
    auto depth = a.get_int("depth", defaults.depth);
    if (!depth) return usage_error(kName, depth.message());
    auto chunk_kib = a.get_int("chunk", defaults.chunk_kib);
    if (!chunk_kib) return usage_error(kName, chunk_kib.message());
    auto limit_s = a.get_double("seconds", 10);
    if (!limit_s) return usage_error(kName, limit_s.message());
    auto bytes_gib = a.get_double("bytes", 4);
    if (!bytes_gib) return usage_error(kName, bytes_gib.message());
    auto rounds = a.get_int("rounds", 3);
    if (!rounds) return usage_error(kName, rounds.message());
    if (*rounds < 1 || *rounds > 100) return usage_error(kName, "--rounds must be in 1..100");
    if (*depth < 1 || *depth > 4096) return usage_error(kName, "--depth must be in 1..4096");
    if (*chunk_kib < 4 || *chunk_kib % 4 != 0 || *chunk_kib > (1 << 20))
        return usage_error(kName, "--chunk must be a positive multiple of 4 KiB, at most 1 GiB");
    if (!(*limit_s > 0)) return usage_error(kName, "--seconds must be > 0");
    if (!(*bytes_gib > 0)) return usage_error(kName, "--bytes must be > 0");

    struct stat st {};
    if (::stat(file->c_str(), &st) != 0) return fail(kName, *file + ": " + errno_text(errno));
    if (!S_ISREG(st.st_mode) || st.st_size == 0) return fail(kName, *file + ": not a non-empty regular file");
    const auto file_size = uint64_t(st.st_size);
    const auto d = uint32_t(*depth);
    const uint64_t chunk = uint64_t(*chunk_kib) << 10;
    const uint64_t amount = std::min(file_size, uint64_t(*bytes_gib * double(uint64_t(1) << 30)));

    // Whether the file system takes O_DIRECT (tmpfs before 6.6, some FUSE file systems refuse).
    bool direct = true;
    std::string direct_note = "yes: reads bypass the page cache";
    if (int fd = ::open(file->c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT); fd >= 0) {
        ::close(fd);
    } else if (errno == EINVAL) {
        direct = false;
        direct_note = "no: the file system refuses it (EINVAL), so reads are buffered and may be page-cache hits";
    } else {
        return fail(kName, *file + ": " + errno_text(errno));
    }

    std::printf("bench io: %s (%.2f GiB), depth %u, chunk %llu KiB, %.2f GiB or %.0f s per measurement\n",
                file->c_str(), gib(file_size), d, static_cast<unsigned long long>(chunk >> 10), gib(amount), *limit_s);
    std::printf("O_DIRECT: %s\n", direct_note.c_str());
    std::printf(
        "note: a disk measurement needs a cold page cache; O_DIRECT bypasses it, but buffered reads and a\n"
        "      virtual disk cached by its host can still report memory speed. This command does not drop\n"
        "      caches (as root: sync; echo 3 > /proc/sys/vm/drop_caches).\n");
    std::fflush(stdout);

    const char* mode = direct ? "O_DIRECT" : "buffered";
    const auto w = make_workload(*file, file_size, amount);
    // A virtual disk's speed drifts over seconds; raw and engine measurements alternate over
    // several rounds, so drift shows as spread between rounds instead of biasing one side, and
    // the verdict uses the median round.
    std::vector<double> ratios;
    double raw_gb[2] = {0, 0}, raw_s[2] = {0, 0}, eng_gb = 0, eng_s = 0;
    for (int64_t round = 1; round <= *rounds; ++round) {
        measurement raw[2];
        for (int random = 0; random < 2; ++random) {
            auto m = raw_read(*file, file_size, direct, d, chunk, amount, *limit_s, random != 0);
            if (!m) return fail(kName, m.message());
            raw[random] = *m;
            raw_gb[random] += double(m->bytes) / 1e9;
            raw_s[random] += m->seconds;
            std::printf("round %lld: raw io_uring %s, %-10s %4llu KiB reads at depth %u: %.2f GiB in %.3f s = %.2f GB/s "
                        "(cpu %.2f s)\n",
                        static_cast<long long>(round), mode, random ? "random" : "sequential",
                        static_cast<unsigned long long>(chunk >> 10), d, gib(m->bytes), m->seconds, m->gbps(), m->cpu);
            std::fflush(stdout);  // phases take seconds; show progress when piped
        }
        auto e = engine_read(w, io::reader_options{.depth = d, .chunk_bytes = chunk, .direct = direct}, *limit_s);
        if (!e) return fail(kName, e.message());
        eng_gb += double(e->m.bytes) / 1e9;
        eng_s += e->m.seconds;
        const auto& s = e->stats;
        std::printf("round %lld: engine (uring_reader), %s, %s: %.2f GiB in %.3f s = %.2f GB/s (cpu %.2f s)\n",
                    static_cast<long long>(round), w.what.c_str(), e->fixed ? "registered buffers" : "unregistered buffers",
                    gib(e->m.bytes), e->m.seconds, e->m.gbps(), e->m.cpu);
        if (!e->notes.empty()) std::printf("  reader notes: %s\n", e->notes.c_str());
        std::printf("round %lld: engine reads in flight: mean %.1f over busy time (%.1f sampled at each submission and "
                    "completion), max %u of %u; busy %.3f s = %.2f GB/s while busy; %llu chunks, %llu resubmits\n",
                    static_cast<long long>(round), s.time_mean_in_flight, s.mean_in_flight, s.max_in_flight, d,
                    s.busy_seconds, s.bandwidth() / 1e9, static_cast<unsigned long long>(s.chunks_completed),
                    static_cast<unsigned long long>(s.resubmits));
        const double vs_random = raw[1].gbps() > 0 ? 100.0 * e->m.gbps() / raw[1].gbps() : 0;
        const double vs_seq = raw[0].gbps() > 0 ? 100.0 * e->m.gbps() / raw[0].gbps() : 0;
        std::printf("round %lld: engine / raw: %.0f%% of raw random, %.0f%% of raw sequential\n",
                    static_cast<long long>(round), vs_random, vs_seq);
        std::fflush(stdout);
        ratios.push_back(vs_random);
    }
    std::sort(ratios.begin(), ratios.end());
    const double median = ratios[ratios.size() / 2];
    std::printf("all rounds: raw sequential %.2f GB/s, raw random %.2f GB/s, engine %.2f GB/s\n",
                raw_gb[0] / std::max(raw_s[0], 1e-9), raw_gb[1] / std::max(raw_s[1], 1e-9), eng_gb / std::max(eng_s, 1e-9));
    std::printf("engine / raw random: median %.1f%% over %zu rounds (min %.1f%%, max %.1f%%; target >= 90%%)%s\n", median,
                ratios.size(), ratios.front(), ratios.back(), median >= 90 ? "" : "  BELOW TARGET");

    if (fio_on_path()) {
        run_fio(*file, false, d, chunk, amount, *limit_s);
        run_fio(*file, true, d, chunk, amount, *limit_s);
    } else {
        std::printf("fio: not on PATH, skipped (install fio to cross-check the raw figures)\n");
    }
    return 0;
}

const command kCommand{
    kName, "--file FILE [--depth N] [--chunk KiB] [--seconds S] [--bytes GiB] [--rounds N]",
    "Measures the raw O_DIRECT read bandwidth of the file system (a minimal io_uring loop, sequential and "
    "random, at the engine's chunk size and depth) and the engine reader's bandwidth on expert-sized requests "
    "over the same amount of data, and prints their ratio (target >= 90%) with the reads in flight. Runs fio "
    "with the same pattern when it is installed.",
    kOptions, run};
MS_REGISTER_COMMAND(kCommand);

}  // namespace
}  // namespace moestream::tools
