// The pretraining loop: gradient accumulation over microbatches, AdamW with an LR schedule and
// global-norm clipping, evaluation on the valid split, logging (terminal, metrics.jsonl, TensorBoard) and
// checkpoints with exact resume.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/experiment.h"

namespace primus::train {

struct TrainSummary {
  int64_t start_iteration = 0;  // > 0 when resumed
  int64_t iterations = 0;       // the last iteration done
  double first_loss = 0, last_loss = 0;
  double last_eval_loss = -1;
  std::string last_checkpoint;
};

// LoRA adapters to start from (peft_adapter_path, read by hf::read_peft_adapters): the whole
// values of every adapter of the model, by name ("<module>.adapter.linear_in.weight", ...).
using StartingAdapters = std::map<std::string, std::vector<float>>;

// Runs the experiment to train_iters. Every user error (data, tokenizer, checkpoint) is raised
// as primus::Error before the first step. `adapters` (non-empty) replace the adapters' initial
// values of a run that starts at iteration 0, after its base weights are loaded; a resumed run
// continues with its checkpoint's.
TrainSummary pretrain(const config::ExperimentConfig& cfg, const StartingAdapters& adapters = {});

}  // namespace primus::train
