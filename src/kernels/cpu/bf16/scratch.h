// Scratch memory for the AVX-512 kernels: per thread, grow-only, kept between calls (a training
// step calls the kernels with the same shapes every time, and fresh allocations would page-fault
// on every call). Compiled for the baseline in its own file, so that the AVX-512 files instantiate
// no standard containers (whose shared code the linker could otherwise take from them).
#pragma once

#include <cstddef>

namespace primus::cpu::bf16k {

enum ScratchSlot {
  kGemmA,
  kGemmB,
  kGemmZeros,
  kGemmTile,
  kGemmPanel,  // a tile's last rows of a row-major A, gathered
  kGemmPlan,   // the problems of a grouped GEMM
  kAttentionPacks,
  kAttentionWork,
  kScratchSlots
};

// At least `bytes` bytes, 64-byte aligned, owned by the calling thread; a slot's contents stay
// until its next call with more bytes (never zeroed).
void* thread_scratch(ScratchSlot slot, size_t bytes);

}  // namespace primus::cpu::bf16k
