// Engram rows read from disk ahead of use (issue: expert streaming, "engram tables"): the tables
// (2 x 101 GB on the real model) are never loaded whole or mapped into the working set. A forward
// announces every row it will read before its first layer (row ids depend only on token ids);
// each row's values and scales are read with O_DIRECT into a staging arena, so by the time the
// engram layers run (1 and 14 of 40) the rows are normally there and row() does not wait.
// A forward that announces more rows than the arena holds (a long prefill: 2,048 tokens of mini
// are 32k rows) has them read in windows: the arena takes the announced rows in the order the
// forward reads them (each engram layer's rows, row by row), and when the forward reaches a row
// past the current window the arena is refilled with the next `slots` rows at once (the forward
// has copied every row it got: the interface's contract when a source has no room). Reading
// those one at a time on demand made a 2,048-token prefill wait 6.7 s for its 9 uploads on the
// H200, with the disk almost idle. The reads of a batch of rows are coalesced: their 4 KiB pages
// sorted by offset, overlapping and adjacent ones joined into one read (a table of a small model
// is then read nearly sequentially; random 4 KiB reads left the virtio disk at ~25k reads a
// second). A row asked for out of the announced order is read alone into one reserved slot. Nothing reads the memory mapping: a model file truncated or replaced under a
// server gives read errors naming the file, never a SIGBUS.
//
// Tables that fit `resident_max_bytes` (a small model's: mini's two are 70 MB) are read whole into
// RAM at start-up instead, sequentially through the same reader, and rows are served from there:
// on the H200's virtio disk the random 4 KiB reads of a 2,048-token prefill of mini-lite took
// ~2 s at ~30k reads a second, its tables sequentially ~40 ms. Nothing is read of the file
// after that (a truncated file cannot fail their rows).
//
// The forward (a coroutine) asks row_ready() before each row(): a row on its way suspends it, and
// the read's completion wakes it, so no thread waits for an engram read (issue 15); row() alone
// still waits, for callers outside a coroutine. end_forward() waits for reads in flight, which
// only a forward that failed midway leaves behind.
//
// Thread safety: prefetch/row_ready/row/end_forward from the forward's thread (one forward at a
// time); completions on the reader's, which run the wakes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "scheduler/model_loader.h"
#include "storage/aligned_buffer.h"
#include "storage/io_uring_reader.h"

namespace moestream {

struct engram_stream_options {
    uint32_t slots = 4096;  // rows one forward can have in flight (2 x 8 KiB staging each)
    io::reader_options io{64, 64 * 1024, true};
    // Tables of at most this many bytes in all (and at most an eighth of the memory available at
    // start-up) are kept in RAM; 0: always streamed.
    uint64_t resident_max_bytes = uint64_t(4) << 30;
    // Test hook: microseconds to hold back a read's completion (asked on the reader's thread for
    // each completion; 0: none). Timing only: results must not move.
    std::function<uint32_t()> inject_delay_us;
};

struct engram_counters {
    uint64_t rows_requested = 0;  // row() calls
    uint64_t rows_read = 0;       // distinct rows read from disk
    uint64_t bytes_read = 0;      // payload bytes (values + scales)
    uint64_t overflow = 0;        // rows read after the forward reached them (refills, out-of-order rows)
    uint64_t refills = 0;         // arena refills with the next window of announced rows
    uint64_t disk_reads = 0;      // reads issued (coalesced: one covers neighbouring rows)
    uint64_t resident_bytes = 0;  // the tables' bytes held in RAM (0: streamed)
    uint64_t waits = 0;           // rows the forward had to wait for (row() or row_ready())
    double wait_seconds = 0;
};

class engram_stream final : public dsv41::engram_source {
  public:
    static result<std::unique_ptr<engram_stream>> create(const loaded_model& m, engram_stream_options opts);
    ~engram_stream() override;

    void prefetch(int engram_index, std::span<const int64_t> rows) override;
    result<dsv41::engram_row> row(int engram_index, int64_t row) override;
    bool row_ready(int engram_index, int64_t row, std::function<void()> wake) override;
    void end_forward() override;

    engram_counters counters() const;

  private:
    struct table {
        io::read_request values, scales;  // file, offset of row 0; bytes of one row
        uint64_t rows = 0;
        const std::byte *resident_values = nullptr, *resident_scales = nullptr;  // row 0 in RAM, when resident
    };
    // One read of the window: a run of pages holding parts of one or more rows.
    struct extent_state {
        bool done = false, failed = false;
        std::string error;
    };
    // Where a slot's row lies: its values' and scales' bytes in the arena, and their reads.
    struct row_place {
        uint32_t value_extent = 0, scale_extent = 0;
        uint64_t value_at = 0, scale_at = 0;
    };
    // A part (values or scales) of a row the next reads must bring.
    struct part {
        uint32_t file;
        uint64_t offset, bytes;
        uint32_t slot;
        bool scales;
    };
    static constexpr uint64_t kWindow = 8192;  // arena bytes a part may need (a row part within two pages)

    explicit engram_stream(engram_stream_options opts) : opts_(std::move(opts)) {}
    void on_read(uint64_t tag, const status& st);
    // inject_delay_us: completions held back, delivered by a thread of their own at their time.
    void hold(uint64_t tag, const status& st, uint32_t us);
    void deliver_held();
    // Gives the forward's next row (engram layer e, the next announced position) its slot, after
    // starting any read it needs, and counts it consumed; -1, changing nothing, when that needs
    // the window's reads to land first (a refill) and `may_wait` is false.
    int64_t place(std::unique_lock<std::mutex>& lock, int engram_index, int64_t row, bool may_wait);
    bool landed(uint32_t slot) const {
        const row_place& pl = places_[slot];
        return extents_[pl.value_extent].done && extents_[pl.scale_extent].done;
    }
    // Gives free slots to engram layer e's announced rows from assigned_[e] on (a repeated row of
    // the window shares its slot); their parts go into `parts`.
    void assign(int e, std::vector<part>& parts);
    // The coalesced reads of `parts` (the arena's next bytes), into `batch`.
    void plan_reads(std::vector<part>& parts, std::vector<io::read_request>& batch);
    // Counts the window's rows and frees the arena; every read into it must have landed.
    void retire_window();
    // Reads every table whole into resident_ (at start-up, before any other read).
    status load_resident();
    void add_parts(const table& t, int64_t row, uint32_t slot, std::vector<part>& parts) const;
    uint32_t reserved_slot() const { return opts_.slots; }

    engram_stream_options opts_;
    std::vector<table> tables_;
    io::aligned_buffer arena_;
    io::aligned_buffer resident_;  // the tables, when they are kept in RAM
    std::unique_ptr<io::uring_reader> reader_;
    struct held_completion {
        std::chrono::steady_clock::time_point at;
        uint64_t tag;
        status outcome;
    };
    std::mutex held_mu_;
    std::condition_variable held_cv_;
    std::vector<held_completion> held_;
    bool held_stop_ = false;
    std::thread held_thread_;  // with inject_delay_us only

    mutable std::mutex mu_;
    std::condition_variable arrived_;
    std::unordered_map<uint64_t, uint32_t> slot_of_;  // (engram index, row) -> slot, this window
    // Per engram layer, this forward: the announced rows in reading order, how many of them were
    // given a slot (in this window or an earlier one), and how many row() has read.
    std::vector<std::vector<int64_t>> announced_;
    std::vector<size_t> assigned_, consumed_;
    std::vector<row_place> places_;      // opts_.slots announced rows, then the reserved slot
    std::vector<extent_state> extents_;  // the window's reads (at most two a slot), then the reserved slot's two
    uint32_t used_ = 0;                  // slots of the window
    uint32_t extents_used_ = 0;
    uint64_t arena_used_ = 0;            // bytes of the window's reads
    uint64_t in_flight_parts_ = 0;       // reads submitted, not completed
    // The row row_ready() placed, which the next row() takes (the forward asks for it again).
    struct placed_row {
        int engram_index;
        int64_t row;
        uint32_t slot;
        bool waited;
        std::chrono::steady_clock::time_point since;
    };
    std::optional<placed_row> placed_;
    // Wakes row_ready() left: for a slot's reads (slot >= 0), or for every read to land (-1).
    struct waker {
        int64_t slot;
        std::function<void()> wake;
    };
    std::vector<waker> wakers_;
    engram_counters counters_;
};

}  // namespace moestream
