// Asynchronous reads of byte ranges of model shards into host memory, through one io_uring.
//
// Why this shape (../shared/docs/streaming-anchors.md sections 2.5, 3, 5.1): the drive reaches its
// bandwidth only at depth (10 GB/s at QD 6, 11.4 at QD 16), and a decode layer produces only a
// handful of expert misses. So every request is cut into chunks (256 KiB..2 MiB) and all chunks of
// everything submitted are queued at once; the reader keeps `depth` of them in flight, refilling
// as completions arrive. O_DIRECT (a measured +113% on expert reads) avoids the page cache, which
// would otherwise compete with the pinned host tier. Reads land in registered (fixed) buffers
// when the destination lies in one, which saves the kernel pinning pages per read.
//
// Layout of a destination: O_DIRECT needs offset, length and address aligned to 4 KiB, and
// expert slices of small models are not. The reader reads the covering aligned range
// [offset & ~4095, round_up(offset + bytes, 4096)) to `dst`, so the requested bytes start at
// data_pointer(dst, offset) = dst + offset % 4096 and `dst` needs staging_bytes(offset, bytes)
// bytes of room. Buffered reads (direct = false, or a file system that refuses O_DIRECT) use the
// same layout, so callers never care which path ran. Bytes of the staging range outside
// [offset, offset + bytes) are unspecified.
//
// Threading and thread-safety contract:
//  - One dedicated reaper thread owns the ring: it prepares and submits every SQE and reaps
//    every CQE. It sleeps in io_uring_submit_and_wait(); submit() and the destructor wake it
//    through an eventfd that the ring polls, so there is a single place to wait (this is the
//    shape an event loop can later take over).
//  - submit(), stats(), notes(), idle() and wait_idle() are thread-safe and may be called from
//    any thread, including from inside a completion callback.
//  - The completion callback runs on the reaper thread, once per submitted request, after all
//    bytes of the request have landed (or it failed; on failure the destination's contents are
//    unspecified). It must be quick (the ring is not refilled while it runs), must not throw,
//    and must not destroy the reader. The destination must stay valid until its callback ran.
//  - register_buffers() must be called before the first submit(), at most once.
//  - The destructor stops issuing queued chunks, waits for the chunks already in the kernel
//    (the kernel may still be writing into caller memory, so it never abandons them), then
//    delivers a "cancelled" error to every request that did not finish, and joins the reaper.
//    So every submitted request gets exactly one callback, and the callback must stay callable
//    until the destructor returns. Do not call submit() concurrently with the destructor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/result.h"

namespace moestream::io {

inline constexpr uint64_t kReadAlign = 4096;

struct reader_options {
    uint32_t depth = 64;                 // chunk reads in flight at most (io_settings::depth)
    uint64_t chunk_bytes = 1024 * 1024;  // reads are split into chunks of this size (multiple of 4096)
    bool direct = true;                  // O_DIRECT, falling back to buffered per file when refused
};

struct read_request {
    uint32_t file = 0;       // index into the paths given to open()
    uint64_t offset = 0;     // absolute file offset, any alignment
    uint64_t bytes = 0;      // 0 completes at once, successfully
    std::byte* dst = nullptr;  // 4 KiB aligned, room for staging_bytes(offset, bytes)
    uint64_t tag = 0;        // handed back to the completion callback
};

// Called on the reaper thread once per request: its tag and the outcome. An error's message
// names the file, the range and the errno text.
using completion_fn = std::function<void(uint64_t tag, const status& outcome)>;

// A consistent-enough snapshot (each field is read atomically, not all together).
struct reader_stats {
    uint64_t bytes_read = 0;          // payload bytes (sum of `bytes`) of requests that succeeded
    uint64_t device_bytes = 0;        // bytes the kernel delivered, including alignment padding
    uint64_t requests_completed = 0;  // callbacks delivered, failed ones included
    uint64_t errors = 0;              // requests that completed with an error
    uint64_t chunks_completed = 0;    // chunk reads fully done
    uint64_t resubmits = 0;           // short reads, -EAGAIN and -EINTR sent again
    uint32_t in_flight = 0;           // chunk reads in the kernel now
    uint32_t max_in_flight = 0;
    uint64_t queued_chunks = 0;       // chunks waiting for a free slot (approximate)
    double mean_in_flight = 0;        // sampled after every submission and every completion
    double time_mean_in_flight = 0;   // time-weighted over busy time (Little's law depth)
    double busy_seconds = 0;          // wall time with >= 1 read in flight
    double bandwidth() const { return busy_seconds > 0 ? double(device_bytes) / busy_seconds : 0; }
};

class uring_reader {
public:
    // Opens every path (O_DIRECT when opts.direct) and starts the reaper thread. Errors: a path
    // that cannot be opened, bad options, or io_uring unavailable (the message then starts with
    // "io_uring unavailable" and carries the errno text, e.g. in a seccomp sandbox).
    static result<std::unique_ptr<uring_reader>> open(std::vector<std::string> paths, reader_options opts,
                                                      completion_fn on_complete);

    ~uring_reader();
    uring_reader(const uring_reader&) = delete;
    uring_reader& operator=(const uring_reader&) = delete;

    // Registers the regions reads will land in (the host tier's slot arenas) as fixed buffers;
    // afterwards every chunk whose destination lies inside one region uses IORING_OP_READ_FIXED.
    // Regions over 1 GiB are split (the kernel's limit per buffer). On error (e.g. RLIMIT_MEMLOCK
    // without CAP_IPC_LOCK) nothing is registered and the reader keeps working with plain reads.
    status register_buffers(std::span<const std::span<std::byte>> regions);

    // Queues every chunk of every request, in request order, and returns at once. Contract
    // violations (null or unaligned dst) assert; a bad file index completes that request with
    // an error through the callback.
    void submit(std::span<const read_request> requests);

    // Blocks until every request submitted so far has had its callback (tests, benchmarks).
    void wait_idle();
    bool idle() const;

    reader_stats stats() const;
    // Things worth telling the operator once, e.g. "m.gguf: O_DIRECT refused by the file system
    // (EINVAL at open); reading it buffered". Empty when there is nothing to say.
    std::string notes() const;
    // Whether reads of `file` currently bypass the page cache.
    bool direct(uint32_t file) const;
    size_t file_count() const;
    uint64_t file_size(uint32_t file) const;  // at open time
    const reader_options& options() const;

    // Bytes `dst` must have room for to receive [offset, offset + bytes).
    static uint64_t staging_bytes(uint64_t offset, uint64_t bytes) {
        return (offset % kReadAlign + bytes + kReadAlign - 1) / kReadAlign * kReadAlign;
    }
    // Where the requested bytes start inside `dst`.
    static std::byte* data_pointer(std::byte* dst, uint64_t offset) { return dst + offset % kReadAlign; }

    struct impl;

private:
    explicit uring_reader(std::unique_ptr<impl> p);
    std::unique_ptr<impl> impl_;
};

}  // namespace moestream::io
