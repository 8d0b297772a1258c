#include "pipeline/schedule.h"

#include <fmt/format.h>

#include "core/error.h"

namespace primus::pipeline {

const char* op_name(OpType t) {
  switch (t) {
    case OpType::F: return "F";
    case OpType::B: return "B";
    case OpType::W: return "W";
    case OpType::BW: return "BW";
  }
  return "?";
}

const char* direction_name(Direction d) {
  return d == Direction::Activation ? "activation" : "gradient";
}

const char* placement_name(Placement p) { return p == Placement::Looped ? "looped" : "v-shape"; }

int Schedule::stage_of(int rank, int chunk) const {
  if (placement == Placement::VShape) return chunk == 0 ? rank : 2 * pp - 1 - rank;
  return chunk * pp + rank;
}

int Schedule::rank_of_stage(int stage) const {
  if (placement == Placement::VShape) return stage < pp ? stage : 2 * pp - 1 - stage;
  return stage % pp;
}

int Schedule::chunk_of_stage(int stage) const { return stage / pp; }

Schedule make_empty(const std::string& algorithm, int pp, int vpp, int microbatches,
                    Placement placement) {
  if (pp < 1) fail("pipeline size must be at least 1 (got --pp {})", pp);
  if (microbatches < 1) fail("number of microbatches must be at least 1 (got {})", microbatches);
  if (vpp < 1) fail("chunks per rank must be at least 1 (got --vpp {})", vpp);
  if (placement == Placement::VShape && vpp != 2)
    fail("V-shape schedule '{}' places exactly 2 chunks per rank (got --vpp {})", algorithm, vpp);
  Schedule s;
  s.algorithm = algorithm;
  s.pp = pp;
  s.vpp = vpp;
  s.microbatches = microbatches;
  s.placement = placement;
  s.ranks.resize(pp);
  return s;
}

void attach_p2p(Schedule& s) {
  const int S = s.num_stages();
  for (int r = 0; r < s.pp; ++r) {
    for (Op& op : s.ranks[r]) {
      op.recv.reset();
      op.send.reset();
      const int st = s.stage_of(r, op.chunk);
      if (op.type == OpType::F) {
        if (st > 0 && s.rank_of_stage(st - 1) != r)
          op.recv = P2P{s.rank_of_stage(st - 1), op.microbatch, st, Direction::Activation};
        if (st < S - 1 && s.rank_of_stage(st + 1) != r)
          op.send = P2P{s.rank_of_stage(st + 1), op.microbatch, st + 1, Direction::Activation};
      } else if (op.type == OpType::B || op.type == OpType::BW) {
        if (st < S - 1 && s.rank_of_stage(st + 1) != r)
          op.recv = P2P{s.rank_of_stage(st + 1), op.microbatch, st, Direction::Gradient};
        if (st > 0 && s.rank_of_stage(st - 1) != r)
          op.send = P2P{s.rank_of_stage(st - 1), op.microbatch, st - 1, Direction::Gradient};
      }
    }
  }
}

StageCost stage_cost(const Costs& c, int vpp, int stage) {
  if (!c.stages.empty()) return c.stages.at(stage);
  return {c.t_forward / vpp, c.t_backward / vpp, c.t_weight / vpp};
}

void check_costs(const Costs& c, int num_stages) {
  if (!(c.t_forward > 0) || !(c.t_backward > 0) || !(c.t_weight > 0))
    fail("op times must be positive (t-forward {}, t-backward {}, t-weight {})", c.t_forward,
         c.t_backward, c.t_weight);
  if (!(c.t_comm >= 0)) fail("transfer time must not be negative (t-comm {})", c.t_comm);
  if (!(c.pair_overlap >= 0 && c.pair_overlap <= 1))
    fail("pair overlap must be between 0 (pairs cost the sum) and 1 (the max), got {}", c.pair_overlap);
  if (!(c.activation_after_b >= 0 && c.activation_after_b <= 1))
    fail("the activation kept between B and W must be a fraction between 0 and 1, got {}",
         c.activation_after_b);
  if (c.stages.empty()) return;
  if ((int)c.stages.size() != num_stages)
    fail("per-stage costs list {} stages but the schedule has {}", c.stages.size(), num_stages);
  for (size_t i = 0; i < c.stages.size(); ++i) {
    const StageCost& t = c.stages[i];
    if (!(t.forward > 0) || !(t.backward > 0) || !(t.weight > 0))
      fail("stage {} has a non-positive op time (F {}, B {}, W {})", i, t.forward, t.backward, t.weight);
  }
}

std::string to_string(const Op& op, int vpp) {
  if (vpp > 1) return fmt::format("{}{}.{}", op_name(op.type), op.microbatch, op.chunk);
  return fmt::format("{}{}", op_name(op.type), op.microbatch);
}

}  // namespace primus::pipeline
