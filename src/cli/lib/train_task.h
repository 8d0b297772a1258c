// `train pretrain` and `train posttrain` are one task body over an experiment config: its options,
// the launcher's check pass, --print-config, and the run. They differ in the trainer module they
// take (modules.pre_trainer or modules.post_trainer) and, for post-training, in where the weights
// come from (hf_path: a Hugging Face folder imported once).
#pragma once

#include <CLI/CLI.hpp>

#include "cli/registry.h"

namespace primus::cli {

enum class TrainTask { Pretrain, Posttrain };

TaskAction train_task(CLI::App& app, TrainTask which);

}  // namespace primus::cli
