#include "train/checkpoint_saves.h"

#include <fstream>

#include <fmt/format.h>

#include "checkpoint/run_folder.h"
#include "core/log.h"
#include "parallel/process_group.h"

namespace primus::train {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM"); -1 when unknown.
int64_t proc_status_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size())) * 1024;  // "  1234 kB"
  return -1;
}

// Resets the peak resident memory (VmHWM) to the current one; false where Linux does not allow it.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return bool(out);
}

std::string mib(double bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

}  // namespace

CheckpointSaves::CheckpointSaves(Setup setup) : s_(std::move(setup)) {}
CheckpointSaves::~CheckpointSaves() = default;  // a save in flight: its thread is joined, its folder left

void CheckpointSaves::save(const DataParallelStrategy& dp, const checkpoint::TrainState& state,
                           const std::string& config_yaml, const checkpoint::SaveOptions& options) {
  wait();
  const auto t0 = Clock::now();
  rss_before_ = reset_peak_rss() ? proc_status_bytes("VmRSS") : -1;
  iteration_ = state.iteration;
  run_id_ = state.run_id;
  shard_ = dp.shard_state();
  checkpoint::SaveOptions o = options;
  o.world = s_.world;
  o.async = s_.async;
  o.host_buffer = &host_buffer_;
  for (const std::vector<float>& c : shard_.copies) o.source_host_bytes += c.size() * sizeof(float);
  pending_ = std::make_unique<checkpoint::CheckpointSave>(s_.dir, shard_.source, state, config_yaml, o);
  // The save's own memory: sync, the whole write; async, the host copy (its thread then adds at
  // most the staging buffer). Later steps' activations are not the save's.
  const int64_t hwm = rss_before_ >= 0 ? proc_status_bytes("VmHWM") : -1;
  rss_delta_ = hwm >= 0 ? double(std::max<int64_t>(0, hwm - rss_before_)) : -1.0;
  if (s_.async) shard_ = {};  // copied: the strategy's host copies (device buffers) can go
  blocked_ms_ = ms_since(t0);
  if (!s_.async) finish();
}

void CheckpointSaves::poll() {
  if (pending_ && pending_->all_written()) finish();
}

void CheckpointSaves::wait() {
  if (pending_) finish();
}

void CheckpointSaves::finish() {
  const auto t0 = Clock::now();
  std::unique_ptr<checkpoint::CheckpointSave> save = std::move(pending_);
  const checkpoint::SaveReport r = save->finish();
  save.reset();
  shard_ = {};
  if (s_.metrics) s_.metrics->flush();
  if (s_.metrics) checkpoint::prune_checkpoints(s_.dir, s_.keep_last, run_id_, r.dir);
  blocked_ms_ += ms_since(t0);
  // The slowest rank's blocking time and the largest memory rise, for the log and metrics.
  double worst[2] = {blocked_ms_, rss_delta_};
  if (s_.world) s_.world->all_reduce(worst, 2, parallel::CommType::F64, parallel::ReduceOp::Max);
  last_ = r.dir;
  log::info("saved checkpoint {} ({}): {} rank(s) wrote {}; write {:.1f} ms (slowest rank), training blocked "
            "{:.1f} ms (slowest rank; here: open {:.1f}{}, end {:.1f}); host memory for the save: buffers {} "
            "(largest rank), peak resident +{}",
            r.dir, s_.async ? "async" : "sync", r.writers, mib(double(r.total_bytes)), r.max_write_ms, worst[0],
            r.open_ms,
            s_.async ? fmt::format(", host copy {:.1f}, waiting for the write {:.1f}", r.copy_ms, r.wait_ms)
                     : fmt::format(", write {:.1f}", r.write_ms),
            r.publish_ms, mib(double(r.max_host_buffer_bytes)), worst[1] >= 0 ? mib(worst[1]) : "unknown");
  if (s_.metrics)
    s_.metrics->write({{"iteration", iteration_},
                       {"save_blocking_ms", worst[0]},
                       {"save_write_ms", r.max_write_ms},
                       {"save_bytes", r.total_bytes},
                       {"save_writers", r.writers},
                       {"save_async", s_.async},
                       {"save_host_buffer_bytes", r.max_host_buffer_bytes},
                       {"save_peak_rss_delta_bytes", worst[1]}});
}

}  // namespace primus::train
