// The dense weights (everything but the routed experts and the engram tables) in a backend's
// memory, uploaded once at load: the model's views then point there. A device backend always
// does this; the CPU backend when it streams (serving must not read the mapping, which a file
// truncated under it turns into SIGBUS), else it reads the mapping in place. The engram tables
// stay with the host, which reads their rows for each step.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "config/result.h"
#include "model/arch/deepseek41.h"
#include "model/backend.h"
#include "scheduler/model_loader.h"

namespace moestream {

struct device_weights {
    backend_array<std::byte> memory;
    dsv41::model_weights weights;
    std::optional<dsv41::draft_weights> draft;
};

// Bytes the dense weights take in a backend (alignment included), for start-up planning.
size_t dense_weight_bytes(const loaded_model& m);

// One allocation holding every dense tensor of m (and its draft); errors when the backend has
// no room, naming the size.
result<std::unique_ptr<device_weights>> upload_dense_weights(backend& be, const loaded_model& m);

// q8_0_tiles::tile_matrix over up to `threads` threads, each a run of whole strips (a strip is
// tiled alone: q8_0_tiles.h), as the upload tiles the dense Q8_0 matrices at start-up.
void tile_q8_0_on_threads(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols, int threads);

}  // namespace moestream
