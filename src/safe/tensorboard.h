// TensorBoard event files, written as Megatron-LM writes them (its `tensorboard_dir` and
// `log_*_to_tensorboard` keys), from the rows the trainer writes to metrics.jsonl: the scalars in
// the event file are the metrics.jsonl values of the same rows.
//
//   EventFileWriter   one events.out.tfevents.<time>.<host>.<pid>.0 file: TFRecords (length, masked
//                     CRC32C of it, payload, masked CRC32C of it) of `Event` protocol buffers (the
//                     few fields a scalar needs, encoded here), queued and written in one piece.
//   TensorBoardLog    metrics.jsonl rows -> Megatron's tags: `lm loss`, `learning-rate`,
//                     `grad-norm`, `batch-size`, `loss-scale`, `world-size`, `mem-*-bytes`, each
//                     also `<tag> vs samples` (by consumed samples); `iteration-time` and
//                     `throughput` (log_timers_to_tensorboard); `lm loss validation` (and `ppl`).
//
// Disk errors end the run as metrics.jsonl's do (metrics_writer.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "safe/metrics_writer.h"

namespace primus::safe {

// CRC-32C (Castagnoli), and the masked form TFRecords store.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);
// One TFRecord around `payload`.
std::string tfrecord(const std::string& payload);
// The serialized `Event` of one scalar (wall_time, step, summary { value { tag, simple_value } }).
std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time);

class EventFileWriter {
 public:
  // Creates `dir` and a new event file in it, whose first record says the file's version
  // ("brain.Event:2"). Events are kept until `queue_size` of them wait (Megatron's
  // tensorboard_queue_size), or two minutes passed (SummaryWriter's flush_secs), then written.
  EventFileWriter(const std::string& dir, int64_t queue_size);
  ~EventFileWriter();  // flushes (a failure there is logged, not thrown)
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return file_.path(); }

 private:
  MetricsWriter file_;
  int64_t queue_size_;
  std::string pending_;
  int64_t queued_ = 0;
  std::chrono::steady_clock::time_point last_flush_;
};

struct TensorBoardOptions {
  std::string dir;
  int64_t log_interval = 1;  // tensorboard_log_interval: per-iteration tags on rows of iterations divisible by it
  int64_t queue_size = 1000;
  bool timers = false, memory = false, validation_ppl = false, world_size = false;
  bool loss_scale = true, learning_rate = true, batch_size = true;
  int world = 1;  // ranks of the run (world-size, and throughput per rank)
  int64_t global_batch_size = 0;
};

class TensorBoardLog {
 public:
  explicit TensorBoardLog(const TensorBoardOptions& o);
  // A metrics.jsonl row: a log-interval row (iteration, consumed_samples, lm_loss, lr, grad_norm,
  // step_time_ms, tflops, peak_memory_bytes, memory_*) or an evaluation row (eval_lm_loss).
  void write(const nlohmann::json& row);
  void flush() { file_.flush(); }
  const std::string& path() const { return file_.path(); }

 private:
  void both(const std::string& tag, double value, int64_t iteration, int64_t samples);
  TensorBoardOptions o_;
  EventFileWriter file_;
};

}  // namespace primus::safe
