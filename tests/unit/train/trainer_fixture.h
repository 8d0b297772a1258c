// A tiny experiment on a synthetic, learnable corpus, shared by the trainer and checkpoint tests,
// and the helpers those tests share.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "config/experiment.h"
#include "data/indexed_dataset.h"
#include "support/error_of.h"
#include "support/files.h"
#include "train/trainer.h"

namespace primus::test {

struct TinyExperiment {
  std::filesystem::path dir;
  std::string config;

  TinyExperiment() {
    namespace fs = std::filesystem;
    dir = fs::temp_directory_path() /
          ("primus_train_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    // 200 documents, each counting upward by a document-specific stride: predictable next tokens.
    data::IndexedDatasetBuilder b((dir / "corpus").string(), data::TokenDType::u16);
    for (int d = 0; d < 200; ++d) {
      std::vector<int32_t> doc;
      for (int i = 0; i < 40; ++i) doc.push_back(int32_t((d * 7 + i * (1 + d % 3)) % 50));
      b.add_item(doc);
      b.end_document();
    }
    b.finalize();
    config = (dir / "exp.yaml").string();
    std::ofstream(config) << "exp_name: tiny_test\nworkspace: " << (dir / "ws").string() << R"(
modules:
  pre_trainer:
    model: tiny
    overrides:
      num_layers: 1
      micro_batch_size: 2
      global_batch_size: 4
      seq_length: 32
      train_iters: 40
      lr: 3.0e-3
      lr_warmup_iters: 4
      lr_decay_style: cosine
      min_lr: 3.0e-4
      log_interval: 5
      eval_interval: 20
      eval_iters: 2
      split: 90,10,0
      data_path: [)" << (dir / "corpus").string() << R"(]
)";
  }
  ~TinyExperiment() { std::filesystem::remove_all(dir); }

  config::ExperimentConfig load(std::vector<std::pair<std::string, std::string>> overrides = {}) const {
    return config::load_experiment(config, overrides);
  }
};

// The message with which train::pretrain refuses `cfg`, or "(no error)" when it trains.
inline std::string pretrain_error(const config::ExperimentConfig& cfg) {
  return error_of([&] { train::pretrain(cfg); });
}

}  // namespace primus::test
