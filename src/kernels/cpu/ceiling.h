// The instruction ceiling of this CPU: what its cores compute when they do nothing but the
// arithmetic instruction a GEMM is built from, measured at start-up by a loop of independent
// register-to-register instructions on every thread: a grid of accumulator chains as in a GEMM's
// micro-kernel, each row and column with its own operand register (enough chains to keep both
// FMA ports busy, no memory traffic; one shared operand pair halves the rate on Zen 5). MFU against it says how far a run is from the machine's limit; MFU against
// the measured GEMM peak (gemm.h, bf16/gemm.h) says how far it is from the GEMM this engine calls.
//   bf16 runs:  vdpbf16ps on zmm (16 lanes x 2 products x 2 FLOP = 64 per instruction) where
//               AVX512-BF16 is usable, else the fp32 FMA below (what the bf16 fallback computes with)
//   fp32 runs:  vfmadd231ps on zmm (32 FLOP) where AVX-512 is usable, else on ymm (16 FLOP)
// AMX's tile instructions are not measured: on a CPU with AMX, oneDNN's GEMMs may pass this ceiling.
#pragma once

#include <string>

namespace primus::cpu {

struct InstructionCeiling {
  double gflops = 0;         // over all OpenMP threads
  std::string instruction;   // "vdpbf16ps zmm", "vfmadd231ps zmm", "vfmadd231ps ymm", or "PRIMUS_CEILING_GFLOPS"
  int threads = 0;
};

// Best of `reps` timed loops of `iters` grid steps (18 zmm or 9 ymm instructions) per thread (many short loops: on a shared
// machine the best of them is the one no other process interrupted).
InstructionCeiling measure_instruction_ceiling(bool bf16, int reps = 40, long iters = 1 << 17);

// The instruction measure_instruction_ceiling times on this CPU, without timing it.
std::string ceiling_instruction(bool bf16);

// Measured once per process and precision (PRIMUS_CEILING_GFLOPS overrides it).
const InstructionCeiling& instruction_ceiling(bool bf16);

}  // namespace primus::cpu
