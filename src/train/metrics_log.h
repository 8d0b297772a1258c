// The trainer's rows (one per log interval, one per evaluation) written to every sink the config
// asks for: metrics.jsonl always, TensorBoard event files when tensorboard_dir is set (or Primus's
// disable_tensorboard is false). Both get the same row, so the event file's scalars are the
// metrics.jsonl values. Only the rank that writes metrics.jsonl (world rank 0) has one.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "config/experiment.h"
#include "safe/metrics_writer.h"
#include "safe/tensorboard.h"

namespace primus::train {

class MetricsLog {
 public:
  MetricsLog(const config::ExperimentConfig& cfg, int world_size);
  void write(const nlohmann::json& row);
  // Writes what the sinks still hold (TensorBoard's queue): at checkpoints and at the end.
  void flush();
  // The TensorBoard folder the config asks for ("" when none).
  static std::string tensorboard_dir(const config::ExperimentConfig& cfg);

 private:
  safe::MetricsWriter jsonl_;
  std::unique_ptr<safe::TensorBoardLog> tensorboard_;
};

}  // namespace primus::train
