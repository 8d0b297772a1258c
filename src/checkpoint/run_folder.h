// The save folder of a run (docs/checkpoints.md#the-save-folder):
//
//   <save>/iter_NNNNNNN/   the checkpoints (checkpoint.h), each tied to the run that wrote it by
//                          its run id and numbered by save order (meta.json's save_seq)
//   <save>/latest          the name of the newest complete checkpoint, moved by rename
//   <save>/.iter_N.tmp/    a save in progress; a crashed writer's is deleted by the next save
//
// One run never replaces or prunes another run's checkpoints unless asked (`overwrite`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace primus::parallel {
class ProcessGroup;
}

namespace primus::checkpoint {

std::string checkpoint_name(int64_t iteration);  // "iter_0000100"

// A fresh run id (16 hex digits, random), the same on every rank of `world` (collective; nullptr:
// one process).
std::string new_run_id(parallel::ProcessGroup* world);

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

// ---- the folder's part of a save (save_checkpoint, checkpoint.cpp) ----------------------------

// Where the checkpoint of `iteration` goes: its final folder and the temporary one it is written in.
struct SaveSlot {
  std::filesystem::path root, final_dir, tmp;
};
SaveSlot save_slot(const std::string& save_dir, int64_t iteration);

// Before any shard is written (one rank): creates the save folder, refuses to replace another
// run's checkpoint of this number unless `overwrite` (one whose meta.json cannot be read is moved
// aside as damaged_<name>_<time>), deletes temporary folders of writers that died, creates the
// slot's temporary folder. Returns this save's number in the folder's save order.
int64_t open_save_slot(const SaveSlot& slot, const std::string& run_id, bool overwrite);

// Once the temporary folder holds the whole checkpoint, fsynced (one rank): renames it into place
// (replacing a folder of that name), then moves `latest` to it by rename.
void publish_save_slot(const SaveSlot& slot);

// Removes the temporary folder of a failed save (best effort: the next save removes it anyway).
void discard_save_slot(const SaveSlot& slot);

}  // namespace primus::checkpoint
