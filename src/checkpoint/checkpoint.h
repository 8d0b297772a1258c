// Checkpoints that any parallel layout can write and any other can read (resharding on load).
//
// <save>/iter_NNNNNNN/ holds
//   rank_RRRRR.bin  one per writing rank (R = world rank): the elements the rank owns (its ZeRO /
//                   FSDP shards, or its share of a replicated tensor), each run recorded with its
//                   tensor's name, global shape, the slice of it the rank's layout holds (shard dim
//                   and pieces) and the range of that slice written here, then the packed fp32
//                   sections: values, exp_avg, exp_avg_sq. A JSON
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
// save folder: latest, save order, pruning, run ids; included here), model_fit.h (whether a
// checkpoint's model is the one a run describes: checked before every load) and checkpoint_bench.h
// (`benchmark checkpoint`).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
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
  // What this rank moved: bytes read from the shard files (values and moments), and bytes it
  // received from the replicas of its LoadTarget ranges (LoadTarget::replicas).
  uint64_t bytes_read = 0, bytes_received = 0;
};

struct SaveOptions {
  // The ranks that save together; nullptr is a single process. Saving is collective over it.
  parallel::ProcessGroup* world = nullptr;
  // Whether this rank writes a shard file (the overload of save_checkpoint that takes a whole
  // store; a ShardSource says it by its ranges). Every tensor must have at least one writer.
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
  // `async_save`: CheckpointSave copies the ranges to host buffers and writes them on a thread.
  bool async = false;
  // async: the host buffer to copy into, kept by the caller between saves so that only the first
  // save pays for allocating (and faulting in) its pages; nullptr: the save's own. It must not be
  // touched until finish() returns.
  std::vector<float>* host_buffer = nullptr;
  // Host memory the caller holds for this save beside its own state (the host copies of device
  // buffers that `source` points into), counted in SaveReport::host_buffer_bytes.
  uint64_t source_host_bytes = 0;
};

// A contiguous range [begin, begin + numel) of a rank's flat layout (its ParamStore's offsets)
// that it writes, with the data of the three sections (values, exp_avg, exp_avg_sq) in host
// memory. Elements outside the store's tensors (alignment gaps) are not written.
struct SaveRange {
  int64_t begin = 0, numel = 0;
  const float* data[3] = {nullptr, nullptr, nullptr};
};

// What one rank writes: ranges of its store's layout, sorted and disjoint. Under ZeRO / FSDP the
// ranges are the rank's own shards; replicas split a tensor's elements between them, so that each
// element is written once. No ranges: the rank writes no file.
struct ShardSource {
  const ParamStore* layout = nullptr;  // names, shapes, slices and flat offsets of the tensors
  std::vector<SaveRange> ranges;
  // The whole store, values and moments (one writer's view): what save_checkpoint(params, ...) saves.
  static ShardSource whole(const ParamStore& params, const float* values, const float* exp_avg,
                           const float* exp_avg_sq);
};

// What a save did, for the log and metrics.jsonl.
struct SaveReport {
  std::string dir;              // the checkpoint folder
  double write_ms = 0;          // this rank's shard: pack, checksum, write, fsync (its thread's time when async)
  double max_write_ms = 0;      // the slowest rank's
  double open_ms = 0;           // opening: the agreement, rank 0's temporary folder
  double copy_ms = 0;           // async: copying the ranges to host buffers (on the training thread)
  double wait_ms = 0;           // async: finish() waiting for this rank's write
  double publish_ms = 0;        // the end: agreement, rank 0's meta.json, rename, `latest`
  uint64_t bytes = 0;           // this rank's shard file
  uint64_t total_bytes = 0;     // every rank's shard files
  int writers = 0;              // ranks that wrote a file
  uint64_t host_buffer_bytes = 0;      // host memory this rank's save held: the caller's host copies
                                       // (SaveOptions::source_host_bytes), async copies, staging buffer
  uint64_t max_host_buffer_bytes = 0;  // the largest over the ranks
};

// A collective save that may write in the background. The constructor (collective over
// options.world) opens the temporary folder, then writes this rank's shard: before it returns,
// or (options.async) on a thread, from host copies of the ranges it made first, so that training
// may change its buffers at once. finish() (collective) waits for this rank's write, learns every
// rank's outcome, and rank 0 publishes the checkpoint: meta.json, the rename, `latest`. So
// `latest` moves only when every rank's shard is durable, and a crash before that leaves the
// previous checkpoint the latest. A failure on any rank makes every rank's finish() throw and
// leaves no checkpoint folder. A save destroyed unfinished (an exception elsewhere) waits for its
// thread and leaves its temporary folder for the next save to remove.
class CheckpointSave {
 public:
  CheckpointSave(const std::string& save_dir, const ShardSource& source, const TrainState& state,
                 const std::string& config_yaml, const SaveOptions& options);
  ~CheckpointSave();
  CheckpointSave(const CheckpointSave&) = delete;
  CheckpointSave& operator=(const CheckpointSave&) = delete;

  bool written() const;  // local: this rank's shard is written (or its write failed)
  // Collective: whether every rank's shard is written (finish() would not wait on a write).
  bool all_written() const;
  SaveReport finish();  // collective; once

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Where a load puts elements [begin, begin + numel) of the store's flat layout: host pointers to
// element `begin` of each section (values, exp_avg, exp_avg_sq), e.g. into the rank's own
// resident buffers; nullptr: that section of the range is not read. Alignment gaps between tensors
// are not written.
struct LoadTarget {
  int64_t begin = 0, numel = 0;
  float* data[3] = {nullptr, nullptr, nullptr};
  // The ranks that load this range identically (data-parallel replicas, whose stores have the same
  // layout), this rank among them; nullptr (or one rank): this rank alone. Each replica reads
  // only its 1/size share of the range, by position ([numel i / size, numel (i + 1) / size) for
  // replica i), checking its blocks' CRCs, and once every rank of LoadOptions::world has read its
  // part, each share is broadcast from its reader to the others (exchanging within a node costs
  // less than reading the same bytes again on every replica).
  parallel::ProcessGroup* replicas = nullptr;
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
  // Only these ranges of the store's flat layout ([first, first + second), sorted, disjoint) are
  // read; the rest of the buffers stay 0. Empty: all. A rank that keeps only its ZeRO / FSDP
  // shards reads only their bytes (`benchmark checkpoint` loads this way).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  // The same for the optimizer moments alone (ZeRO-1: every value, only the rank's optimizer
  // shards' moments). Empty: as `ranges`.
  std::vector<std::pair<int64_t, int64_t>> optimizer_ranges;
  // Host buffers of the store's flat layout (values, exp_avg, exp_avg_sq; the moments unused when
  // `optimizer` is false) to read into, e.g. the rank's own state: the data goes there straight
  // from the files, and CheckpointData's buffers stay empty. Only the elements read (`ranges`, or
  // every tensor's) are written; a tensor a non-strict load keeps gets its initial values and zero
  // moments. nullptr: the load allocates CheckpointData's buffers (zeros where nothing is read).
  float* into[3] = {nullptr, nullptr, nullptr};
  // Where the elements go, the rank's own buffers (the trainer's resume): per section sorted by
  // begin and disjoint; the ranges with replicas in the same order on every rank of their group
  // (their exchange is collective). When given, `ranges`, `optimizer_ranges` and `into` are unused,
  // CheckpointData's buffers stay empty, and a tensor a non-strict load keeps has its values left
  // as they are in the targets (the caller's buffers hold the initial ones) unless
  // `initial_values` is given; its moments are set to 0.
  std::vector<LoadTarget> targets;
  // Threads that read and check the blocks (each overlapping its CRCs with the others' reads),
  // each a contiguous stretch of the data, in reads of about read_chunk_bytes of whole blocks.
  int read_threads = 4;
  int64_t read_chunk_bytes = 8 << 20;
  // Those reads with O_DIRECT, disk to buffer without the page cache's copy (where the file
  // system refuses it, through the page cache): on a loaded host that copy, not the disk, bounds
  // the load. Each read asks for read_window_bytes, which are checked and copied out in
  // cache-sized pieces.
  bool read_direct = true;
  int64_t read_window_bytes = 4 << 20;
};

// Writes a checkpoint of `params` (values) and the optimizer moments (flat buffers laid out like
// params.values()), with the state; returns its folder. Collective over options.world. A failure
// on any rank (disk full, a file that cannot be created) makes every rank throw primus::Error and
// leaves no checkpoint folder behind; `latest` keeps naming the previous one.
std::string save_checkpoint(const std::string& save_dir, const ParamStore& params, const float* exp_avg,
                            const float* exp_avg_sq, const TrainState& state, const std::string& config_yaml,
                            const SaveOptions& options = {});
// The same for the ranges a rank owns (ZeRO / FSDP shards), written synchronously.
SaveReport save_checkpoint(const std::string& save_dir, const ShardSource& source, const TrainState& state,
                           const std::string& config_yaml, const SaveOptions& options = {});

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
