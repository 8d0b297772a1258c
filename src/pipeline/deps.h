// Internal: the data dependencies of one op, shared by the validator, simulator and greedy
// scheduler. An op depends on "events" (F or B of a microbatch at a stage, BW counting as B).
#pragma once

#include <utility>
#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline::detail {

enum Kind { kF = 0, kB = 1, kW = 2 };

struct Event {
  int kind;  // kF, kB or kW
  int microbatch;
  int stage;
};

// At most two events, without allocating (the schedulers ask this for every op they consider).
struct Dependencies {
  Event e[2];
  int n = 0;
  const Event* begin() const { return e; }
  const Event* end() const { return e + n; }
};

// What `type` of (microbatch, stage) waits for, given S stages in total.
inline Dependencies dependencies(OpType type, int mb, int stage, int S) {
  Dependencies d;
  if (type == OpType::F) {
    if (stage > 0) d.e[d.n++] = {kF, mb, stage - 1};
  } else if (type == OpType::B || type == OpType::BW) {
    d.e[d.n++] = {kF, mb, stage};
    if (stage < S - 1) d.e[d.n++] = {kB, mb, stage + 1};
  } else {
    d.e[d.n++] = {kB, mb, stage};
  }
  return d;
}

// Table of event end times (negative: not yet happened), indexed [kind][microbatch][stage].
class EventTable {
 public:
  EventTable(int m, int S) : m_(m), S_(S), t_(3 * m * S, -1.0) {}
  double& at(int kind, int mb, int stage) { return t_[(kind * m_ + mb) * S_ + stage]; }
  double at(int kind, int mb, int stage) const { return t_[(kind * m_ + mb) * S_ + stage]; }
  bool done(const Event& e) const { return at(e.kind, e.microbatch, e.stage) >= 0; }
  // Records the end of an op: F marks kF, B marks kB, W marks kW, BW marks kB and kW.
  void record(OpType type, int mb, int stage, double end) {
    if (type == OpType::F) at(kF, mb, stage) = end;
    if (type == OpType::B || type == OpType::BW) at(kB, mb, stage) = end;
    if (type == OpType::W || type == OpType::BW) at(kW, mb, stage) = end;
  }

 private:
  int m_, S_;
  std::vector<double> t_;
};

// Ops [i, i + n) of one rank that run as a unit: n = 2 for an overlapped pair (Op::overlap_next),
// else 1.
inline size_t unit_size(const std::vector<Op>& ops, size_t i) {
  return ops[i].overlap_next && i + 1 < ops.size() ? 2 : 1;
}

// Runs each rank's ops in list order, each op (an overlapped pair: both of its ops together) as
// soon as every event it depends on has happened (sends never block, so only data dependencies
// order the ranks), until no rank can move. `run(rank, index, count, done)` is called for the
// rank's ops [index, index + count) and returns their end times (std::array<double, 2>; the
// second is ignored when count is 1), which are recorded. Returns where each rank stopped: every
// position equals its list's size when the whole schedule ran.
template <typename Run>
std::vector<size_t> run_in_dependency_order(const Schedule& s, EventTable& done, Run&& run) {
  const int S = s.num_stages();
  std::vector<size_t> pos(s.pp, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.pp; ++r) {
      const std::vector<Op>& ops = s.ranks[r];
      while (pos[r] < ops.size()) {
        const size_t n = unit_size(ops, pos[r]);
        bool ready = true;
        for (size_t k = 0; k < n && ready; ++k) {
          const Op& op = ops[pos[r] + k];
          for (auto& e : dependencies(op.type, op.microbatch, s.stage_of(r, op.chunk), S))
            ready = ready && done.done(e);
        }
        if (!ready) break;
        const auto ends = run(r, pos[r], n, std::as_const(done));
        for (size_t k = 0; k < n; ++k) {
          const Op& op = ops[pos[r] + k];
          done.record(op.type, op.microbatch, s.stage_of(r, op.chunk), ends[k]);
        }
        pos[r] += n;
        progress = true;
      }
    }
  }
  return pos;
}

// True when every rank reached the end of its list.
inline bool ran_to_end(const Schedule& s, const std::vector<size_t>& pos) {
  for (int r = 0; r < s.pp; ++r)
    if (pos[r] < s.ranks[r].size()) return false;
  return true;
}

}  // namespace primus::pipeline::detail
