// bf16 mixed precision through the trainer (the CPU reference backend here; the GPU suite runs
// the same on the CUDA backend): it learns like the fp32 run, its checkpoints are the fp32
// model's (a bf16 run resumes as fp32 and the other way round), and impossible requests fail
// before training with the key named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "train/compute.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using namespace primus;

namespace {
std::vector<double> losses(const config::ExperimentConfig& cfg) {
  std::ifstream in(fs::path(cfg.run_dir()) / "metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("lm_loss")) out.push_back(j["lm_loss"].get<double>());
  }
  return out;
}
const std::vector<std::pair<std::string, std::string>> kShort = {
    {"train_iters", "12"}, {"log_interval", "1"}, {"eval_interval", "0"}, {"lr_decay_iters", "12"},
    {"device", "cpu"}};
std::vector<std::pair<std::string, std::string>> with(std::vector<std::pair<std::string, std::string>> v,
                                                      std::initializer_list<std::pair<std::string, std::string>> more) {
  v.insert(v.end(), more);
  return v;
}
}  // namespace

TEST(TrainerBf16, LearnsLikeTheFp32Run) {
  test::TinyExperiment exp;
  auto fp32 = exp.load(with(kShort, {{"exp_name", "fp32"}}));
  auto bf16 = exp.load(with(kShort, {{"exp_name", "bf16"}, {"bf16", "true"}}));
  const auto s32 = train::pretrain(fp32);
  const auto s16 = train::pretrain(bf16);
  EXPECT_LT(s16.last_loss, 0.8 * s16.first_loss) << "the bf16 run learns";
  const auto a = losses(fp32), b = losses(bf16);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 0.005 * a[i]) << "iteration " << i + 1;
  (void)s32;
}

TEST(TrainerBf16, CheckpointsAreTheFp32ModelsBothWays) {
  test::TinyExperiment exp;
  // bf16 for 6 iterations, then fp32 resumes from its checkpoint, and the other way round: each
  // resumed run continues from where the first left off (its loss picks up, not restarts).
  auto first = exp.load(with(kShort, {{"exp_name", "a"}, {"bf16", "true"}, {"train_iters", "6"}}));
  const auto s1 = train::pretrain(first);
  auto second = exp.load(with(kShort, {{"exp_name", "a"}}));
  const auto s2 = train::pretrain(second);
  EXPECT_EQ(s2.start_iteration, 6);
  EXPECT_LT(s2.first_loss, s1.first_loss - 0.2) << "resumed from trained weights";
  auto third = exp.load(with(kShort, {{"exp_name", "b"}, {"train_iters", "6"}}));
  const auto s3 = train::pretrain(third);
  auto fourth = exp.load(with(kShort, {{"exp_name", "b"}, {"bf16", "true"}}));
  const auto s4 = train::pretrain(fourth);
  EXPECT_EQ(s4.start_iteration, 6);
  EXPECT_LT(s4.first_loss, s3.first_loss - 0.2);
  // Both pairs saw the same data and the same steps in the same precisions, swapped: close ends.
  EXPECT_NEAR(s2.last_loss, s4.last_loss, 0.05 * s4.last_loss);
}

// The distributed optimizer in bf16: on one rank its shard is the whole buffer, so it must train
// exactly like the replicated optimizer (its working copy refreshed by a cast after the step).
TEST(TrainerBf16, DistributedOptimizerOnOneRankEqualsTheReplicatedOne) {
  test::TinyExperiment exp;
  auto plain = exp.load(with(kShort, {{"exp_name", "plain"}, {"bf16", "true"}, {"train_iters", "6"}}));
  auto zero = exp.load(with(kShort, {{"exp_name", "zero"}, {"bf16", "true"}, {"train_iters", "6"},
                                     {"use_distributed_optimizer", "true"}}));
  train::pretrain(plain);
  train::pretrain(zero);
  const auto a = losses(plain), b = losses(zero);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
}

TEST(TrainerBf16, ImpossibleRequestsFailBeforeTraining) {
  test::TinyExperiment exp;
  auto expect_error = [&](const std::vector<std::pair<std::string, std::string>>& o, const std::string& needle) {
    auto cfg = exp.load(o);
    try {
      train::pretrain(cfg);
      FAIL() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(fs::path(cfg.checkpoint_dir())));
  };
  expect_error({{"device", "cuda"}, {"bf16", "false"}}, train::cuda_built() ? "set bf16: true" : "without the CUDA backend");
  if (!train::cuda_usable())
    expect_error({{"device", "cuda"}, {"bf16", "true"}}, train::cuda_built() ? "device: cuda, but" : "without the CUDA backend");
  try {
    exp.load({{"device", "tpu"}});
    FAIL() << "device tpu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("auto, cpu, cuda"), std::string::npos) << e.what();
  }
}
