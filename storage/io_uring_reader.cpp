#include "storage/io_uring_reader.h"

#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

#include "config/assert.h"

namespace moestream::io {
namespace {

constexpr uint64_t kWakeTag = ~uint64_t(0);             // user_data of the eventfd poll
constexpr uint64_t kMaxFixedBuffer = uint64_t(1) << 30;  // the kernel's limit per registered buffer
constexpr uint32_t kMaxDepth = 4096;
constexpr uint64_t kMaxChunk = uint64_t(1) << 30;        // SQE lengths are 32-bit

uint64_t align_down(uint64_t v) { return v / kReadAlign * kReadAlign; }
uint64_t align_up(uint64_t v) { return (v + kReadAlign - 1) / kReadAlign * kReadAlign; }

std::string errno_text(int e) {
    std::string s = std::generic_category().message(e);
    s += " (errno ";
    s += std::to_string(e);
    s += ')';
    return s;
}

// "[offset, offset + bytes)" of a request, for messages.
std::string range_text(uint64_t offset, uint64_t bytes) {
    std::string s = "bytes [";
    s += std::to_string(offset);
    s += ", ";
    s += std::to_string(offset + bytes);
    s += ')';
    return s;
}

uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

struct file_state {
    std::string path;
    int fd = -1;
    uint64_t size = 0;
    std::atomic<bool> direct{false};  // read by direct() from any thread
    bool direct_ok = false;           // a direct read has succeeded (reaper only)
};

// A request between submit() and its callback (reaper only).
struct request_state {
    read_request r;
    uint64_t begin = 0, end = 0;  // aligned staging range (file offsets)
    uint64_t need_end = 0;        // r.offset + r.bytes: bytes past it are padding
    uint64_t next = 0;            // start of the next chunk not yet issued
    uint32_t outstanding = 0;     // chunks in the kernel or waiting to be sent again
    bool failed = false;
    std::string error;
};

// One chunk read; `pos` advances on short reads.
struct chunk {
    uint32_t req = 0;
    uint64_t pos = 0, end = 0;  // file offsets
    bool direct = false;        // the mode it was issued in (fallback detection)
};

struct fixed_region {
    uintptr_t base = 0;
    uint64_t bytes = 0;
    int index = 0;
};

}  // namespace

struct uring_reader::impl {
    reader_options opts;
    completion_fn on_complete;
    std::deque<file_state> files;  // deque: file_state holds an atomic and must not move
    io_uring ring{};
    bool ring_ok = false;
    int wake_fd = -1;

    // Shared with submitters, under `mu`.
    mutable std::mutex mu;
    std::condition_variable idle_cv;
    std::vector<read_request> pending;
    uint64_t submitted = 0, delivered = 0;
    bool stopping = false;
    bool any_submitted = false;
    std::atomic<bool> wake_pending{false};
    std::once_flag start_once;
    std::thread reaper;

    mutable std::mutex notes_mu;
    std::vector<std::string> notes;

    // Written once before the first submit() (which publishes it to the reaper through `mu`).
    std::vector<fixed_region> fixed;

    // Reaper-only state.
    std::vector<request_state> reqs;
    std::vector<uint32_t> free_reqs;
    std::deque<uint32_t> queue;  // requests with chunks not yet issued, in submission order
    std::deque<chunk> retry;     // remainders of short reads and -EAGAIN, sent before new chunks
    std::vector<chunk> slots;    // in-flight chunks by user_data
    std::vector<uint32_t> free_slots;
    std::vector<std::pair<uint64_t, status>> done;  // callbacks to deliver
    bool wake_armed = false;
    bool stop_seen = false;
    uint32_t cur = 0;  // chunks in flight
    uint64_t last_change_ns = 0;

    // Statistics (written by the reaper, read anywhere).
    std::atomic<uint64_t> st_bytes{0}, st_device_bytes{0}, st_requests{0}, st_errors{0}, st_chunks{0},
        st_resubmits{0}, st_queued{0}, st_sample_sum{0}, st_samples{0}, st_busy_ns{0}, st_integral{0},
        st_last_change{0};
    std::atomic<uint32_t> st_in_flight{0}, st_max_in_flight{0};

    ~impl() {
        for (auto& f : files)
            if (f.fd >= 0) ::close(f.fd);
        if (ring_ok) io_uring_queue_exit(&ring);
        if (wake_fd >= 0) ::close(wake_fd);
    }

    void note(std::string s) {
        std::lock_guard lk(notes_mu);
        notes.push_back(std::move(s));
    }

    void wake() {
        const uint64_t one = 1;
        // A full counter (EAGAIN) still wakes the poll, so the result needs no handling.
        [[maybe_unused]] auto n = ::write(wake_fd, &one, sizeof one);
    }

    // --- statistics -----------------------------------------------------------------------
    void set_in_flight(uint32_t n) {
        const uint64_t t = now_ns();
        if (cur > 0) {
            const uint64_t dt = t - last_change_ns;
            st_busy_ns.store(st_busy_ns.load(std::memory_order_relaxed) + dt, std::memory_order_relaxed);
            st_integral.store(st_integral.load(std::memory_order_relaxed) + dt * cur, std::memory_order_relaxed);
        }
        last_change_ns = t;
        cur = n;
        st_last_change.store(t, std::memory_order_relaxed);
        st_in_flight.store(n, std::memory_order_relaxed);
        if (n > st_max_in_flight.load(std::memory_order_relaxed)) st_max_in_flight.store(n, std::memory_order_relaxed);
        st_sample_sum.store(st_sample_sum.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
        st_samples.store(st_samples.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
    static void bump(std::atomic<uint64_t>& a, uint64_t by = 1) {
        a.store(a.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);  // single writer
    }

    // --- requests -------------------------------------------------------------------------
    void finish(uint64_t tag, status s) {
        if (!s.ok()) bump(st_errors);
        done.emplace_back(tag, std::move(s));
    }

    void accept(const read_request& r) {
        if (r.file >= files.size()) {
            std::string m = "read of ";
            m += range_text(r.offset, r.bytes);
            m += " names file index ";
            m += std::to_string(r.file);
            m += " but the reader has ";
            m += std::to_string(files.size());
            m += " file(s)";
            return finish(r.tag, make_error(std::move(m)));
        }
        if (r.offset > UINT64_MAX - r.bytes - kReadAlign) {
            std::string m = files[r.file].path;
            m += ": read range overflows (offset ";
            m += std::to_string(r.offset);
            m += ')';
            return finish(r.tag, make_error(std::move(m)));
        }
        if (r.bytes == 0) return finish(r.tag, {});
        uint32_t id;
        if (free_reqs.empty()) {
            id = uint32_t(reqs.size());
            reqs.emplace_back();
        } else {
            id = free_reqs.back();
            free_reqs.pop_back();
        }
        auto& q = reqs[id];
        q = request_state{};
        q.r = r;
        q.begin = align_down(r.offset);
        q.end = align_up(r.offset + r.bytes);
        q.need_end = r.offset + r.bytes;
        q.next = q.begin;
        queue.push_back(id);
        bump(st_queued, (q.end - q.begin + opts.chunk_bytes - 1) / opts.chunk_bytes);
    }

    void fail(request_state& q, std::string message) {
        if (q.failed) return;  // the first error is the one worth reporting
        q.failed = true;
        q.error = std::move(message);
    }

    void fail_errno(request_state& q, uint64_t at, int err) {
        std::string m = files[q.r.file].path;
        m += ": read of ";
        m += range_text(q.r.offset, q.r.bytes);
        m += " failed at offset ";
        m += std::to_string(at);
        m += ": ";
        m += errno_text(err);
        fail(q, std::move(m));
    }

    void fail_eof(request_state& q, uint64_t at) {
        const auto& f = files[q.r.file];
        std::string m = f.path;
        if (f.size < q.need_end) {  // the usual case: the request was wrong from the start
            m += ": ";
            m += range_text(q.r.offset, q.r.bytes);
            m += " extend past the end of the file (";
            m += std::to_string(f.size);
            m += " bytes)";
        } else {  // the file shrank after open(), or a read stopped early
            m += ": unexpected end of file at offset ";
            m += std::to_string(std::max(at, q.r.offset));
            m += " reading ";
            m += range_text(q.r.offset, q.r.bytes);
            m += " (file size at open: ";
            m += std::to_string(f.size);
            m += ')';
        }
        fail(q, std::move(m));
    }

    void maybe_complete(uint32_t id) {
        auto& q = reqs[id];
        if (q.outstanding > 0 || q.next < q.end) return;
        if (q.failed) {
            finish(q.r.tag, make_error(std::move(q.error)));
        } else {
            bump(st_bytes, q.r.bytes);
            finish(q.r.tag, {});
        }
        free_reqs.push_back(id);
    }

    void chunk_done(uint32_t id) {
        MS_ASSERT(reqs[id].outstanding > 0);
        --reqs[id].outstanding;
        maybe_complete(id);
    }

    // --- the ring -------------------------------------------------------------------------
    int fixed_index(const std::byte* dst, uint64_t len) const {
        const auto a = reinterpret_cast<uintptr_t>(dst);
        auto it = std::upper_bound(fixed.begin(), fixed.end(), a,
                                   [](uintptr_t v, const fixed_region& f) { return v < f.base; });
        if (it == fixed.begin()) return -1;
        --it;
        return a + len <= it->base + it->bytes ? it->index : -1;
    }

    void arm_wake() {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring);
        MS_ASSERT_MSG(sqe, "the ring has room for the wake poll");  // it is sized depth + 1
        io_uring_prep_poll_add(sqe, wake_fd, POLLIN);
        io_uring_sqe_set_data64(sqe, kWakeTag);
        wake_armed = true;
    }

    // Takes what submit() queued; on shutdown cancels everything not yet in the kernel.
    void on_wake() {
        wake_armed = false;
        // Order matters: reset the counter, then clear the flag, then take the queue. A submit()
        // that still saw the flag set pushed its requests before, so the take below gets them;
        // one that sees it clear writes the eventfd after our read, so the re-armed poll fires.
        // (Clearing first would let such a write be swallowed by the read while the flag stays
        // set, and every later submit() would skip the wake-up: a lost wake-up.)
        uint64_t v;
        [[maybe_unused]] auto n = ::read(wake_fd, &v, sizeof v);
        wake_pending.store(false);
        std::vector<read_request> taken;
        bool stop;
        {
            std::lock_guard lk(mu);
            taken.swap(pending);
            stop = stopping;
        }
        for (const auto& r : taken) accept(r);
        if (!stop) return arm_wake();
        // Requests whose chunks are all in the kernel finish normally; the others stop here.
        stop_seen = true;
        const auto cancel = [this](uint32_t id) {
            auto& q = reqs[id];
            std::string m = files[q.r.file].path;
            m += ": read of ";
            m += range_text(q.r.offset, q.r.bytes);
            m += " cancelled: the reader is shutting down";
            fail(q, std::move(m));
        };
        for (uint32_t id : queue) cancel(id);
        for (const auto& c : retry) cancel(c.req);
    }

    // Prepares SQEs until `depth` chunks are in flight or nothing is left to send.
    void fill() {
        while (!free_slots.empty()) {
            chunk c;
            if (!retry.empty()) {
                c = retry.front();
                retry.pop_front();
                if (reqs[c.req].failed) {  // no point finishing a failed request's reads
                    chunk_done(c.req);
                    continue;
                }
            } else if (!queue.empty()) {
                const uint32_t id = queue.front();
                auto& q = reqs[id];
                if (q.failed) {
                    bump_queued_down((q.end - q.next + opts.chunk_bytes - 1) / opts.chunk_bytes);
                    q.next = q.end;
                    queue.pop_front();
                    maybe_complete(id);
                    continue;
                }
                c.req = id;
                c.pos = q.next;
                c.end = std::min(q.end, q.next + opts.chunk_bytes);
                q.next = c.end;
                ++q.outstanding;
                if (q.next >= q.end) queue.pop_front();
                bump_queued_down(1);
            } else {
                break;
            }
            io_uring_sqe* sqe = io_uring_get_sqe(&ring);
            if (!sqe) {  // the SQ still holds entries a failed submit left behind
                retry.push_front(c);
                break;
            }
            const auto& q = reqs[c.req];
            const auto& f = files[q.r.file];
            c.direct = f.direct.load(std::memory_order_relaxed);
            std::byte* dst = q.r.dst + (c.pos - q.begin);
            const auto len = unsigned(c.end - c.pos);
            const int idx = fixed_index(dst, len);
            if (idx >= 0)
                io_uring_prep_read_fixed(sqe, f.fd, dst, len, c.pos, idx);
            else
                io_uring_prep_read(sqe, f.fd, dst, len, c.pos);
            const uint32_t slot = free_slots.back();
            free_slots.pop_back();
            slots[slot] = c;
            io_uring_sqe_set_data64(sqe, slot);
            set_in_flight(cur + 1);
        }
    }

    void bump_queued_down(uint64_t by) {
        const uint64_t q = st_queued.load(std::memory_order_relaxed);
        st_queued.store(q > by ? q - by : 0, std::memory_order_relaxed);
    }

    // O_DIRECT refused on the first read: read this file through the page cache from now on.
    void fall_back_to_buffered(file_state& f) {
        if (!f.direct.load()) return;  // another chunk of the same file got here first
        const int fl = fcntl(f.fd, F_GETFL);
        if (fl >= 0 && fcntl(f.fd, F_SETFL, fl & ~O_DIRECT) == 0) {
            f.direct.store(false);
            std::string m = f.path;
            m += ": O_DIRECT refused by the file system (EINVAL on the first read); reading it buffered";
            note(std::move(m));
        }
    }

    void on_cqe(uint64_t slot, int res) {
        MS_ASSERT(slot < slots.size());
        chunk c = slots[slot];
        free_slots.push_back(uint32_t(slot));
        set_in_flight(cur - 1);
        auto& q = reqs[c.req];
        auto& f = files[q.r.file];
        if (res == -EAGAIN || res == -EINTR) {
            bump(st_resubmits);
            retry.push_back(c);
            return;
        }
        if (res == -EINVAL && c.direct && !f.direct_ok) {
            fall_back_to_buffered(f);
            if (!f.direct.load()) {
                bump(st_resubmits);
                retry.push_back(c);
                return;
            }
        }
        if (res < 0) {
            fail_errno(q, c.pos, -res);
            return chunk_done(c.req);
        }
        if (res == 0) {
            fail_eof(q, c.pos);
            return chunk_done(c.req);
        }
        bump(st_device_bytes, uint64_t(res));
        if (c.direct) f.direct_ok = true;
        c.pos += uint64_t(res);
        // Bytes past the request's end are alignment padding: a read that stops at EOF there
        // is complete.
        if (c.pos >= std::min(c.end, q.need_end)) {
            bump(st_chunks);
            return chunk_done(c.req);
        }
        // O_DIRECT cannot continue from an unaligned offset, and only EOF stops it there.
        if (c.direct && c.pos % kReadAlign != 0) {
            fail_eof(q, c.pos);
            return chunk_done(c.req);
        }
        bump(st_resubmits);
        retry.push_back(c);
    }

    void deliver() {
        if (done.empty()) return;
        for (auto& [tag, s] : done) on_complete(tag, s);
        const uint64_t n = done.size();
        done.clear();
        bump(st_requests, n);
        {
            std::lock_guard lk(mu);
            delivered += n;
        }
        idle_cv.notify_all();
    }

    bool has_work() const { return cur > 0 || !queue.empty() || !retry.empty(); }

    void run() {
        arm_wake();
        bool submit_failed = false;
        for (;;) {
            fill();
            const int s = io_uring_submit(&ring);
            // A refused submit (e.g. -ENOMEM, -EBUSY) leaves the SQEs in the ring; try again
            // shortly rather than sleeping on completions that may never come.
            submit_failed = s < 0 && s != -EINTR;
            deliver();
            if (stop_seen && !has_work() && !wake_armed) break;
            io_uring_cqe* cqe = nullptr;
            int w;
            if (submit_failed) {
                __kernel_timespec ts{0, 1000000};
                w = io_uring_wait_cqe_timeout(&ring, &cqe, &ts);
            } else {
                w = io_uring_wait_cqe(&ring, &cqe);
            }
            if (w < 0 && w != -EINTR && w != -ETIME && w != -EAGAIN) {
                // Not expected from a healthy ring; back off instead of spinning.
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            unsigned head, n = 0;
            io_uring_for_each_cqe(&ring, head, cqe) {
                ++n;
                const uint64_t ud = io_uring_cqe_get_data64(cqe);
                if (ud == kWakeTag)
                    on_wake();
                else
                    on_cqe(ud, cqe->res);
            }
            io_uring_cq_advance(&ring, n);
        }
    }
};

// ---------------------------------------------------------------------------------------------

uring_reader::uring_reader(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

result<std::unique_ptr<uring_reader>> uring_reader::open(std::vector<std::string> paths, reader_options opts,
                                                         completion_fn on_complete) {
    if (opts.depth == 0 || opts.depth > kMaxDepth)
        return make_error("io_uring reader: depth must be in 1..4096");
    if (opts.chunk_bytes == 0 || opts.chunk_bytes % kReadAlign != 0 || opts.chunk_bytes > kMaxChunk)
        return make_error("io_uring reader: chunk size must be a positive multiple of 4096, at most 1 GiB");
    if (paths.empty()) return make_error("io_uring reader: no files");
    MS_ASSERT(on_complete);

    auto p = std::make_unique<impl>();
    p->opts = opts;
    p->on_complete = std::move(on_complete);
    for (auto& path : paths) {
        auto& f = p->files.emplace_back();
        f.path = std::move(path);
        int fd = -1, err = 0;
        if (opts.direct) {
            fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
            err = fd < 0 ? errno : 0;
            if (fd >= 0) {
                f.direct.store(true);
            } else if (err == EINVAL) {
                std::string m = f.path;
                m += ": O_DIRECT refused by the file system (EINVAL at open); reading it buffered";
                p->note(std::move(m));
            }
        }
        if (fd < 0 && (!opts.direct || err == EINVAL)) {
            fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
            err = fd < 0 ? errno : 0;
        }
        if (fd < 0) {
            std::string m = "cannot open ";
            m += f.path;
            m += ": ";
            m += errno_text(err);
            return make_error(std::move(m));
        }
        f.fd = fd;
        struct stat st {};
        if (fstat(fd, &st) != 0) {
            std::string m = "cannot stat ";
            m += f.path;
            m += ": ";
            m += errno_text(errno);
            return make_error(std::move(m));
        }
        f.size = uint64_t(st.st_size);
    }

    p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->wake_fd < 0) {
        std::string m = "io_uring reader: eventfd: ";
        m += errno_text(errno);
        return make_error(std::move(m));
    }

    // Room for every chunk in flight plus the wake poll; the CQ is twice that, so it never
    // overflows.
    unsigned entries = 1;
    while (entries < opts.depth + 1) entries <<= 1;
    io_uring_params params{};
    // COOP_TASKRUN: completions are only processed when the reaper enters the kernel (it is the
    // only thread that does), sparing interrupts. Older kernels refuse the flags: retry without.
    params.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL;
    int rc = io_uring_queue_init_params(entries, &p->ring, &params);
    if (rc == -EINVAL) {
        params = io_uring_params{};
        rc = io_uring_queue_init_params(entries, &p->ring, &params);
    }
    if (rc < 0) {
        std::string m = "io_uring unavailable: io_uring_queue_init: ";
        m += errno_text(-rc);
        return make_error(std::move(m));
    }
    p->ring_ok = true;
    p->slots.resize(opts.depth);
    for (uint32_t i = opts.depth; i-- > 0;) p->free_slots.push_back(i);
    return std::unique_ptr<uring_reader>(new uring_reader(std::move(p)));
}

uring_reader::~uring_reader() {
    auto& p = *impl_;
    bool started;
    {
        std::lock_guard lk(p.mu);
        p.stopping = true;
        started = p.reaper.joinable();
    }
    if (started) {
        p.wake();
        p.reaper.join();
    }
}

status uring_reader::register_buffers(std::span<const std::span<std::byte>> regions) {
    auto& p = *impl_;
    {
        std::lock_guard lk(p.mu);
        // The reaper starts with the first submit(); registering before it keeps the ring idle
        // (older kernels quiesce the ring to register, which would wait on the armed wake poll).
        MS_ASSERT_MSG(!p.any_submitted, "register_buffers() after submit()");
    }
    MS_ASSERT_MSG(p.fixed.empty(), "register_buffers() called twice");
    std::vector<iovec> iov;
    std::vector<fixed_region> table;
    for (auto r : regions) {
        for (uint64_t at = 0; at < r.size(); at += kMaxFixedBuffer) {
            const uint64_t n = std::min<uint64_t>(kMaxFixedBuffer, r.size() - at);
            iov.push_back({r.data() + at, size_t(n)});
            table.push_back({reinterpret_cast<uintptr_t>(r.data() + at), n, int(table.size())});
        }
    }
    if (iov.empty()) return {};
    const int rc = io_uring_register_buffers(&p.ring, iov.data(), unsigned(iov.size()));
    if (rc < 0) {
        std::string m = "io_uring: cannot register ";
        m += std::to_string(iov.size());
        m += " buffer(s): ";
        m += errno_text(-rc);
        if (rc == -ENOMEM) m += " (registered buffers count against RLIMIT_MEMLOCK without CAP_IPC_LOCK)";
        return make_error(std::move(m));
    }
    std::sort(table.begin(), table.end(), [](const auto& a, const auto& b) { return a.base < b.base; });
    p.fixed = std::move(table);
    return {};
}

void uring_reader::submit(std::span<const read_request> requests) {
    auto& p = *impl_;
    if (requests.empty()) return;
    for (const auto& r : requests) {
        MS_ASSERT_MSG(r.bytes == 0 || r.dst, "read_request::dst is null");
        MS_ASSERT_MSG(reinterpret_cast<uintptr_t>(r.dst) % kReadAlign == 0, "read_request::dst is not 4 KiB aligned");
    }
    std::call_once(p.start_once, [&p] {
        std::lock_guard lk(p.mu);
        p.reaper = std::thread([&p] { p.run(); });
    });
    {
        std::lock_guard lk(p.mu);
        MS_ASSERT_MSG(!p.stopping, "submit() during destruction");
        p.any_submitted = true;
        p.pending.insert(p.pending.end(), requests.begin(), requests.end());
        p.submitted += requests.size();
    }
    if (!p.wake_pending.exchange(true)) p.wake();
}

void uring_reader::wait_idle() {
    auto& p = *impl_;
    std::unique_lock lk(p.mu);
    p.idle_cv.wait(lk, [&p] { return p.delivered == p.submitted; });
}

bool uring_reader::idle() const {
    std::lock_guard lk(impl_->mu);
    return impl_->delivered == impl_->submitted;
}

reader_stats uring_reader::stats() const {
    const auto& p = *impl_;
    const auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    reader_stats s;
    s.bytes_read = ld(p.st_bytes);
    s.device_bytes = ld(p.st_device_bytes);
    s.requests_completed = ld(p.st_requests);
    s.errors = ld(p.st_errors);
    s.chunks_completed = ld(p.st_chunks);
    s.resubmits = ld(p.st_resubmits);
    s.queued_chunks = ld(p.st_queued);
    s.in_flight = p.st_in_flight.load(std::memory_order_relaxed);
    s.max_in_flight = p.st_max_in_flight.load(std::memory_order_relaxed);
    const uint64_t samples = ld(p.st_samples);
    s.mean_in_flight = samples ? double(ld(p.st_sample_sum)) / double(samples) : 0;
    // Count the busy interval that is still open.
    uint64_t busy = ld(p.st_busy_ns), integral = ld(p.st_integral);
    if (s.in_flight > 0) {
        const uint64_t t = now_ns(), last = ld(p.st_last_change);
        if (t > last) {
            busy += t - last;
            integral += (t - last) * s.in_flight;
        }
    }
    s.busy_seconds = double(busy) * 1e-9;
    s.time_mean_in_flight = busy ? double(integral) / double(busy) : 0;
    return s;
}

std::string uring_reader::notes() const {
    std::lock_guard lk(impl_->notes_mu);
    std::string out;
    for (const auto& n : impl_->notes) {
        if (!out.empty()) out += '\n';
        out += n;
    }
    return out;
}

bool uring_reader::direct(uint32_t file) const {
    MS_ASSERT(file < impl_->files.size());
    return impl_->files[file].direct.load();
}

size_t uring_reader::file_count() const { return impl_->files.size(); }

uint64_t uring_reader::file_size(uint32_t file) const {
    MS_ASSERT(file < impl_->files.size());
    return impl_->files[file].size;
}

const reader_options& uring_reader::options() const { return impl_->opts; }

}  // namespace moestream::io
