#include "pipeline/simulator.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "pipeline/deps.h"

namespace primus::pipeline {

double op_duration(OpType t, const StageCost& c) {
  switch (t) {
    case OpType::F: return c.forward;
    case OpType::B: return c.backward;
    case OpType::W: return c.weight;
    case OpType::BW: return c.backward + c.weight;
  }
  return 0.0;
}

double op_duration(OpType t, const Costs& c, int vpp, int stage) {
  return op_duration(t, stage_cost(c, vpp, stage));
}

double pair_duration(double a, double b, double overlap) {
  return std::max(a, b) + (1.0 - overlap) * std::min(a, b);
}

SimResult simulate(const Schedule& s, const Costs& costs) {
  check_costs(costs, s.num_stages());
  const int m = s.microbatches, S = s.num_stages();
  detail::EventTable done(m, S);
  SimResult res;
  res.times.resize(s.pp);
  for (int r = 0; r < s.pp; ++r) res.times[r].resize(s.ranks[r].size());
  std::vector<double> clock(s.pp, 0.0);
  // ASAP times: an op starts when its rank is free and its inputs (plus transfer time from
  // another rank) have arrived; they do not depend on the order the walk visits ranks in.
  auto pos = detail::run_in_dependency_order(s, done, [&](int r, size_t i, size_t n, const detail::EventTable& ev) {
    double start = clock[r];
    std::array<double, 2> d{};
    for (size_t k = 0; k < n; ++k) {
      const Op& op = s.ranks[r][i + k];
      const int st = s.stage_of(r, op.chunk);
      for (auto& e : detail::dependencies(op.type, op.microbatch, st, S)) {
        double t = ev.at(e.kind, e.microbatch, e.stage);
        if (s.rank_of_stage(e.stage) != r) t += costs.t_comm;
        start = std::max(start, t);
      }
      d[k] = op_duration(op.type, costs, s.vpp, st);
    }
    const double end = start + (n == 2 ? pair_duration(d[0], d[1], costs.pair_overlap) : d[0]);
    if (n == 2) {
      const double split = start + (end - start) * d[0] / (d[0] + d[1]);
      res.times[r][i] = {start, split};
      res.times[r][i + 1] = {split, end};
    } else {
      res.times[r][i] = {start, end};
    }
    clock[r] = end;
    return std::array<double, 2>{end, end};
  });
  if (!detail::ran_to_end(s, pos))
    fail("schedule '{}' deadlocks in simulation (run the validator for details)", s.algorithm);

  res.per_rank.resize(s.pp);
  double max_busy = 0.0;
  const double chunk = 1.0 / s.vpp, kept = costs.activation_after_b;
  for (int r = 0; r < s.pp; ++r) {
    RankStats& st = res.per_rank[r];
    const auto& t = res.times[r];
    if (!t.empty()) st.span = t.back().end - t.front().start;
    // Activation of (microbatch, chunk) lives from its F start to its W (or BW) end, with
    // `kept` of it from its B end on. At equal times frees go first: a rank runs one op (or
    // pair) at a time, so they cannot overlap.
    std::vector<std::pair<double, double>> events;  // (time, delta)
    for (size_t i = 0; i < t.size(); ++i) {
      const Op& op = s.ranks[r][i];
      st.busy += t[i].end - t[i].start;
      if (op.type == OpType::F) events.push_back({t[i].start, chunk});
      if (op.type == OpType::B) events.push_back({t[i].end, -chunk * (1.0 - kept)});
      if (op.type == OpType::W) events.push_back({t[i].end, -chunk * kept});
      if (op.type == OpType::BW) events.push_back({t[i].end, -chunk});
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
    max_busy = std::max(max_busy, st.busy);
  }
  res.bubble_rate = res.max_span > 0 ? (res.max_span - max_busy) / res.max_span : 0.0;
  return res;
}

}  // namespace primus::pipeline
