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
//
// The module's parts: format.h (shard files, meta.json), reshard.h (which saved slices fill which
// local one), this file (save and load, with the ranks' agreement on failure), run_folder.h (the
// save folder: latest, save order, pruning, run ids; included here) and model_fit.h (whether a
// checkpoint's model is the one a run describes: checked before every load).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/run_folder.h"
#include "model/param_store.h"

namespace primus::parallel {
class ProcessGroup;
}

namespace primus::checkpoint {

// Named run state beyond the tensors (FP8 scaling histories and scales): small float vectors
// carried in a writer's shard header (so its CRC covers them) and indexed by name in meta.json.
using RunState = std::map<std::string, std::vector<float>>;

struct TrainState {
  int64_t iteration = 0;         // optimizer steps done
  int64_t consumed_samples = 0;  // training samples consumed (the data position)
  int64_t optimizer_step = 0;    // AdamW's bias-correction step count
  int64_t seed = 0;
  // Which run this state belongs to: new_run_id() for a run that starts from scratch, carried
  // over by a resume. Every shard and meta.json of a checkpoint carries it; pruning deletes only
  // the checkpoints of its own run, and a save never replaces another run's checkpoint silently.
  std::string run_id;
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
  // LoadOptions::strict false: this rank's tensors that the checkpoint did not fill (it lacks them
  // or holds them in another shape); their values are the initial ones, their moments 0.
  std::vector<std::string> fresh;
  // The run state asked for (LoadOptions::state) that the checkpoint holds, by name.
  RunState state_values;
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
  // A checkpoint folder of the same name written by another run is replaced only when true
  // (`--overwrite`); otherwise the save fails with an error naming both runs.
  bool overwrite = false;
  // This rank's named run state beyond its tensors (FP8 scaling histories and scales), written
  // into its shard when it is a writer; a name saved by several ranks is indexed once.
  RunState state;
};

struct LoadOptions {
  bool optimizer = true;  // false: read the values only (e.g. for `generate`, `no_load_optim`)
  // When given, loading ends with an agreement over these ranks: if any rank fails, every rank
  // throws, so that no two ranks resume from different checkpoints.
  parallel::ProcessGroup* world = nullptr;
  // true: every tensor of the store must be in the checkpoint with its global shape (else an
  // error naming it). false (`load_strict: false`, after check_model_fit agreed): a tensor the
  // checkpoint lacks or holds in another shape keeps its initial value, taken from
  // `initial_values` (host, the store's flat layout) or, when that is null, the store's values.
  bool strict = true;
  const float* initial_values = nullptr;
  // Names of run state (SaveOptions::state) to read into CheckpointData::state_values; a name the
  // checkpoint lacks is left out (the caller starts it fresh).
  std::vector<std::string> state;
};

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
// differs from the model's, a global range that no file covers. Whether the checkpoint holds
// tensors this model has no place for is check_model_fit's question (model_fit.h): one rank's
// store holds only its own part of the model.
CheckpointData load_checkpoint(const std::string& dir, const ParamStore& params, const LoadOptions& options = {});

// Reads every file of a checkpoint whole and checks its size and CRC-32 against meta.json.
void verify_checkpoint(const std::string& dir);

// Reads only config.yaml (verified against its checksum), e.g. for `generate`.
std::string read_checkpoint_config(const std::string& dir);

}  // namespace primus::checkpoint
