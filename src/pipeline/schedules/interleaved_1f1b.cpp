// Interleaved 1F1B (Megatron-LM's virtual pipeline, Narayanan et al. 2021): each rank holds vpp
// looped chunks (chunk c of rank r is stage c*p + r). Microbatches go through a rank's chunks in
// groups of p: forward k is chunk (k/p) % vpp of microbatch (k/(p*vpp))*p + k%p, backwards the
// same with the chunks reversed. Warm-up is (p-r-1)*2 + (vpp-1)*p forwards, then 1F1B. The
// bubble shrinks to (p-1)/(m*vpp + p-1); Megatron requires m to be a multiple of p.
#include <algorithm>

#include "core/error.h"
#include "pipeline/schedules/registry.h"

namespace primus::pipeline {

Schedule make_interleaved_1f1b(const ScheduleRequest& req) {
  const int vpp = resolve_vpp(req, 2);
  const int p = req.pp, m = req.microbatches;
  if (p >= 1 && m >= 1 && m % p != 0)
    fail("interleaved-1f1b needs the number of microbatches ({}) to be a multiple of --pp ({}), as in Megatron",
         m, p);
  Schedule s = make_empty("interleaved-1f1b", p, vpp, m, Placement::Looped);
  const int total = m * vpp;
  auto mb_of = [&](int k) { return (k / (p * vpp)) * p + k % p; };
  auto chunk_of = [&](int k, bool forward) {
    int c = (k / p) % vpp;
    return forward ? c : vpp - 1 - c;
  };
  for (int r = 0; r < p; ++r) {
    auto& ops = s.ranks[r];
    int warmup = m == p ? total : std::min((p - r - 1) * 2 + (vpp - 1) * p, total);
    auto F = [&](int k) { ops.push_back({OpType::F, mb_of(k), chunk_of(k, true), {}, {}}); };
    auto BW = [&](int k) { ops.push_back({OpType::BW, mb_of(k), chunk_of(k, false), {}, {}}); };
    for (int k = 0; k < warmup; ++k) F(k);
    for (int k = 0; k < total - warmup; ++k) F(warmup + k), BW(k);
    for (int k = total - warmup; k < total; ++k) BW(k);
  }
  attach_p2p(s);
  return s;
}

}  // namespace primus::pipeline
