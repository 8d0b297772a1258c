#include "pipeline/bubble.h"

#include "pipeline/simulator.h"

namespace primus::pipeline {

Costs measured_stage_costs(const Schedule& s, const std::vector<StageCost>& stage_costs, parallel::ProcessGroup& pp,
                           double f, double b, double w) {
  std::vector<double> per_rank(size_t(3 * s.pp), 0.0);
  per_rank[3 * pp.rank()] = f;
  per_rank[3 * pp.rank() + 1] = b;
  per_rank[3 * pp.rank() + 2] = w;
  pp.all_reduce(per_rank);
  const int stages = s.num_stages();
  Costs c;
  c.pair_overlap = 0;
  c.stages.resize(size_t(stages));
  for (int st = 0; st < stages; ++st) {
    const int r = s.rank_of_stage(st);
    // This stage's share of its rank's mean op: 1 with equal stages.
    StageCost share{1, 1, 1};
    if (int(stage_costs.size()) == stages) {
      StageCost mean{0, 0, 0};
      for (int c2 = 0; c2 < s.vpp; ++c2) {
        const auto& o = stage_costs[size_t(s.stage_of(r, c2))];
        mean.forward += o.forward / s.vpp;
        mean.backward += o.backward / s.vpp;
        mean.weight += o.weight / s.vpp;
      }
      const auto& mine = stage_costs[size_t(st)];
      share = {mine.forward / mean.forward, mine.backward / mean.backward, mine.weight / mean.weight};
    }
    c.stages[size_t(st)] = {per_rank[3 * r] * share.forward, per_rank[3 * r + 1] * share.backward,
                            per_rank[3 * r + 2] * share.weight};
  }
  return c;
}

void BubbleMeter::add(const ExecutorStats& s) {
  wall_ += s.wall_s;
  wait_ += s.wait_s;
  f_ += s.mean_f_s;
  b_ += s.mean_b_s;
  w_ += s.mean_w_s;
}

BubbleMeter::Report BubbleMeter::report(const Schedule& s, const std::vector<StageCost>& stage_costs,
                                        parallel::ProcessGroup& pp, int64_t steps) {
  const double n = double(steps);
  const double wall = pp.all_reduce_value(wall_ / n, parallel::ReduceOp::Max);
  const double busy = pp.all_reduce_value((wall_ - wait_) / n, parallel::ReduceOp::Max);
  const Costs c = measured_stage_costs(s, stage_costs, pp, f_ / n, b_ / n, w_ / n);
  Report r;
  r.measured = wall > 0 ? (wall - busy) / wall : 0;
  r.simulated = simulate(s, c).bubble_rate;
  for (const auto& sc : c.stages) {
    r.mean.forward += sc.forward / double(c.stages.size());
    r.mean.backward += sc.backward / double(c.stages.size());
    r.mean.weight += sc.weight / double(c.stages.size());
  }
  *this = BubbleMeter();
  return r;
}

}  // namespace primus::pipeline
