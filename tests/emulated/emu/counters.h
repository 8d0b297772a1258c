// The GPU emulator's counters, for tests that assert on them (a kernel meant to be free of shared
// memory bank conflicts) and for PRIMUS_EMU_STATS=1. Totals since the process started, over the
// work that has run: synchronise (cudaDeviceSynchronize) before reading them.
#pragma once

#include <cstdint>

namespace emu {

struct Counters {
  uint64_t launches = 0, blocks = 0, threads = 0;
  uint64_t switches = 0, memory_switches = 0;  // thread switches; those at memory accesses
  uint64_t barriers = 0, shuffles = 0, mma = 0, cp_async = 0;
  // ldmatrix: a phase per 8x8 matrix (8 row addresses of 16 bytes). A phase costs as many
  // shared memory wavefronts as it has rows in its busiest 16-byte bank group (of 8);
  // ldmatrix_conflicts counts the wavefronts beyond the first, 0 when every phase's rows fall
  // into 8 different bank groups.
  uint64_t ldmatrix_phases = 0, ldmatrix_conflicts = 0;
  uint64_t max_resident_blocks = 0;  // the most blocks a launch kept resident at once
  // The host's waits for the device: cudaStreamSynchronize, cudaEventSynchronize and
  // cudaDeviceSynchronize, and copies to host memory (which return once done).
  uint64_t host_waits = 0;
};
Counters counters();

}  // namespace emu
