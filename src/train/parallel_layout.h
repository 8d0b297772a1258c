// The parallel layout of a training run, planned and checked from the config and the world size
// before any rank builds a model or reads data: every rule that can fail fails here, with a
// message naming the rule, the keys and the numbers.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "model/model_spec.h"
#include "parallel/mesh.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"

namespace primus::train {

struct ParallelLayout {
  int world_size = 1;
  int tp = 1, pp = 1, cp = 1, dp = 1, vpp = 1;
  bool sequence_parallel = false;
  int64_t microbatches_per_rank = 1;  // global_batch_size / (micro_batch_size * dp)
  std::vector<pipeline::LayerRange> stages;  // pp * vpp, in model order
  std::optional<pipeline::Schedule> schedule;  // when the model is split in more than one stage
  parallel::ParallelSizes sizes() const;
  // "world 8 = tp 2 x pp 2 x dp 2; 1f1b over 2 stages; 4 microbatches per dp rank".
  std::string describe() const;
};

// Rules, in order: sizes positive; context and expert parallel sizes 1 (not implemented yet);
// tp x pp x cp divides the world size; heads, query groups, ffn and vocabulary divisible by tp;
// sequence parallel needs tokens per microbatch divisible by tp; global_batch_size a multiple of
// micro_batch_size x dp; layers split over pp x vpp stages (even, or as decoder_first/last_
// pipeline_num_layers say); the pipeline schedule exists for pp, vpp and the microbatches
// (e.g. dualpipev needs m >= 2 pp).
ParallelLayout plan_layout(const config::TrainingArgs& args, const ModelSpec& spec, int world_size);

}  // namespace primus::train
