// DualPipeV (DeepSeek, "DualPipe" repository, dualpipev.py): DualPipe cut in half, on the V-shape
// placement (chunk 0 of rank r is stage r, chunk 1 is stage 2p-1-r). Each rank runs eight phases:
//   1. 2(p-r-1) F of chunk 0          2. r+1 times (F chunk 0, F chunk 1)
//   3. p-r-1 times (B chunk 1 split, W, F chunk 1)
//   4. m-2p+r+1 times (F chunk 0 & BW chunk 1, F chunk 1 & BW chunk 0)   [overlapped pairs]
//   5. p-r-1 times (BW chunk 1, F chunk 1 & BW chunk 0)
//   6. r+1 times (B chunk 1, B chunk 0), fused until half-way, then split
//   7. p-r-1 times (W, B chunk 0 split)   8. r+1 W
// "X & Y" is DualPipe's F&B: the forward of one chunk and the backward of the other run as one
// overlapped pair (Op::overlap_next; the simulator costs it by Costs::pair_overlap, the executor
// hands it to StageRunner::overlapped_forward_backward). As in dualpipev.py, the last rank runs
// the first pair of phase 4 one op after the other. Needs m >= 2p.
#include "core/error.h"
#include "pipeline/schedules/builder.h"
#include "pipeline/schedules/registry.h"

namespace primus::pipeline {

Schedule make_dualpipev(const ScheduleRequest& req) {
  require_vpp("dualpipev", resolve_vpp(req, 2), 2);
  const int p = req.pp, m = req.microbatches;
  if (m < 2 * p)
    fail("dualpipev needs at least 2p microbatches: --microbatches {} < 2 x --pp {}", m, p);
  Schedule s = make_empty("dualpipev", p, 2, m, Placement::VShape);
  for (int r = 0; r < p; ++r) {
    detail::RankBuilder b(s.ranks[r], 2);
    // A backward of chunk c, either split (W queued) or fused.
    auto back = [&](int c, bool split) { split ? b.B(c) : b.BW(c); };
    for (int i = 0; i < 2 * (p - r - 1); ++i) b.F(0);
    for (int i = 0; i < r + 1; ++i) b.F(0), b.F(1);
    for (int i = 0; i < p - r - 1; ++i) back(1, true), b.W(), b.F(1);
    // A forward of chunk c overlapped with the fused backward of the other chunk.
    auto pair = [&](int c) { b.F(c), b.overlap_with_next(), back(1 - c, false); };
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {
      if (i == 0 && r == p - 1)
        b.F(0), back(1, false);
      else
        pair(0);
      pair(1);
    }
    for (int i = 0; i < p - r - 1; ++i) back(1, false), pair(1);
    const int step6 = r + 1;
    bool split = false;
    for (int i = 0; i < step6; ++i) {
      if (i == step6 / 2 && r % 2 == 1) split = true;
      back(1, split);
      if (i == step6 / 2 && r % 2 == 0) split = true;
      back(0, split);
    }
    for (int i = 0; i < p - r - 1; ++i) b.W(), back(0, true);
    for (int i = 0; i < r + 1; ++i) b.W();
  }
  attach_p2p(s);
  return s;
}

}  // namespace primus::pipeline
