// LoRA through the trainer: the frozen tensors come out of training bit-identical, the optimizer
// state (memory row and checkpoint moments) is the adapters' alone, the adapters train, and a run
// resumed from a checkpoint continues as the run that never stopped.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "kernels/cpu/cpu_backend.h"
#include "plan/model_options.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using namespace primus;

namespace {

std::vector<nlohmann::json> lora_metrics(const config::ExperimentConfig& cfg) {
  std::ifstream in(fs::path(cfg.run_dir()) / "metrics.jsonl");
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (!row.contains("save_bytes")) rows.push_back(std::move(row));
  }
  return rows;
}

const std::vector<std::pair<std::string, std::string>> kLora = {{"modules.pre_trainer.overrides.lora.enabled", "true"},
                                                                {"lora.dim", "4"},
                                                                {"lora.alpha", "8"},
                                                                {"eval_interval", "0"},
                                                                {"log_interval", "1"},
                                                                {"lr", "1e-2"}};

config::ExperimentConfig with(const test::TinyExperiment& exp, std::vector<std::pair<std::string, std::string>> more) {
  auto o = kLora;
  o.insert(o.end(), more.begin(), more.end());
  return exp.load(o);
}

}  // namespace

TEST(TrainerLora, FrozenBaseAdapterOnlyStateAndResume) {
  test::TinyExperiment exp;
  const auto full = with(exp, {{"exp_name", "full"}, {"train_iters", "6"}, {"save_interval", "3"}});
  ASSERT_TRUE(full.train.lora.enabled);
  train::pretrain(full);

  // The model as the run built it, at its initial weights.
  LlamaModel init(full.model_spec, cpu::cpu_backend(), Precision::Fp32, plan::model_options(full.train));
  init.init_weights(uint64_t(full.train.seed));
  const ParamStore& p = init.params();
  const int64_t begin = init.trainable_begin(), trainable = p.numel() - begin;
  ASSERT_GT(begin, 0);
  const checkpoint::CheckpointData saved =
      checkpoint::load_checkpoint((fs::path(full.checkpoint_dir()) / checkpoint::checkpoint_name(6)).string(), p);
  // Frozen: bit-identical after 6 steps of AdamW with weight decay; no moments.
  EXPECT_EQ(std::memcmp(saved.params.data(), p.values().data<float>(), size_t(begin) * sizeof(float)), 0);
  for (int64_t i = 0; i < begin; ++i) ASSERT_EQ(saved.exp_avg_sq[size_t(i)], 0.0f) << i;
  // The adapters trained: B left zero, and moments there.
  double moved = 0, second = 0;
  for (int64_t i = begin; i < p.numel(); ++i) {
    moved += std::fabs(saved.params[size_t(i)] - p.values().data<float>()[i]);
    second += saved.exp_avg_sq[size_t(i)];
  }
  EXPECT_GT(moved, 0.0);
  EXPECT_GT(second, 0.0);
  // The optimizer's bytes: two fp32 moments of the adapters.
  const auto rows = lora_metrics(full);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0]["memory_optimizer_bytes"].get<double>(), 2.0 * 4.0 * double(trainable));
  EXPECT_LT(rows[5]["lm_loss"].get<double>(), rows[0]["lm_loss"].get<double>());

  // Stopped at 3 and resumed: the same losses as the run that never stopped.
  train::pretrain(with(exp, {{"exp_name", "part"}, {"train_iters", "3"}, {"lr_decay_iters", "6"}}));
  const auto rest = with(exp, {{"exp_name", "part"}, {"train_iters", "6"}});
  EXPECT_EQ(train::pretrain(rest).start_iteration, 3);
  const auto resumed = lora_metrics(rest);
  ASSERT_EQ(resumed.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(resumed[i]["lm_loss"].get<double>(), rows[i]["lm_loss"].get<double>()) << "iteration " << i + 1;
}

// LoRA from a base model's checkpoint (finetune): the checkpoint has no adapters; they start at
// their init (B = 0), so the first loss is the base model's, as a full finetune from it sees.
TEST(TrainerLora, FinetuneFromABaseCheckpoint) {
  test::TinyExperiment exp;
  const auto base = exp.load({{"exp_name", "base"},
                              {"train_iters", "3"},
                              {"lr_decay_iters", "10"},
                              {"eval_interval", "0"},
                              {"log_interval", "1"}});
  train::pretrain(base);
  const std::string ckpt = (fs::path(base.checkpoint_dir()) / checkpoint::checkpoint_name(3)).string();
  const auto full = exp.load({{"exp_name", "full_ft"},
                              {"train_iters", "2"},
                              {"lr_decay_iters", "10"},
                              {"lr_warmup_iters", "0"},
                              {"eval_interval", "0"},
                              {"log_interval", "1"},
                              {"load", ckpt},
                              {"finetune", "true"}});
  train::pretrain(full);
  const auto lora = with(exp, {{"exp_name", "lora_ft"},
                               {"train_iters", "2"},
                               {"lr_decay_iters", "10"},
                               {"lr_warmup_iters", "0"},
                               {"load", ckpt},
                               {"finetune", "true"}});
  train::pretrain(lora);
  const auto a = lora_metrics(full), b = lora_metrics(lora);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0]["lm_loss"].get<double>(), a[0]["lm_loss"].get<double>());
  EXPECT_NE(b[1]["lm_loss"].get<double>(), a[1]["lm_loss"].get<double>());  // then they train different weights
}

// LoRA dropout (model/linears.h): the masks come from the seed and each microbatch's first sample,
// so a run stopped and resumed draws the masks of the run that never stopped (the same losses, bit
// for bit); dropout moves the losses once B has left zero (B = 0 hides it, and the first step's
// warmup learning rate is 0: the losses differ from the third step).
TEST(TrainerLora, DropoutResumesBitIdentical) {
  test::TinyExperiment exp;
  const std::vector<std::pair<std::string, std::string>> drop = {{"lora.dropout", "0.2"},
                                                                 {"lora.dropout_position", "pre"},
                                                                 {"lr_decay_iters", "8"}};
  auto run = [&](const std::string& name, const std::string& iters, bool dropout) {
    std::vector<std::pair<std::string, std::string>> o = {{"exp_name", name}, {"train_iters", iters}};
    if (dropout) o.insert(o.end(), drop.begin(), drop.end());
    else o.push_back({"lr_decay_iters", "8"});
    const auto cfg = with(exp, o);
    train::pretrain(cfg);
    return lora_metrics(cfg);
  };
  const auto plain = run("plain", "4", false), full = run("full", "4", true);
  ASSERT_EQ(full.size(), 4u);
  EXPECT_EQ(full[0]["lm_loss"].get<double>(), plain[0]["lm_loss"].get<double>());
  EXPECT_NE(full[2]["lm_loss"].get<double>(), plain[2]["lm_loss"].get<double>());
  EXPECT_NE(full[3]["lm_loss"].get<double>(), plain[3]["lm_loss"].get<double>());
  run("part", "2", true);
  const auto resumed = run("part", "4", true);
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(resumed[i]["lm_loss"].get<double>(), full[i]["lm_loss"].get<double>()) << "iteration " << i + 1;
}
