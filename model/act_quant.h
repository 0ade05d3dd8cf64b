// Simulation of the reference's low-precision activations (dsv41-architecture.md §3.8), used by
// the optional `--act-quant reference` mode: values are quantised and dequantised in place
// (results rounded to bf16), so the fp32 kernels then see exactly what the reference's fp8/fp4
// kernels see. Not needed for architectural exactness; it closes the last gap on fp8 checkpoints.
#pragma once

#include <cstdint>

namespace moestream {

enum class act_quant_kind {
    fp8_e8m0_32,  // fp8 e4m3, 32-element blocks, power-of-two (ue8m0) scales: linear inputs, window kv
    fp4_e8m0_32,  // fp4 e2m1, 32-element blocks, power-of-two scales: indexer q and k
    fp4_e4m3_16,  // fp4 e2m1, 16-element blocks, e4m3 scales: compressed kv
};

// In place over `n` values (n a multiple of the block size).
void simulate_act_quant(act_quant_kind kind, float* x, int64_t n);

}  // namespace moestream
