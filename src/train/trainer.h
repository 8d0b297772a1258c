// The pretraining loop: gradient accumulation over microbatches, AdamW with an LR schedule and
// global-norm clipping, evaluation on the valid split, logging (terminal, metrics.jsonl, TensorBoard) and
// checkpoints with exact resume.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "config/experiment.h"

namespace primus::train {

struct TrainSummary {
  int64_t start_iteration = 0;  // > 0 when resumed
  int64_t iterations = 0;       // the last iteration done
  double first_loss = 0, last_loss = 0;
  double last_eval_loss = -1;
  std::string last_checkpoint;
};

// Runs the experiment to train_iters. Every user error (data, tokenizer, checkpoint) is raised
// as primus::Error before the first step.
TrainSummary pretrain(const config::ExperimentConfig& cfg);

}  // namespace primus::train
