// Pipeline balancing: how many decoder layers each stage holds so that the stages' times are as
// equal as the layer granularity allows, counting what the ends of the model add (the embedding
// on the first stage, the final norm, output layer and cross-entropy on the last).
//
// Candidates, each simulated with the schedule (per-stage costs, simulator.h) for its step time:
//   - every split Megatron's decoder_first/last_pipeline_num_layers can express (partition.h),
//     the even split among them;
//   - the split that minimises the largest rank time with any per-stage counts (at least one
//     layer per stage; a rank's layers spread over its chunks as evenly as they go).
// The shortest simulated step wins; at equal times (within 1e-9 relative) a split the two
// Megatron keys express is preferred, the even split first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/partition.h"
#include "pipeline/schedule.h"

namespace primus::pipeline {

// Times of the model's parts for one microbatch, in any unit (e.g. GFLOP or seconds).
struct ModelCosts {
  std::vector<StageCost> layers;  // one per decoder layer
  StageCost embedding;            // added to the stage holding the embedding (stage 0)
  StageCost head;                 // added to the last stage: final norm, output layer, loss
  // What a microbatch keeps from its B to its W over what it keeps from its F to its B, the
  // zero-bubble paper's M_W / M_B (Costs::activation_after_b): measured by plan::layer_costs as the
  // bytes the model's passes hold (at most 1 here; under recompute B rebuilds more than F kept).
  double activation_after_b = 1.0;
};

// The cost of each stage of `split` (in stage order) under `costs`.
std::vector<StageCost> stage_costs(const std::vector<LayerRange>& split, const ModelCosts& costs);

struct BalanceResult {
  std::vector<LayerRange> split;
  // Megatron's keys for it: > 0 when it is one of theirs with those values, both 0 for the even
  // split; -1 when only per-stage counts express it.
  int64_t first_rank_layers = 0, last_rank_layers = 0;
  std::vector<StageCost> stage_costs;
  double step = 0.0;  // simulated makespan of one step
  // The even split, when the layers divide evenly: its stage costs and simulated step.
  bool even_valid = false;
  std::vector<LayerRange> even_split;
  std::vector<StageCost> even_stage_costs;
  double even_step = 0.0;
};

// Chooses the split for `schedule` (its pp, vpp, placement and op order) and `costs.layers.size()`
// layers; `base` gives the transfer time and the memory model for the simulation (its per-stage
// costs are replaced). Throws primus::Error when the layers cannot cover every stage.
BalanceResult balance_layers(const Schedule& schedule, const ModelCosts& costs, const Costs& base);

// "5,5,5,1" (layers per stage, in stage order).
std::string layer_counts(const std::vector<LayerRange>& split);

}  // namespace primus::pipeline
