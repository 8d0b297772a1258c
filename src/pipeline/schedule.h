// Pipeline schedules as plain data.
//
// Model. The network is cut into S = pp * vpp consecutive stages; rank r (0..pp-1) holds vpp
// chunks, each chunk one stage:
//   looped placement (gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-auto):
//       stage(r, c) = c * pp + r
//   V-shape placement (zbv, v-half, v-min, dualpipev; vpp = 2):
//       stage(r, 0) = r,  stage(r, 1) = 2*pp - 1 - r
//     so the first and the last stage (the loss) both live on rank 0, and the turn from chunk 0 to
//     chunk 1 happens inside rank pp-1 with no transfer.
//
// A schedule is, for every rank, the ordered list of compute ops it runs:
//   F  (microbatch, chunk)   forward; needs the activation from stage s-1 (none for s = 0)
//   B  (microbatch, chunk)   input gradient; needs the gradient from stage s+1 (for the last
//                            stage: its own F's output, the loss) and this stage's saved ctx
//   W  (microbatch, chunk)   weight gradient; needs this stage's B of the same microbatch
//   BW (microbatch, chunk)   B and W fused (1F1B, GPipe, interleaved, parts of DualPipeV)
// Each op carries the point-to-point transfers around it: `recv` is what must arrive before the
// op starts, `send` what the op's result is sent to when it ends (absent when the neighbouring
// stage lives on the same rank). The executor posts sends without waiting for them (isend) and
// blocks on receives; the validator proves that this order cannot deadlock and that every send
// has exactly one matching receive. A transfer is identified by (microbatch, the receiving
// stage, direction), which the executor can use as its tag.
//
// Overlapped pairs (DeepSeek's DualPipe "F&B"): an op with `overlap_next` runs together with the
// next op of its rank as one unit, a forward of one chunk and a backward (B or BW) of another; a
// model may interleave their computation and communication. Both inputs must have arrived before
// the pair starts, both results leave when it ends; the simulator costs it by Costs::pair_overlap.
//
// A microbatch's activation for one chunk is alive from the start of its F to the end of its W
// (or BW); memory is counted in activations of one whole stage, so a chunk counts 1/vpp. Between
// its B and its W a microbatch keeps Costs::activation_after_b of that (the zero-bubble paper's
// M_W / M_B; 1 by default; the trainer's plan gives the model's own, measured: plan::layer_costs).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace primus::pipeline {

enum class OpType { F, B, W, BW };
enum class Placement { Looped, VShape };
// Activation flows to the next stage (forward), Gradient to the previous one (backward).
enum class Direction { Activation, Gradient };

const char* op_name(OpType t);             // "F", "B", "W", "BW"
const char* direction_name(Direction d);   // "activation", "gradient"
const char* placement_name(Placement p);   // "looped", "v-shape"

struct P2P {
  int peer = -1;       // the other rank
  int microbatch = 0;
  int stage = 0;       // the stage that consumes the message
  Direction dir = Direction::Activation;
  bool operator==(const P2P&) const = default;
};

struct Op {
  OpType type = OpType::F;
  int microbatch = 0;
  int chunk = 0;
  std::optional<P2P> recv;  // receive before the op
  std::optional<P2P> send;  // send after the op
  bool overlap_next = false;  // runs as one overlapped pair with the next op of this rank
  bool operator==(const Op&) const = default;
};

struct Schedule {
  std::string algorithm;
  int pp = 1;
  int vpp = 1;
  int microbatches = 1;
  Placement placement = Placement::Looped;
  std::vector<std::vector<Op>> ranks;  // ranks[r] = rank r's ops in execution order
  std::string note;  // how a searching generator got it (zb-auto: heuristic and ILP), for logs

  int num_stages() const { return pp * vpp; }
  int stage_of(int rank, int chunk) const;
  int rank_of_stage(int stage) const;
  int chunk_of_stage(int stage) const;
};

// The F, B and W time of one microbatch through one stage (one chunk), e.g. from its layer count.
struct StageCost {
  double forward = 1.0, backward = 1.0, weight = 1.0;
  bool operator==(const StageCost&) const = default;
};

// Per-op costs for one microbatch through one whole stage (1/pp of the model). A chunk of a
// vpp-chunk rank costs 1/vpp of that; t_comm is paid for every transfer between two ranks.
struct Costs {
  double t_forward = 1.0;
  double t_backward = 1.0;
  double t_weight = 1.0;
  double t_comm = 0.0;
  // Stages of unequal cost (a layer split, the embedding, the output layer): one entry per stage
  // (pp * vpp, in stage order) with that chunk's own times, used instead of t_forward / vpp etc.
  std::vector<StageCost> stages;
  // An overlapped pair (Op::overlap_next) of ops taking a and b costs
  // max(a, b) + (1 - pair_overlap) min(a, b): 1 hides the shorter one completely, 0 is the sum.
  double pair_overlap = 1.0;
  // Memory: the part of a microbatch's activation held from its B to its W (see above).
  double activation_after_b = 1.0;
};

// The times of stage `stage` for a schedule with `vpp` chunks per rank under `c`.
StageCost stage_cost(const Costs& c, int vpp, int stage);
// Throws primus::Error naming the value when times are not positive, pair_overlap is outside
// [0, 1], activation_after_b outside [0, 1], or `stages` does not have `num_stages` entries.
void check_costs(const Costs& c, int num_stages);

struct ScheduleRequest {
  int pp = 1;
  int microbatches = 1;
  int vpp = 0;                // 0: the algorithm's default
  Costs costs;                // used by generators that search (zb-auto, the V greedy ones)
  // In whole-stage microbatch activations; 0: algorithm default. For zb-auto this is Megatron's
  // and Primus's zero_bubble_max_pending_backward: p gives ZB-1p, 2p gives ZB-2p.
  double memory_limit = 0.0;
  // zb-auto's ILP refinement (pipeline/zb_ilp.h), when the solver is built in: the wall-clock
  // budget in seconds (0: heuristic only), or, for a result that must be the same on every rank,
  // a branch-and-bound node budget instead (ilp_nodes > 0 ignores ilp_seconds).
  double ilp_seconds = 0.0;
  int ilp_nodes = 0;
};

// An empty schedule with ranks sized; generators fill compute ops, then call attach_p2p.
Schedule make_empty(const std::string& algorithm, int pp, int vpp, int microbatches,
                    Placement placement);
// Fills every op's recv and send from the stage map (overwrites what was there).
void attach_p2p(Schedule& s);

// e.g. "F3" (microbatch 3) or, when vpp > 1, "F3.1" (microbatch 3, chunk 1).
std::string to_string(const Op& op, int vpp);

}  // namespace primus::pipeline
