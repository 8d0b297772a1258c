#include "train/metrics_log.h"

#include <filesystem>

#include "core/log.h"

namespace fs = std::filesystem;

namespace primus::train {

std::string MetricsLog::tensorboard_dir(const config::ExperimentConfig& cfg) {
  if (!cfg.train.tensorboard_dir.empty()) return cfg.train.tensorboard_dir;
  return cfg.train.disable_tensorboard ? "" : (fs::path(cfg.run_dir()) / "tensorboard").string();
}

MetricsLog::MetricsLog(const config::ExperimentConfig& cfg, int world_size)
    : jsonl_((fs::path(cfg.run_dir()) / "metrics.jsonl").string()) {
  const std::string dir = tensorboard_dir(cfg);
  if (dir.empty()) return;
  const config::TrainingArgs& a = cfg.train;
  safe::TensorBoardOptions o;
  o.dir = dir;
  o.log_interval = a.tensorboard_log_interval;
  o.queue_size = a.tensorboard_queue_size;
  o.timers = a.log_timers_to_tensorboard;
  o.memory = a.log_memory_to_tensorboard;
  o.validation_ppl = a.log_validation_ppl_to_tensorboard;
  o.world_size = a.log_world_size_to_tensorboard;
  o.loss_scale = a.log_loss_scale_to_tensorboard;
  o.learning_rate = a.log_learning_rate_to_tensorboard;
  o.batch_size = a.log_batch_size_to_tensorboard;
  o.world = world_size;
  o.global_batch_size = a.global_batch_size;
  tensorboard_ = std::make_unique<safe::TensorBoardLog>(o);
  log::info("TensorBoard: writing {}", tensorboard_->path());
}

void MetricsLog::write(const nlohmann::json& row) {
  jsonl_.write(row);
  if (tensorboard_) tensorboard_->write(row);
}

void MetricsLog::flush() {
  if (tensorboard_) tensorboard_->flush();
}

}  // namespace primus::train
