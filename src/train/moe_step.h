// The trainer's per-step MoE work: expert statistics reduced over data-parallel ranks, the
// aux-loss-free expert-bias update, and the metrics (aux/z loss, expert load) for the log and
// metrics.jsonl. See docs/moe.md for how to read them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/llama.h"
#include "parallel/process_group.h"

namespace primus::train {

struct MoeStepSummary {
  bool any = false;                 // this rank holds MoE blocks
  double aux_loss = 0, z_loss = 0;  // summed over this rank's blocks, mean per microbatch, mean over dp
  int64_t dropped = 0;              // choices dropped by capacity, summed over blocks and dp
  struct Layer {
    int64_t layer = 0;
    std::vector<int64_t> tokens;  // per expert, over the step's microbatches and dp ranks
    double max_over_mean = 0;     // 1 is perfect balance
  };
  std::vector<Layer> layers;
};

// Call after the step's backward passes: reduces over `dp` (and first over each of `token_share`,
// the groups that split each microbatch's tokens: tp under sequence parallelism, cp), moves expert
// biases when `update_bias` (the optimizer stepped) and the model uses them, and resets the
// model's stats.
MoeStepSummary finish_moe_step(LlamaModel& model, parallel::ProcessGroup& dp, int64_t microbatches,
                               bool update_bias, const std::vector<parallel::ProcessGroup*>& token_share = {});
// "moe aux loss 1.2E-02 | z loss ... | expert load max/mean 1.31 (layer 1: 1.25, ...)"
std::string describe_moe_step(const MoeStepSummary& s);
void add_moe_metrics(const MoeStepSummary& s, nlohmann::json& row);

}  // namespace primus::train
