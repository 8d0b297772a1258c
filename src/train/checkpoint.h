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
};

struct LoadOptions {
  bool optimizer = true;  // false: read the values only (e.g. for `generate`)
  // When given, loading ends with an agreement over these ranks: if any rank fails, every rank
  // throws, so that no two ranks resume from different checkpoints.
  parallel::ProcessGroup* world = nullptr;
};

std::string checkpoint_name(int64_t iteration);  // "iter_0000100"

// A fresh run id (16 hex digits, random), the same on every rank of `world` (collective; nullptr:
// one process).
std::string new_run_id(parallel::ProcessGroup* world);

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

// Checkpoint folders in `save_dir`, newest first: `latest` first, then the others by save order
// (meta.json's save_seq, newest first; folders without one after them, by iteration).
std::vector<std::string> list_checkpoints(const std::string& save_dir);

// Deletes this run's checkpoints (those whose meta.json has `run_id`) beyond the newest `keep` by
// save order (0 keeps all). Never deletes `just_written`, the one `latest` names, another run's
// checkpoints, or a folder whose meta.json cannot be read. Call it on one rank only; returns the
// folders deleted.
std::vector<std::string> prune_checkpoints(const std::string& save_dir, int64_t keep, const std::string& run_id,
                                           const std::string& just_written);

// Checks, before training starts, that a run `run_id` can save into `save_dir`: that it is a folder
// (or can be created), and that none of the checkpoints it will write (the iterations in
// `iterations`) would replace a checkpoint of another run, unless `overwrite`. Throws primus::Error
// naming the folder and, for a conflict, the other run and `--overwrite`.
void check_save_folder(const std::string& save_dir, const std::string& run_id, const std::vector<int64_t>& iterations,
                       bool overwrite);

// The iterations a run from `start` (exclusive) to `train_iters` saves at with `save_interval`
// (0: only the end), as the trainer saves: every multiple of the interval, and the last one.
std::vector<int64_t> planned_saves(int64_t start, int64_t train_iters, int64_t save_interval);

// The identity meta.json records: for messages and tests.
struct CheckpointIdentity {
  std::string run_id;  // "" for a format-2 checkpoint (before run ids)
  int64_t iteration = 0;
  int64_t save_seq = 0;  // order of saves into the folder (0: unknown)
};
// Reads and verifies meta.json (its own checksum included) of a checkpoint folder.
CheckpointIdentity read_checkpoint_identity(const std::string& dir);

// Parsers exposed for the fuzz targets (fuzz/): each takes untrusted bytes and either returns or
// throws primus::Error, never crashes. `name` is used in messages.
void parse_meta_json(const std::string& text, const std::string& name);
void parse_shard_header(const std::string& bytes, const std::string& name);

}  // namespace primus::train
