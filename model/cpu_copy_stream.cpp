// The CPU backend's copy stream: its ops run to completion before they return, so a fill
// copies at once on the calling thread and nothing needs an event. The device tier's pipeline
// (scheduler/device_experts) then runs unchanged on the CPU, which is how the CPU tests check
// its bookkeeping (joins, pins, slot reuse, completions on the strand).
#include <cstring>

#include "model/cpu_backend.h"

namespace moestream {
namespace {

class cpu_copy_stream final : public copy_stream {
  public:
    explicit cpu_copy_stream(copy_stream_options opts) : opts_(std::move(opts)) {}
    void mark_ops(int e) override { MS_ASSERT(e >= 0 && e < opts_.events); }
    void fill(int e, std::span<const int> after, std::span<const copy_piece> pieces,
              std::span<const weight_view> tile) override {
        MS_ASSERT(e >= 0 && e < opts_.events);
        MS_ASSERT_MSG(tile.empty(), "the CPU backend does not tile MXFP4 weights");
        for (int a : after) MS_ASSERT(a >= 0 && a < opts_.events);  // marks of ops that have finished
        for (const copy_piece& p : pieces) std::memcpy(p.dst, p.src, p.bytes);
        opts_.copied(e);  // the copies have finished: the sources may be reused
    }

  private:
    copy_stream_options opts_;
};

}  // namespace

result<std::unique_ptr<copy_stream>> cpu_backend::make_copy_stream(copy_stream_options opts) {
    if (opts.events < 1) return make_error("a copy stream needs at least one event");
    if (!opts.copied) return make_error("a copy stream needs a completion callback");
    return std::unique_ptr<copy_stream>(std::make_unique<cpu_copy_stream>(std::move(opts)));
}

}  // namespace moestream
