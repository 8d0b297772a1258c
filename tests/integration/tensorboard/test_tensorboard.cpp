// A 2-rank training run with tensorboard_dir set writes TensorBoard event files whose scalars, read
// back by an independent reader (read_events.py: Debian's python3-protobuf and python3-crc32c),
// carry Megatron's tags and equal metrics.jsonl's values at every logged iteration.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "support/run_command.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class TensorBoardRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("primus_tb_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "exp.yaml") << "exp_name: tb\nworkspace: " << (dir_ / "ws").string() << R"(
modules:
  pre_trainer:
    model: tiny
    overrides:
      num_layers: 1
      micro_batch_size: 2
      global_batch_size: 4
      seq_length: 32
      train_iters: 6
      lr: 3.0e-3
      lr_warmup_iters: 2
      log_interval: 1
      eval_interval: 3
      eval_iters: 1
      save_interval: 0
      mock_data: true
      tensorboard_dir: )" << (dir_ / "tb").string()
                                     << R"(
      tensorboard_log_interval: 2
      log_timers_to_tensorboard: true
      log_memory_to_tensorboard: true
      log_validation_ppl_to_tensorboard: true
      log_world_size_to_tensorboard: true
)";
    const auto r = primus::test::run_command("cd " + dir_.string() + " && " + PRIMUS_CLI_PATH +
                                             " direct --nproc 2 -- train pretrain --config exp.yaml 2>&1");
    ASSERT_EQ(r.code, 0) << r.out;
    std::ifstream in(dir_ / "ws" / "tb" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) rows_.push_back(json::parse(line));
    const auto read = primus::test::run_command(std::string("/usr/bin/python3 ") + PRIMUS_SOURCE_DIR +
                                                "/tests/integration/tensorboard/read_events.py " +
                                                (dir_ / "tb").string());
    ASSERT_EQ(read.code, 0) << read.out;
    events_ = json::parse(read.out);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // The value of `tag` at `step`; NaN when the event file has none.
  static double at(const std::string& tag, int64_t step) {
    if (!events_["scalars"].contains(tag)) return std::nan("");
    for (const auto& p : events_["scalars"][tag])
      if (p[0].get<int64_t>() == step) return p[1].get<double>();
    return std::nan("");
  }
  // Event files hold float32: equal to the double in metrics.jsonl rounded to float.
  static void expect_value(const std::string& tag, int64_t step, double want) {
    const double got = at(tag, step);
    EXPECT_EQ(got, double(float(want))) << tag << " at step " << step;
  }

  static void training_scalars_equal_metrics_jsonl();
  static void validation_loss_and_perplexity();

  static inline fs::path dir_;
  static inline std::vector<json> rows_;
  static inline json events_;
};

// ctest runs each case in its own process: one case, so that the training runs once.
void one_event_file_with_its_version(const json& events) {
  EXPECT_EQ(events["files"], 1);
  EXPECT_EQ(events["file_version"], "brain.Event:2");
}

void TensorBoardRun::training_scalars_equal_metrics_jsonl() {
  int logged = 0;
  for (const json& row : rows_) {
    if (!row.contains("lm_loss")) continue;
    const int64_t it = row["iteration"], samples = row["consumed_samples"];
    // Timers at every logged iteration: seconds per iteration, TFLOP/s per rank.
    expect_value("iteration-time", it, row["step_time_ms"].get<double>() / 1e3);
    expect_value("throughput", it, row["tflops"].get<double>() / 2);
    if (it % 2 != 0) {  // tensorboard_log_interval 2
      EXPECT_TRUE(std::isnan(at("lm loss", it))) << "iteration " << it << " is not a multiple of 2";
      continue;
    }
    ++logged;
    for (const auto& [tag, key] : std::map<std::string, std::string>{
             {"lm loss", "lm_loss"}, {"learning-rate", "lr"}, {"grad-norm", "grad_norm"}}) {
      expect_value(tag, it, row[key].get<double>());
      expect_value(tag + " vs samples", samples, row[key].get<double>());
    }
    expect_value("batch-size", it, 4);
    expect_value("world-size", it, 2);
    expect_value("loss-scale", it, 1);
    expect_value("mem-max-allocated-bytes", it, row["peak_memory_bytes"].get<double>());
    expect_value("mem-allocated-bytes", it, row["memory_allocated_bytes"].get<double>());
    expect_value("mem-reserved-bytes", it, row["memory_reserved_bytes"].get<double>());
  }
  EXPECT_EQ(logged, 3);
  EXPECT_EQ(events_["scalars"]["lm loss"].size(), 3u);
}

void TensorBoardRun::validation_loss_and_perplexity() {
  int evals = 0;
  for (const json& row : rows_) {
    if (!row.contains("eval_lm_loss")) continue;
    ++evals;
    const double loss = row["eval_lm_loss"];
    expect_value("lm loss validation", row["iteration"], loss);
    expect_value("lm loss validation vs samples", row["consumed_samples"], loss);
    expect_value("lm loss validation ppl", row["iteration"], std::exp(loss));
  }
  EXPECT_EQ(evals, 2);
}

TEST_F(TensorBoardRun, EventFilesReadBackEqualMetricsJsonl) {
  one_event_file_with_its_version(events_);
  training_scalars_equal_metrics_jsonl();
  validation_loss_and_perplexity();
}

}  // namespace
