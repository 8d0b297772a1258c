// Internal helpers of the V-shape schedules (zbv, v-half, v-min): the memory limit in chunk
// activations (2 per stage), and the building-block construction of V-Half and V-Min.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "pipeline/schedules/registry.h"

namespace primus::pipeline::detail {

inline int v_limit_chunks(const std::string& name, const ScheduleRequest& req, int default_chunks) {
  require_vpp(name, resolve_vpp(req, 2), 2);
  if (req.memory_limit > 0) {
    int chunks = (int)std::floor(2 * req.memory_limit + 1e-9);
    if (chunks < 2)
      fail("memory limit {} is too small for any '{}' schedule: a rank must hold one microbatch "
           "(2 chunks = 1 stage activation)", req.memory_limit, name);
    return chunks;
  }
  return std::max(2, default_chunks);
}

// A building block (Qi et al., NeurIPS 2024, section 3): where one microbatch's four passes sit on
// each rank, in unit slots (one slot = one chunk op with T_F = T_B = T_W). The block repeats every
// 6 slots (the 6 chunk ops of a microbatch on a rank), so a rank's peak memory follows from how
// long an activation lives in the block (its lifespan) and the W slots left free in between.
struct BlockOffsets {
  int f0, f1, b1, b0;  // F of chunk 0, F of chunk 1, B of chunk 1, B of chunk 0
};

// V-Half: lifespan about 3p slots, peak about (p+2)/2 stage activations.
std::vector<BlockOffsets> v_half_block(int p);
// V-Min: lifespan about 2p slots, peak about (p+4)/3 stage activations.
std::vector<BlockOffsets> v_min_block(int p);

// The schedule of `block` repeated for m microbatches: every W in the first free slot after its
// B, then the warm-up and cool-down squeezed (ops moved into earlier free slots, as long as the
// rank's memory stays within the steady state's peak), then the W's placed again. The op order is
// what counts; the simulator gives the times.
Schedule v_block_schedule(const std::string& name, int p, int m, const std::vector<BlockOffsets>& block);

// The peak, in chunk activations, of a schedule (the largest over ranks; order-determined).
int peak_chunks(const Schedule& s);

}  // namespace primus::pipeline::detail
