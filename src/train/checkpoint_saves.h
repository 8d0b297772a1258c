// The trainer's checkpoint saves: every rank writes what it owns (DataParallelStrategy::
// shard_state: its ZeRO / FSDP shards, its share of replicated tensors), synchronously or, with
// `async_save`, from host copies on a background thread while training goes on. One save is in
// flight at most: the next save and the end of training wait for it, and a step end finishes it
// once every rank's shard is written (checkpoint::CheckpointSave). Each save's measurements go to
// the log and to metrics.jsonl:
//
//   save_blocking_ms           the time the training loop stood still for it (the slowest rank):
//                              sync, the whole save; async, opening it, the host copy, and its end
//                              (the wait for a write still running, meta.json, `latest`)
//   save_write_ms              the slowest rank's shard write (pack, checksum, write, fsync)
//   save_bytes, save_writers   the shard files' bytes over all ranks, and how many ranks wrote
//   save_host_buffer_bytes     the most host memory a rank's save held: its async copies plus the
//                              staging buffer (format.h kWriteBufferBytes). The async copy's
//                              buffer is kept between saves (12 bytes per element the rank owns)
//   save_peak_rss_delta_bytes  the most a rank's peak resident memory (VmHWM, reset by
//                              /proc/self/clear_refs at the save's start) rose above its resident
//                              memory then: over the whole write (sync), or up to the end of the
//                              host copy (async: the thread adds at most its staging buffer, and
//                              the steps that follow are not the save's); -1 where Linux does not tell
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "train/dp_strategy.h"
#include "train/metrics_log.h"

namespace primus::train {

class CheckpointSaves {
 public:
  struct Setup {
    parallel::ProcessGroup* world = nullptr;
    std::string dir;  // the save folder
    bool async = false;
    int64_t keep_last = 0;          // keep_last_checkpoints
    MetricsLog* metrics = nullptr;  // world rank 0's; nullptr elsewhere
  };
  explicit CheckpointSaves(Setup setup);
  ~CheckpointSaves();

  // Collective: waits for the save in flight, then starts this one (sync: writes and publishes it).
  void save(const DataParallelStrategy& dp, const checkpoint::TrainState& state, const std::string& config_yaml,
            const checkpoint::SaveOptions& options);
  // Collective, at a step's end: publishes the save in flight when every rank's write is done.
  void poll();
  // Collective: finishes the save in flight, if any.
  void wait();
  const std::string& last_checkpoint() const { return last_; }

 private:
  void finish();

  Setup s_;
  std::unique_ptr<checkpoint::CheckpointSave> pending_;
  DpShardState shard_;  // sync saves read it; async saves copied it
  std::vector<float> host_buffer_;  // async: the copy, kept between saves (its pages stay faulted in)
  int64_t iteration_ = 0;
  std::string run_id_;
  double blocked_ms_ = 0;  // this rank's, so far, for the save in flight
  int64_t rss_before_ = -1;
  double rss_delta_ = -1;
  std::string last_;
};

}  // namespace primus::train
