// One layout for an expert's slot in both tiers that hold experts whole: the host tier's pinned
// slots (tiered_experts) and the device tier's VRAM slots (device_experts). Each part (gate, up,
// down) starts at the same offset in both, so an upload is one copy of a slot's span, not three,
// and experts in consecutive slots of both tiers merge into one copy: the bus's per-copy cost
// is paid once (scheduler/device_experts.cpp: add_piece).
#pragma once

#include <array>
#include <cstdint>

#include "storage/io_uring_reader.h"

namespace moestream {

struct expert_slot_layout {
    std::array<uint64_t, 3> part_offset{};  // gate, up, down from the slot's start
    uint64_t slot_bytes = 0;
};

// `part_max`: the largest gate, up and down of any expert layer (target and draft), in bytes.
// Each part gets the room of an O_DIRECT read of it: reads start at the 4 KiB boundary below the
// part's file offset, so the part lands up to kReadAlign - 1 bytes in (none for the converter's
// 4 KiB-aligned tensors). Offsets are multiples of kReadAlign, so the device's kernels, which
// need 256-byte alignment, read the parts in place.
inline expert_slot_layout slot_layout_for(const std::array<uint64_t, 3>& part_max) {
    expert_slot_layout l;
    for (int p = 0; p < 3; ++p) {
        l.part_offset[size_t(p)] = l.slot_bytes;
        l.slot_bytes += (part_max[size_t(p)] + 2 * io::kReadAlign - 1) / io::kReadAlign * io::kReadAlign;
    }
    return l;
}

}  // namespace moestream
