// The precision-aware optimizer through the trainer (docs/optim.md#low-precision-optimizer-state):
// bf16 moments and bf16 main gradients (Primus's MoE configs), bf16 parameters (MaxText's
// weight_dtype: bfloat16), and Transformer Engine's scaled states (fp16 and fp8 moments, the fp16
// master), on the CPU's bf16 backend. They learn like the fp32-state run; the checkpoints keep
// their format (fp32 moments holding exactly the stored values); a low-precision run resumes bit
// for bit; checkpoints move between fp32, bf16, fp16 and fp8 states.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using namespace primus;

namespace {

using Keys = std::vector<std::pair<std::string, std::string>>;

std::vector<nlohmann::json> rows(const config::ExperimentConfig& cfg) {
  std::ifstream in(fs::path(cfg.run_dir()) / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (row.contains("lm_loss")) out.push_back(std::move(row));
  }
  return out;
}

Keys with(Keys v, std::initializer_list<std::pair<std::string, std::string>> more) {
  v.insert(v.end(), more);
  return v;
}

const Keys kShort = {{"train_iters", "12"},    {"log_interval", "1"}, {"eval_interval", "0"},
                     {"lr_decay_iters", "12"}, {"device", "cpu"},     {"bf16", "true"}};
// Primus's settings (8 of its MoE configs and its SFT ones).
const Keys kBf16State = {{"use_precision_aware_optimizer", "true"},
                         {"main_grads_dtype", "bf16"},
                         {"exp_avg_dtype", "bf16"},
                         {"exp_avg_sq_dtype", "bf16"}};

// Transformer Engine's scaled states: fp8 (E4M3) first moments, fp16 second moments (the pairing
// MS-AMP and TE's tests use), TE's fp16 master weights.
const Keys kScaledState = {{"use_precision_aware_optimizer", "true"},
                           {"main_params_dtype", "fp16"},
                           {"exp_avg_dtype", "fp8"},
                           {"exp_avg_sq_dtype", "fp16"}};

bool is_bf16_value(float x) { return bf16::from_float(x).to_float() == x; }

// The moments and values of a run's newest checkpoint.
checkpoint::CheckpointData read_checkpoint(const config::ExperimentConfig& cfg) {
  LlamaModel model(cfg.model_spec, cpu::cpu_backend(), Precision::Fp32, LlamaOptions{}, ModelPartition{});
  return checkpoint::load_checkpoint(checkpoint::resolve_checkpoint(cfg.checkpoint_dir()), model.params());
}

}  // namespace

// bf16 moments and gradients, then bf16 parameters too, then TE's scaled states (fp8 and fp16
// moments, both fp8, and with the fp16 master): the loss curve stays close to the fp32-state run's
// (12 steps, the tiny model), and still falls.
TEST(TrainerPrecisionAware, LearnsLikeTheFp32StateRun) {
  test::TinyExperiment exp;
  const auto fp32 = exp.load(with(kShort, {{"exp_name", "fp32"}}));
  Keys low_keys = kShort;
  low_keys.insert(low_keys.end(), kBf16State.begin(), kBf16State.end());
  const auto low = exp.load(with(low_keys, {{"exp_name", "low"}}));
  const auto pure = exp.load(with(low_keys, {{"exp_name", "pure"}, {"main_params_dtype", "bf16"}}));
  train::pretrain(fp32);
  const auto s_low = train::pretrain(low);
  const auto s_pure = train::pretrain(pure);
  const auto a = rows(fp32), b = rows(low), c = rows(pure);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  ASSERT_EQ(c.size(), 12u);
  double worst_low = 0, worst_pure = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double la = a[i]["lm_loss"].get<double>();
    EXPECT_NEAR(b[i]["lm_loss"].get<double>(), la, 0.002 * la) << "bf16 moments and gradients, iteration " << i + 1;
    EXPECT_NEAR(c[i]["lm_loss"].get<double>(), la, 0.01 * la) << "bf16 parameters too, iteration " << i + 1;
    worst_low = std::max(worst_low, std::fabs(b[i]["lm_loss"].get<double>() - la) / la);
    worst_pure = std::max(worst_pure, std::fabs(c[i]["lm_loss"].get<double>() - la) / la);
  }
  std::printf("[ info     ] losses against the fp32-state run: bf16 moments and gradients within %.1e, bf16 "
              "parameters too within %.1e (relative)\n",
              worst_low, worst_pure);
  EXPECT_LT(s_low.last_loss, 0.8 * s_low.first_loss);
  EXPECT_LT(s_pure.last_loss, 0.8 * s_pure.first_loss);
  // TE's scaled states: with an fp32 master (fp8 / fp16 moments, both fp8), then with its fp16 master.
  const struct {
    const char* name;
    Keys keys;
    double tolerance;
  } scaled[] = {
      {"fp8 exp_avg, fp16 exp_avg_sq",
       {{"use_precision_aware_optimizer", "true"}, {"exp_avg_dtype", "fp8"}, {"exp_avg_sq_dtype", "fp16"}},
       0.001},
      {"fp8 exp_avg and exp_avg_sq",
       {{"use_precision_aware_optimizer", "true"}, {"exp_avg_dtype", "fp8"}, {"exp_avg_sq_dtype", "fp8"}},
       0.002},
      {"fp16 master, fp8 exp_avg, fp16 exp_avg_sq", kScaledState, 0.001},
  };
  for (const auto& k : scaled) {
    Keys keys = kShort;
    keys.insert(keys.end(), k.keys.begin(), k.keys.end());
    const auto cfg = exp.load(with(keys, {{"exp_name", std::string("scaled_") + std::to_string(&k - scaled)}}));
    const auto st = train::pretrain(cfg);
    const auto r = rows(cfg);
    ASSERT_EQ(r.size(), 12u) << k.name;
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double la = a[i]["lm_loss"].get<double>();
      EXPECT_NEAR(r[i]["lm_loss"].get<double>(), la, k.tolerance * la) << k.name << ", iteration " << i + 1;
      worst = std::max(worst, std::fabs(r[i]["lm_loss"].get<double>() - la) / la);
    }
    std::printf("[ info     ] %s: losses within %.1e of the fp32-state run's (relative)\n", k.name, worst);
    EXPECT_LT(st.last_loss, 0.8 * st.first_loss) << k.name;
  }
  // The checkpoint format is today's: fp32 moments, here every one exactly a bf16 value (and not
  // all zero); bf16 parameters are bf16 values too.
  const checkpoint::CheckpointData ck = read_checkpoint(pure);
  ASSERT_FALSE(ck.exp_avg.empty());
  int64_t nonzero = 0;
  for (size_t i = 0; i < ck.exp_avg.size(); ++i) {
    ASSERT_TRUE(is_bf16_value(ck.exp_avg[i]) && is_bf16_value(ck.exp_avg_sq[i]) && is_bf16_value(ck.params[i])) << i;
    nonzero += ck.exp_avg_sq[i] != 0;
  }
  EXPECT_GT(nonzero, int64_t(ck.exp_avg.size() / 2));
}

// A low-precision run stopped at iteration 5 and resumed ends bit for bit as the uninterrupted one:
// bf16 state, and TE's scaled states (the checkpoint holds the fp32 update before the fp16 master's
// rounding, and the moments' values, from which the load recomputes the same codes and scales).
TEST(TrainerPrecisionAware, ResumesBitForBit) {
  test::TinyExperiment exp;
  Keys bf16_state = kBf16State;
  bf16_state.emplace_back("main_params_dtype", "bf16");
  Keys fp8_both = {{"use_precision_aware_optimizer", "true"}, {"exp_avg_dtype", "fp8"}, {"exp_avg_sq_dtype", "fp8"}};
  int run = 0;
  for (const Keys& state : {bf16_state, kScaledState, fp8_both}) {
    Keys k = kShort;
    k.insert(k.end(), state.begin(), state.end());
    const std::string full_name = "full" + std::to_string(run), part_name = "part" + std::to_string(run++);
    const auto full = exp.load(with(k, {{"exp_name", full_name}}));
    train::pretrain(full);
    train::pretrain(exp.load(with(k, {{"exp_name", part_name}, {"train_iters", "5"}})));
    const auto rest = exp.load(with(k, {{"exp_name", part_name}}));
    EXPECT_EQ(train::pretrain(rest).start_iteration, 5);
    const auto a = rows(full), b = rows(rest);
    ASSERT_EQ(a.size(), 12u);
    ASSERT_EQ(b.size(), 12u);
    for (size_t i = 0; i < 12; ++i) {
      EXPECT_EQ(a[i]["lm_loss"].get<double>(), b[i]["lm_loss"].get<double>()) << full_name << ", iteration " << i + 1;
      EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>())
          << full_name << ", iteration " << i + 1;
    }
  }
}

// A checkpoint of fp32 state resumes with bf16 state (its moments rounded on load) and the other
// way round (the bf16 values load exactly); either continues from the trained model. The same
// between fp32 and TE's scaled states (fp8 / fp16 moments, the fp16 master), and from fp8 into bf16.
TEST(TrainerPrecisionAware, CheckpointsMoveBetweenFp32Bf16Fp16AndFp8States) {
  test::TinyExperiment exp;
  Keys low = kShort;
  low.insert(low.end(), kBf16State.begin(), kBf16State.end());
  const auto s1 = train::pretrain(exp.load(with(kShort, {{"exp_name", "a"}, {"train_iters", "6"}})));
  const auto s2 = train::pretrain(exp.load(with(low, {{"exp_name", "a"}})));
  EXPECT_EQ(s2.start_iteration, 6);
  EXPECT_LT(s2.first_loss, s1.first_loss - 0.2) << "resumed from trained weights";
  const auto s3 = train::pretrain(exp.load(with(low, {{"exp_name", "b"}, {"train_iters", "6"}})));
  const auto s4 = train::pretrain(exp.load(with(kShort, {{"exp_name", "b"}})));
  EXPECT_EQ(s4.start_iteration, 6);
  EXPECT_LT(s4.first_loss, s3.first_loss - 0.2);
  EXPECT_NEAR(s2.last_loss, s4.last_loss, 0.05 * s4.last_loss);

  Keys scaled = kShort;
  scaled.insert(scaled.end(), kScaledState.begin(), kScaledState.end());
  const auto s5 = train::pretrain(exp.load(with(kShort, {{"exp_name", "c"}, {"train_iters", "6"}})));
  const auto s6 = train::pretrain(exp.load(with(scaled, {{"exp_name", "c"}})));
  EXPECT_EQ(s6.start_iteration, 6);
  EXPECT_LT(s6.first_loss, s5.first_loss - 0.2);
  const auto c7 = exp.load(with(scaled, {{"exp_name", "d"}, {"train_iters", "6"}}));
  const auto s7 = train::pretrain(c7);
  // Its checkpoint: the fp8 first moments are E4M3 codes times their tensor's factor (at most 256
  // distinct magnitudes per tensor, far fewer than the values an fp32 state has).
  const checkpoint::CheckpointData ck = read_checkpoint(c7);
  ASSERT_FALSE(ck.exp_avg.empty());
  int64_t nonzero = 0;
  for (float x : ck.exp_avg) nonzero += x != 0;
  EXPECT_GT(nonzero, int64_t(ck.exp_avg.size() / 2));
  const auto s8 = train::pretrain(exp.load(with(kShort, {{"exp_name", "d"}})));
  EXPECT_EQ(s8.start_iteration, 6);
  EXPECT_LT(s8.first_loss, s7.first_loss - 0.2);
  EXPECT_NEAR(s6.last_loss, s8.last_loss, 0.05 * s8.last_loss);
  const auto s9 = train::pretrain(exp.load(with(low, {{"exp_name", "d"}, {"train_iters", "18"}})));
  EXPECT_EQ(s9.start_iteration, 12);
  EXPECT_LT(s9.last_loss, s8.last_loss);
}
