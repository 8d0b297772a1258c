// FP8 training through the trainer (docs/fp8.md): each recipe trains the tiny experiment about as
// well as without FP8, delayed scaling's state is in the checkpoint so a resume continues bit for
// bit, and what is not built is refused by name before training.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "support/error_of.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using namespace primus;
using Overrides = std::vector<std::pair<std::string, std::string>>;

namespace {

std::vector<nlohmann::json> rows_of(const config::ExperimentConfig& cfg) {
  std::ifstream in(fs::path(cfg.run_dir()) / "metrics.jsonl");
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

Overrides with(Overrides o, const Overrides& more) {
  o.insert(o.end(), more.begin(), more.end());
  return o;
}

TEST(Fp8Trainer, EveryRecipeTrainsAboutAsWellAsWithoutFp8) {
  test::TinyExperiment exp;
  const Overrides base = {{"train_iters", "20"}, {"eval_interval", "0"}, {"log_interval", "1"}};
  const double ref = train::pretrain(exp.load(with(base, {{"exp_name", "ref"}}))).last_loss;
  for (const char* recipe : {"delayed", "tensorwise", "blockwise", "mxfp8"}) {
    auto s = train::pretrain(
        exp.load(with(base, {{"exp_name", std::string("fp8_") + recipe}, {"fp8", "hybrid"}, {"fp8_recipe", recipe}})));
    EXPECT_LT(s.last_loss, 0.75 * s.first_loss) << recipe;
    EXPECT_NEAR(s.last_loss, ref, 0.05 * ref) << recipe << " against " << ref << " without fp8";
  }
}

// A mixture of experts in FP8: the experts' grouped GEMM with a scale per expert, the shared
// expert's linears, the router in high precision.
TEST(Fp8Trainer, AMixtureOfExpertsTrainsInEveryRecipe) {
  test::TinyExperiment exp;
  const Overrides base = {{"train_iters", "12"}, {"eval_interval", "0"}, {"log_interval", "1"}, {"num_experts", "4"},
                          {"moe_router_topk", "2"}, {"moe_ffn_hidden_size", "32"},
                          {"moe_shared_expert_intermediate_size", "32"}};
  const double ref = train::pretrain(exp.load(with(base, {{"exp_name", "moe_ref"}}))).last_loss;
  for (const char* recipe : {"delayed", "tensorwise", "blockwise", "mxfp8"}) {
    auto s = train::pretrain(exp.load(
        with(base, {{"exp_name", std::string("moe_fp8_") + recipe}, {"fp8", "hybrid"}, {"fp8_recipe", recipe}})));
    EXPECT_LT(s.last_loss, 0.85 * s.first_loss) << recipe;
    EXPECT_NEAR(s.last_loss, ref, 0.05 * ref) << recipe << " against " << ref << " without fp8";
  }
}

TEST(Fp8Trainer, DelayedScalingResumesBitForBit) {
  test::TinyExperiment exp;
  const Overrides fp8 = {{"fp8", "hybrid"}, {"fp8_amax_history_len", "4"}, {"log_interval", "1"},
                         {"eval_interval", "0"}, {"lr_decay_iters", "8"}};
  auto full = exp.load(with(fp8, {{"exp_name", "full"}, {"train_iters", "8"}}));
  train::pretrain(full);
  auto part = exp.load(with(fp8, {{"exp_name", "part"}, {"train_iters", "3"}}));
  const std::string ckpt = train::pretrain(part).last_checkpoint;
  // The checkpoint indexes each FP8 linear's scaling state.
  std::ifstream meta_in(fs::path(ckpt) / "meta.json");
  const nlohmann::json meta = nlohmann::json::parse(meta_in);
  ASSERT_TRUE(meta.contains("state"));
  EXPECT_TRUE(meta["state"].contains("decoder.layers.0.mlp.linear_fc1.weight.fp8_scaling")) << meta["state"].dump();
  auto rest = exp.load(with(fp8, {{"exp_name", "part"}, {"train_iters", "8"}}));
  EXPECT_EQ(train::pretrain(rest).start_iteration, 3);
  const auto a = rows_of(full), b = rows_of(rest);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(a[i]["lm_loss"].get<double>(), b[i]["lm_loss"].get<double>()) << "iteration " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << "iteration " << i + 1;
  }
}

TEST(Fp8Trainer, WhatIsNotBuiltIsRefusedByName) {
  test::TinyExperiment exp;
  EXPECT_NE(test::error_of([&] { exp.load({{"fp8", "hybrid"}, {"fp8_param_gather", "true"}}); })
                .find("fp8_param_gather"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { exp.load({{"fp8", "e5m2"}}); }).find("fp8 'e5m2' is not one of: e4m3, hybrid"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { exp.load({{"fp8", "hybrid"}, {"fp8_recipe", "nvfp4"}}); }).find("fp8_recipe"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { exp.load({{"fp8", "hybrid"}, {"fp8_amax_history_len", "0"}}); })
                .find("fp8_amax_history_len must be at least 1"),
            std::string::npos);
  // Off, the other keys are accepted as written (Primus's configs set them beside fp8: null).
  EXPECT_NO_THROW(exp.load({{"fp8_recipe", "blockwise"}, {"fp8_amax_history_len", "16"}}));
}

}  // namespace
