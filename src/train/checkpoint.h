// Checkpoints: <save>/iter_NNNNNNN/ holding
//   model.bin       the flat fp32 parameter buffer
//   optimizer.bin   AdamW's exp_avg then exp_avg_sq (same layout)
//   config.yaml     the resolved experiment config
//   meta.json       iteration, consumed samples, optimizer step, seed, the parameter layout, and
//                   the size and CRC-32 of every file above
// and <save>/latest naming the newest complete one. A checkpoint is written into a temporary
// folder, every file fsynced, then renamed into place, and only then does `latest` move (also by
// rename): a crash at any point leaves the previous checkpoint whole and `latest` pointing at it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/param_store.h"

namespace primus::train {

struct TrainState {
  int64_t iteration = 0;         // optimizer steps done
  int64_t consumed_samples = 0;  // training samples consumed (the data position)
  int64_t optimizer_step = 0;    // AdamW's bias-correction step count
  int64_t seed = 0;
};

struct CheckpointData {
  TrainState state;
  std::vector<float> params, exp_avg, exp_avg_sq;
  std::string config_yaml;
};

std::string checkpoint_name(int64_t iteration);  // "iter_0000100"

// Writes a checkpoint of `params` (values), the optimizer moments and the state; returns its folder.
std::string save_checkpoint(const std::string& save_dir, const ParamStore<float>& params, const float* exp_avg,
                            const float* exp_avg_sq, const TrainState& state, const std::string& config_yaml);

// Reads and verifies a checkpoint folder against the model's parameter layout. Throws
// primus::Error naming the file at fault (missing, truncated, checksum mismatch, layout mismatch).
CheckpointData load_checkpoint(const std::string& dir, const ParamStore<float>& params);

// Reads only config.yaml (verified against its checksum), e.g. for `generate`.
std::string read_checkpoint_config(const std::string& dir);

// `path` is a checkpoint folder or a save folder with `latest`: the folder to load.
std::string resolve_checkpoint(const std::string& path);

// Checkpoint folders in `save_dir`, newest first: `latest` first, then other iter_* folders.
std::vector<std::string> list_checkpoints(const std::string& save_dir);

// Deletes all but the newest `keep` checkpoints (0 keeps all).
void prune_checkpoints(const std::string& save_dir, int64_t keep);

}  // namespace primus::train
