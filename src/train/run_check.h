// Everything about a training run that can be refused before any rank starts: the parallel
// layout for the world size, the learning-rate schedule, the tokenizer against the model's
// vocabulary, a `save` path that is a file, and the memory estimate against this host. `primus-cli direct` runs it once in the
// launcher, so a bad config is reported once instead of by every rank inside MPI_Abort banners.
#pragma once

#include "config/experiment.h"
#include "optim/lr_schedule.h"

namespace primus::train {

// The LR schedule's options from the training args (lr_decay_iters 0: train_iters, as Megatron).
LRScheduleOptions lr_schedule_options(const config::TrainingArgs& args);

// Throws primus::Error naming the key at fault. `ranks_on_host`: ranks sharing this host's
// memory (0: no memory check, e.g. bf16 runs whose memory is the GPU's).
void check_run(const config::ExperimentConfig& cfg, int world_size, int ranks_on_host);

}  // namespace primus::train
