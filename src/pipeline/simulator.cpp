#include "pipeline/simulator.h"

#include <algorithm>

#include "core/error.h"
#include "pipeline/deps.h"

namespace primus::pipeline {

double op_duration(OpType t, const Costs& c, int vpp) {
  switch (t) {
    case OpType::F: return c.t_forward / vpp;
    case OpType::B: return c.t_backward / vpp;
    case OpType::W: return c.t_weight / vpp;
    case OpType::BW: return (c.t_backward + c.t_weight) / vpp;
  }
  return 0.0;
}

static void check_costs(const Costs& c) {
  if (!(c.t_forward > 0) || !(c.t_backward > 0) || !(c.t_weight > 0))
    fail("op times must be positive (t-forward {}, t-backward {}, t-weight {})", c.t_forward,
         c.t_backward, c.t_weight);
  if (!(c.t_comm >= 0)) fail("transfer time must not be negative (t-comm {})", c.t_comm);
}

SimResult simulate(const Schedule& s, const Costs& costs) {
  check_costs(costs);
  const int m = s.microbatches, S = s.num_stages();
  detail::EventTable done(m, S);
  SimResult res;
  res.times.resize(s.pp);
  for (int r = 0; r < s.pp; ++r) res.times[r].resize(s.ranks[r].size());
  std::vector<double> clock(s.pp, 0.0);
  // ASAP times: an op starts when its rank is free and its inputs (plus transfer time from
  // another rank) have arrived; they do not depend on the order the walk visits ranks in.
  auto pos = detail::run_in_dependency_order(s, done, [&](int r, size_t i, const Op& op, int st, const detail::EventTable& ev) {
    double start = clock[r];
    for (auto& e : detail::dependencies(op.type, op.microbatch, st, S)) {
      double t = ev.at(e.kind, e.microbatch, e.stage);
      if (s.rank_of_stage(e.stage) != r) t += costs.t_comm;
      start = std::max(start, t);
    }
    const double end = start + op_duration(op.type, costs, s.vpp);
    res.times[r][i] = {start, end};
    return clock[r] = end;
  });
  if (!detail::ran_to_end(s, pos))
    fail("schedule '{}' deadlocks in simulation (run the validator for details)", s.algorithm);

  res.per_rank.resize(s.pp);
  for (int r = 0; r < s.pp; ++r) {
    RankStats& st = res.per_rank[r];
    const auto& t = res.times[r];
    if (!t.empty()) st.span = t.back().end - t.front().start;
    // Activation of (microbatch, chunk) lives from its F start to its W (or BW) end. At equal
    // times frees go first: a rank runs one op at a time, so they cannot overlap.
    std::vector<std::pair<double, double>> events;  // (time, delta)
    for (size_t i = 0; i < t.size(); ++i) {
      const Op& op = s.ranks[r][i];
      st.busy += t[i].end - t[i].start;
      if (op.type == OpType::F) events.push_back({t[i].start, 1.0 / s.vpp});
      if (op.type == OpType::W || op.type == OpType::BW) events.push_back({t[i].end, -1.0 / s.vpp});
    }
    std::sort(events.begin(), events.end());
    double cur = 0.0;
    for (auto& [time, delta] : events) {
      cur += delta;
      st.peak_activations = std::max(st.peak_activations, cur);
    }
    res.makespan = std::max(res.makespan, t.empty() ? 0.0 : t.back().end);
    res.max_span = std::max(res.max_span, st.span);
    res.peak_activations = std::max(res.peak_activations, st.peak_activations);
  }
  const double work = m * (costs.t_forward + costs.t_backward + costs.t_weight);
  res.bubble_rate = res.max_span > 0 ? (res.max_span - work) / res.max_span : 0.0;
  return res;
}

}  // namespace primus::pipeline
