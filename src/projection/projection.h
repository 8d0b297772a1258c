// `projection memory|performance|both` (Primus's command): what a config needs per rank and how
// fast it trains at a target scale, before the cluster exists.
//
// Everything about the model comes from walking it: each pipeline rank's partition of the real
// model runs one microbatch's F, B and W on the shape-only backend (plan/model_walk.h), which
// records every op with its shapes, FLOPs and bytes, every collective with its group and bytes,
// and the bytes the passes hold.
//
// Memory per rank (every tp and dp rank of a pipeline rank needs the same): the plan's memory
// model (plan/memory_estimate.h): weights, gradients and optimizer state by sharding strategy, the
// activations the walk measured under the schedule's in-flight microbatches, and buffers.
// Step time: each op the walk recorded, timed on this machine (or from the roofline of a named
// machine, op_timing.h); the collectives on the tensor-, context- and expert-parallel groups at
// the link they cross, exposed by what they outlast of the ops that run while they are in flight
// (a ring attention step's transfer behind its blocks); the pipeline through the schedule
// simulator with the stages' F, B, W and the transfers' time; the data-parallel gradient
// reduction from its bucket count and overlap; the optimizer, gradient norm and zeroing. Links:
// ring collectives over the slowest link the group crosses (comm_seconds).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/experiment.h"
#include "parallel/process_group.h"
#include "plan/memory_estimate.h"
#include "plan/model_walk.h"
#include "plan/parallel_layout.h"
#include "projection/op_timing.h"
#include "trace/hardware.h"

namespace primus::projection {

using config::DpSharding;
// --sharding's spellings: Megatron's data_parallel_sharding_strategy names (no_shard, optim,
// optim_grads, optim_grads_params) or zero1, zero2, fsdp; throws primus::Error naming them.
DpSharding parse_sharding(const std::string& s);
const char* sharding_name(DpSharding s);  // no_shard, zero1, zero2, fsdp (the reports' names)

struct Target {
  int nodes = 0;          // 0: the fewest that hold tp x pp x cp
  int gpus_per_node = 0;  // 0: the hardware's (8 for the named GPUs; this machine: tp x pp x cp)
  trace::Hardware hardware;
  std::optional<DpSharding>
      sharding;          // default: the config's data_parallel_sharding_strategy (as the trainer resolves it)
  ops::RouterLoad load;  // the MoE routers' load (balanced by default, or a run's measured histogram)
};

// Ring collectives: all_reduce 2(n-1) steps of S/n, reduce_scatter / all_gather / all_to_all
// n-1 steps, point-to-point one; each step costs the link's latency.
struct Link {
  double gbs = 0, latency_us = 0;
  std::string name;  // "intra-node", "inter-node"
};
double comm_seconds(const std::string& op, double bytes, int ranks, const Link& link);
// The link of `group` measured in that model's terms: the mean time of small all-reduces gives
// the latency, of 4 MiB ones the bandwidth. Collective over the group.
Link measure_link(parallel::ProcessGroup& group);

struct RankMemory {
  int pp_rank = 0;
  double parameters = 0, working_weights = 0, gradients = 0, optimizer = 0, activations = 0, buffers = 0;
  double peak = 0;  // everything at the rank's highest point
  int64_t parameter_count = 0;
  double peak_in_flight = 0;  // microbatch-chunks alive at the peak
  plan::SaveMemory save;      // the host memory of a checkpoint save (plan/memory_estimate.h)
};

struct MemoryReport {
  std::vector<RankMemory> per_rank;  // one per pipeline rank
  double capacity = 0;               // bytes per GPU (0: unknown, the CPU)
  bool fits = true;
  std::vector<std::string> notes;
};

struct StageTimes {
  int stage = 0;
  double f = 0, b = 0, w = 0;  // seconds per microbatch, compute and tp collectives
  double tp_comm = 0;          // of which tensor- and context-parallel communication, exposed (F+B+W)
};

struct PerformanceReport {
  std::string timing;  // how op times were had
  std::vector<StageTimes> stages;
  double pipeline_s = 0;      // F/B/W of all microbatches with the bubble
  double bubble = 0;          // the simulator's bubble rate (pp > 1)
  double p2p_s = 0;           // one activation transfer
  double dp_total_s = 0, dp_exposed_s = 0;  // gradient reduction (and ZeRO's parameter all-gather)
  double optimizer_s = 0, other_s = 0;      // optimizer + norm + zeroing; small collectives
  double step_s = 0, tokens_per_s = 0, tflops_per_gpu = 0, mfu = 0;
  std::vector<std::string> notes;
};

struct Projection {
  std::string model;
  ModelSpec spec;
  config::TrainingArgs args;
  plan::ParallelLayout layout;
  DpSharding sharding = DpSharding::NoShard;
  Precision precision = Precision::Fp32;
  trace::Hardware hardware;
  int nodes = 1, gpus_per_node = 1;
  std::vector<plan::RankRecord> walks;  // per pipeline rank: its partition walked (plan/model_walk.h)
  double walk_seconds = 0;              // how long the walks took
  std::optional<MemoryReport> memory;
  std::optional<PerformanceReport> performance;
};

// The layout at the target scale: the config's parallel sizes over nodes x gpus_per_node ranks
// (data parallel takes the rest), and every pipeline rank's partition walked. Throws
// primus::Error when the sizes do not fit.
Projection plan(const config::ExperimentConfig& cfg, const Target& target);
void project_memory(Projection& p);
void project_performance(Projection& p, OpTimer& timer);

nlohmann::ordered_json to_json(const Projection& p);
std::string to_text(const Projection& p);

}  // namespace primus::projection
