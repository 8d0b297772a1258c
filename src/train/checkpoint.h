// Checkpoints that any parallel layout can write and any other can read (resharding on load).
//
// <save>/iter_NNNNNNN/ holds
//   rank_RRRRR.bin  one per writing rank (R = world rank): the rank's tensors, each recorded with
//                   its name, global shape and the slice of it the rank holds (shard dim and
//                   pieces), then its flat fp32 buffers: values, exp_avg, exp_avg_sq. A JSON
//                   header (with its own CRC-32) carries that list and a CRC-32 per block of data,
//                   so a reader that needs a slice reads and verifies only the blocks it touches.
//   config.yaml     the resolved experiment config
//   meta.json       iteration, consumed samples, optimizer step, seed, the saving layout (tp, pp,
//                   dp, cp, vpp: informational), every file with its size and CRC-32, and an index
//                   of every tensor: its global shape and which files hold which slices of it
// and <save>/latest naming the newest complete one. A checkpoint is written into a temporary
// folder, every file fsynced, then renamed into place, and only then does `latest` move (also by
// rename): a crash at any point leaves the previous checkpoint whole and `latest` pointing at it.
//
// Loading fills each of this rank's tensors (any ShardSpec) from whichever files hold the global
// ranges it needs, so a checkpoint saved under tp2 x pp2 loads into one process and vice versa.
// docs/checkpoints.md describes the format.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/param_store.h"

namespace primus::parallel {
class ProcessGroup;
}

namespace primus::train {

struct TrainState {
  int64_t iteration = 0;         // optimizer steps done
  int64_t consumed_samples = 0;  // training samples consumed (the data position)
  int64_t optimizer_step = 0;    // AdamW's bias-correction step count
  int64_t seed = 0;
};

// The layout a checkpoint was saved under. Informational only: loading never needs it.
struct CheckpointLayout {
  int world_size = 1;
  int tp = 1, pp = 1, dp = 1, cp = 1, vpp = 1;
};

struct CheckpointData {
  TrainState state;
  // This rank's tensors in the flat layout of the ParamStore given to load_checkpoint (alignment
  // gaps are 0). exp_avg and exp_avg_sq are empty when LoadOptions::optimizer is false.
  std::vector<float> params, exp_avg, exp_avg_sq;
  std::string config_yaml;
  CheckpointLayout saved_layout;
};

struct SaveOptions {
  // The ranks that save together; nullptr is a single process. Saving is collective over it.
  parallel::ProcessGroup* world = nullptr;
  // Whether this rank writes a shard file. Replicas need not write: the trainer passes
  // dp rank 0 and cp rank 0. Every tensor of the model must have at least one writer.
  bool writer = true;
  CheckpointLayout layout;  // recorded in meta.json
  // Data is checksummed in blocks of this many bytes; a reader verifies the blocks it reads.
  int64_t block_bytes = 1 << 20;
};

struct LoadOptions {
  bool optimizer = true;  // false: read the values only (e.g. for `generate`)
  // When given, loading ends with an agreement over these ranks: if any rank fails, every rank
  // throws, so that no two ranks resume from different checkpoints.
  parallel::ProcessGroup* world = nullptr;
};

std::string checkpoint_name(int64_t iteration);  // "iter_0000100"

// Writes a checkpoint of `params` (values) and the optimizer moments (flat buffers laid out like
// params.values()), with the state; returns its folder. Collective over options.world. A failure
// on any rank (disk full, a file that cannot be created) makes every rank throw primus::Error and
// leaves no checkpoint folder behind; `latest` keeps naming the previous one.
std::string save_checkpoint(const std::string& save_dir, const ParamStore& params, const float* exp_avg,
                            const float* exp_avg_sq, const TrainState& state, const std::string& config_yaml,
                            const SaveOptions& options = {});

// Reads a checkpoint folder into this rank's tensors, whatever layout saved it. Every block read
// is checked against its CRC-32. Throws primus::Error naming the tensor and the file(s) at fault:
// a missing, truncated or corrupted file, a tensor the checkpoint lacks, a global shape that
// differs from the model's, a global range that no file covers.
CheckpointData load_checkpoint(const std::string& dir, const ParamStore& params,
                               const LoadOptions& options = {});

// Reads every file of a checkpoint whole and checks its size and CRC-32 against meta.json.
void verify_checkpoint(const std::string& dir);

// Reads only config.yaml (verified against its checksum), e.g. for `generate`.
std::string read_checkpoint_config(const std::string& dir);

// `path` is a checkpoint folder or a save folder with `latest`: the folder to load.
std::string resolve_checkpoint(const std::string& path);

// Checkpoint folders in `save_dir`, newest first: `latest` first, then other iter_* folders.
std::vector<std::string> list_checkpoints(const std::string& save_dir);

// Deletes all but the newest `keep` checkpoints (0 keeps all). Call it on one rank only.
void prune_checkpoints(const std::string& save_dir, int64_t keep);

}  // namespace primus::train
