#include "pipeline/greedy.h"

#include <algorithm>
#include <deque>
#include <limits>

#include "core/error.h"
#include "pipeline/deps.h"
#include "pipeline/simulator.h"

namespace primus::pipeline {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Candidate {
  OpType type;
  int mb, chunk, stage;
  double ready;  // kInf: an input is not known yet
};

}  // namespace

Schedule greedy_schedule(const std::string& algorithm, int pp, int m, int vpp, Placement placement,
                         const Costs& costs, const GreedyOptions& opts, GreedyStats* stats) {
  Schedule s = make_empty(algorithm, pp, vpp, m, placement);
  if (opts.memory_limit_chunks < vpp)
    fail("memory limit of {} chunk activations cannot hold one microbatch ({} chunks per rank)",
         opts.memory_limit_chunks, vpp);
  const int S = s.num_stages();
  detail::EventTable done(m, S);
  const double eps = 1e-9;

  struct RankState {
    double clock = 0.0;
    std::vector<int> next_f, next_b;  // per chunk: next microbatch
    std::deque<std::pair<int, int>> pending_w;  // (microbatch, chunk) in B order
    std::vector<int> forwarded;                 // per microbatch: chunks forwarded here
    std::vector<int> finished;                  // per microbatch: chunks whose W is done
    int mem = 0, reserved = 0, inflight = 0, left = 0;
    double first_start = 0.0;
    bool last_was_b = false;
  };
  std::vector<RankState> R(pp);
  for (auto& st : R) {
    st.next_f.assign(vpp, 0);
    st.next_b.assign(vpp, 0);
    st.forwarded.assign(m, 0);
    st.finished.assign(m, 0);
    st.left = 3 * m * vpp;
  }

  auto ready_time = [&](int r, OpType t, int mb, int stage) {
    double ready = 0.0;
    for (auto& e : detail::dependencies(t, mb, stage, S)) {
      if (!done.done(e)) return kInf;
      double x = done.at(e.kind, e.microbatch, e.stage);
      if (s.rank_of_stage(e.stage) != r) x += costs.t_comm;
      ready = std::max(ready, x);
    }
    return ready;
  };
  auto cap = [&](int r) { return opts.inflight_cap.empty() ? m : opts.inflight_cap[r]; };

  // Candidates of rank r in preference order (B by later stage, then F by later stage), into
  // `cands` (reused: a decision is taken for every op).
  std::vector<Candidate> cands, fs;
  bool cap_rejected = false;
  auto candidates = [&](int r) {
    RankState& st = R[r];
    cands.clear(), fs.clear();
    for (int c = 0; c < vpp; ++c) {
      int stage = s.stage_of(r, c);
      int mb = st.next_b[c];
      if (mb < st.next_f[c]) cands.push_back({OpType::B, mb, c, stage, ready_time(r, OpType::B, mb, stage)});
      mb = st.next_f[c];
      if (mb < m) {
        const bool started = st.forwarded[mb] > 0;
        const bool memory = !opts.reserve ? st.mem + 1 <= opts.memory_limit_chunks
                            : started     ? st.mem + st.reserved <= opts.memory_limit_chunks
                                          : st.mem + st.reserved + vpp <= opts.memory_limit_chunks;
        const bool capped = !started && st.inflight >= cap(r);
        cap_rejected = cap_rejected || (memory && capped);
        if (memory && !capped) fs.push_back({OpType::F, mb, c, stage, ready_time(r, OpType::F, mb, stage)});
      }
    }
    auto later_stage = [](const Candidate& a, const Candidate& b) { return a.stage > b.stage; };
    std::sort(cands.begin(), cands.end(), later_stage);
    std::sort(fs.begin(), fs.end(), [&](const Candidate& a, const Candidate& b) {
      bool ca = R[r].forwarded[a.mb] > 0, cb = R[r].forwarded[b.mb] > 0;
      return ca != cb ? ca : a.stage > b.stage;
    });
    cands.insert(cands.end(), fs.begin(), fs.end());
  };

  // The op rank r would run and when; type W for a fill. Returns ready = kInf if it must wait
  // for an op not yet scheduled.
  auto decide = [&](int r) {
    RankState& st = R[r];
    candidates(r);
    if (opts.alternate && st.last_was_b)
      for (auto& c : cands)
        if (c.type == OpType::F && c.ready <= st.clock + eps) return Candidate{c.type, c.mb, c.chunk, c.stage, st.clock};
    for (auto& c : cands)
      if (c.ready <= st.clock + eps) return Candidate{c.type, c.mb, c.chunk, c.stage, st.clock};
    double soonest = kInf;
    for (auto& c : cands) soonest = std::min(soonest, c.ready);
    if (!st.pending_w.empty()) {
      const double tw = op_duration(OpType::W, costs, vpp, s.stage_of(r, st.pending_w.front().second));
      if (!opts.strict_fill || soonest >= st.clock + tw - eps || soonest == kInf) {
        auto [mb, c] = st.pending_w.front();
        return Candidate{OpType::W, mb, c, s.stage_of(r, c), st.clock};
      }
    }
    if (soonest == kInf) return Candidate{OpType::F, -1, -1, -1, kInf};
    for (auto& c : cands)
      if (c.ready == soonest) return c;
    return Candidate{OpType::F, -1, -1, -1, kInf};
  };

  // A rank's decision depends only on its own state and on the events its next ops wait for, so
  // after each op only that rank and the ranks of the neighbouring stages decide again.
  std::vector<Candidate> decision(pp);
  std::vector<double> ready(pp, kInf);  // decision[r].ready, kInf for a finished rank
  std::vector<int> stale;
  for (int r = 0; r < pp; ++r) stale.push_back(r);
  size_t total_left = (size_t)3 * m * vpp * pp;
  while (total_left > 0) {
    for (int r : stale)
      if (R[r].left > 0) decision[r] = decide(r), ready[r] = decision[r].ready;
      else ready[r] = kInf;
    stale.clear();
    int best_r = -1;
    for (int r = 0; r < pp; ++r)
      if (best_r < 0 ? ready[r] < kInf : ready[r] < ready[best_r] - eps) best_r = r;
    if (best_r < 0)
      fail("memory limit of {} chunk activations per rank leaves schedule '{}' stuck (pp {}, microbatches {})",
           opts.memory_limit_chunks, algorithm, pp, m);
    const Candidate best = decision[best_r];
    RankState& st = R[best_r];
    const double start = std::max(st.clock, best.ready);
    if (st.left == 3 * m * vpp) st.first_start = start;
    const double end = start + op_duration(best.type, costs, vpp, best.stage);
    st.clock = end;
    done.record(best.type, best.mb, best.stage, end);
    s.ranks[best_r].push_back(Op{best.type, best.mb, best.chunk, {}, {}});
    --st.left, --total_left;
    stale.push_back(best_r);
    if (best.type == OpType::F && best.stage + 1 < S) stale.push_back(s.rank_of_stage(best.stage + 1));
    if (best.type == OpType::B && best.stage > 0) stale.push_back(s.rank_of_stage(best.stage - 1));
    if (best.type != OpType::W) st.last_was_b = best.type == OpType::B;
    if (best.type == OpType::F) {
      if (st.forwarded[best.mb] == 0) st.reserved += vpp, ++st.inflight;
      ++st.forwarded[best.mb];
      --st.reserved, ++st.mem;
      ++st.next_f[best.chunk];
    } else if (best.type == OpType::B) {
      st.pending_w.emplace_back(best.mb, best.chunk);
      ++st.next_b[best.chunk];
    } else {
      st.pending_w.pop_front();
      --st.mem;
      if (++st.finished[best.mb] == vpp) --st.inflight;
    }
  }
  if (stats) {
    *stats = GreedyStats{cap_rejected, 0.0, 0.0};
    for (const RankState& st : R) {
      stats->max_span = std::max(stats->max_span, st.clock - st.first_start);
      stats->makespan = std::max(stats->makespan, st.clock);
    }
  }
  attach_p2p(s);
  return s;
}

Schedule search_greedy(const std::string& algorithm, int pp, int m, int vpp, Placement placement,
                       const Costs& costs, int memory_limit_chunks, const std::vector<Schedule>& extra) {
  if (memory_limit_chunks < vpp)
    fail("memory limit too small for any '{}' schedule: a rank must hold at least one microbatch "
         "({} chunk activations = 1 stage activation), the limit allows {} chunk activations",
         algorithm, vpp, memory_limit_chunks);
  // The in-flight caps: none, uniform caps k, staggered caps p - r + k - 1 (1F1B's warm-up
  // depth), k = 1..8 and then in steps of about a quarter (large caps differ little). Within a
  // family a cap that never stopped an admission gives the uncapped schedule, and so does every
  // larger one: the family ends there.
  const int max_inflight = std::min(m, memory_limit_chunks / vpp);
  auto next_cap = [](int k) { return k < 8 ? k + 1 : k + k / 4; };
  auto uniform = [&](int k) { return std::vector<int>(pp, k); };
  auto staggered = [&](int k) {
    std::vector<int> c(pp);
    for (int r = 0; r < pp; ++r) c[r] = std::max(1, std::min(max_inflight, pp - r + k - 1));
    return c;
  };
  // Nothing beats a rank span equal to the busiest rank's work with every rank starting as soon
  // as the first forward reaches it: a candidate at both bounds ends the search.
  Schedule shape = make_empty(algorithm, pp, vpp, m, placement);
  std::vector<double> chain(pp * vpp, 0.0), work(pp, 0.0), first(pp, kInf);
  for (int st = 0; st < pp * vpp; ++st) {
    const StageCost c = stage_cost(costs, vpp, st);
    const int r = shape.rank_of_stage(st);
    work[r] += m * (c.forward + c.backward + c.weight);
    first[r] = std::min(first[r], chain[st]);
    if (st + 1 < pp * vpp)
      chain[st + 1] = chain[st] + c.forward + (shape.rank_of_stage(st + 1) != r ? costs.t_comm : 0.0);
  }
  double span_bound = 0, makespan_bound = 0;
  for (int r = 0; r < pp; ++r) {
    span_bound = std::max(span_bound, work[r]);
    makespan_bound = std::max(makespan_bound, first[r] + work[r]);
  }
  Schedule best;
  double best_span = kInf, best_makespan = kInf, best_peak = kInf;
  auto at_bounds = [&] { return best_span <= span_bound + 1e-9 && best_makespan <= makespan_bound + 1e-9; };
  const double limit_stages = double(memory_limit_chunks) / vpp + 1e-9;
  auto consider = [&](Schedule s) {
    const SimResult r = simulate(s, costs);
    if (r.peak_activations > limit_stages) return;
    const double e = 1e-9;
    bool better = r.max_span < best_span - e ||
                  (r.max_span < best_span + e && (r.makespan < best_makespan - e ||
                                                  (r.makespan < best_makespan + e && r.peak_activations < best_peak - e)));
    if (!better) return;
    best = std::move(s);
    best_span = r.max_span, best_makespan = r.makespan, best_peak = r.peak_activations;
  };
  for (const Schedule& s : extra) consider(s);
  for (bool reserve : {true, false})
    for (bool strict : {true, false})
      for (bool alternate : {false, true}) {
        // Returns whether the cap stopped an admission (false also when the run got stuck).
        auto run = [&](std::vector<int> cap) {
          if (at_bounds()) return false;
          GreedyStats got;
          try {
            Schedule s = greedy_schedule(algorithm, pp, m, vpp, placement, costs,
                                         {memory_limit_chunks, std::move(cap), strict, reserve, alternate}, &got);
            // Only a candidate that may win is simulated (for its peak); the greedy kept the
            // memory limit and its times are the simulator's.
            if (got.max_span < best_span + 1e-9 && got.makespan < best_makespan + 1e-9) consider(std::move(s));
          } catch (const Error&) {
            if (reserve) throw;  // cannot happen with reservation; a bug if it does
          }
          return got.cap_binding;
        };
        run({});
        for (int k = 1; k <= max_inflight && run(uniform(k)); k = next_cap(k)) {
        }
        for (int k = 1; k <= max_inflight && run(staggered(k)); k = next_cap(k)) {
        }
      }
  if (best_span == kInf)
    fail("no '{}' schedule fits a memory limit of {} chunk activations (pp {}, microbatches {})", algorithm,
         memory_limit_chunks, pp, m);
  best.algorithm = algorithm;
  return best;
}

}  // namespace primus::pipeline
