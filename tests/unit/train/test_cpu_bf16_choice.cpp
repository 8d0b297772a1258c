// Which backend bf16 trains on without a GPU (train/compute.h): the CPU bf16 backend where the CPU
// runs it, the reference backend where it does not or when PRIMUS_CPU_BF16=reference asks for it,
// and a bad PRIMUS_CPU_BF16 an error naming the variable. The trainer learns on the reference
// backend chosen that way (the bf16 trainer tests run on whichever backend the CPU gets).
//
// CpuBf16Fallback.* run only in the ctest entry that hides the bf16 instructions
// (PRIMUS_CPU_MASK=avx512_bf16,amx): the path of a CPU without them, on any machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "train/compute.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace primus;

namespace {

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* value) : name(n) { ::setenv(n, value, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

config::TrainingArgs cpu_bf16_args() {
  config::TrainingArgs a;
  a.device = "cpu";
  a.bf16 = true;
  return a;
}

}  // namespace

TEST(CpuBf16Choice, TheBf16BackendWhereTheCpuRunsIt) {
  const train::Compute c = train::choose_compute(cpu_bf16_args(), 0);
  EXPECT_EQ(c.precision, Precision::Bf16);
  EXPECT_EQ(c.device, Device::CPU);
  if (cpu::Bf16Backend::supported())
    EXPECT_EQ(c.backend->name().rfind("cpu-bf16", 0), 0u) << c.backend->name();
  else
    EXPECT_EQ(c.backend->name(), "cpu-reference");
  EXPECT_TRUE(c.backend->computes_in(DType::BF16));
  // fp32 is untouched: the CPU backend.
  config::TrainingArgs f = cpu_bf16_args();
  f.bf16 = false;
  EXPECT_EQ(train::choose_compute(f, 0).backend->name(), "cpu");
}

TEST(CpuBf16Choice, TheReferenceBackendOnRequestAndBadValuesAreErrors) {
  {
    ScopedEnv env("PRIMUS_CPU_BF16", "reference");
    EXPECT_EQ(train::choose_compute(cpu_bf16_args(), 0).backend->name(), "cpu-reference");
  }
  {
    ScopedEnv env("PRIMUS_CPU_BF16", "fastest");
    try {
      train::choose_compute(cpu_bf16_args(), 0);
      FAIL() << "PRIMUS_CPU_BF16=fastest accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("PRIMUS_CPU_BF16"), std::string::npos) << e.what();
    }
  }
}

// The reference backend, picked by the variable, still trains the model (the default bf16 runs
// of test_trainer_bf16 go to the bf16 backend on a CPU that has one).
TEST(CpuBf16Choice, TheReferenceBackendStillTrains) {
  ScopedEnv env("PRIMUS_CPU_BF16", "reference");
  test::TinyExperiment exp;
  auto cfg = exp.load({{"train_iters", "12"}, {"log_interval", "1"}, {"eval_interval", "0"}, {"lr_decay_iters", "12"},
                       {"device", "cpu"}, {"bf16", "true"}});
  const auto s = train::pretrain(cfg);
  EXPECT_LT(s.last_loss, 0.8 * s.first_loss);
}

TEST(CpuBf16Fallback, ACpuWithoutBf16InstructionsTrainsOnTheReferenceBackend) {
  const char* mask = std::getenv("PRIMUS_CPU_MASK");
  if (!mask) GTEST_SKIP() << "runs in the ctest entry with PRIMUS_CPU_MASK=avx512_bf16,amx";
  const cpu::CpuFeatures& f = cpu::cpu_features();
  EXPECT_FALSE(f.avx512_bf16_usable());
  EXPECT_FALSE(f.amx_usable());
  EXPECT_NE(f.summary().find("masked by PRIMUS_CPU_MASK"), std::string::npos) << f.summary();
  std::string why;
  EXPECT_FALSE(cpu::Bf16Backend::supported(&why));
  EXPECT_FALSE(why.empty());
  EXPECT_THROW(cpu::Bf16Backend(), Error);
  EXPECT_EQ(train::choose_compute(cpu_bf16_args(), 0).backend->name(), "cpu-reference");
  // And a run goes through: the next-best path, not a crash.
  test::TinyExperiment exp;
  auto cfg = exp.load({{"train_iters", "6"}, {"log_interval", "1"}, {"eval_interval", "0"}, {"lr_decay_iters", "6"},
                       {"device", "cpu"}, {"bf16", "true"}});
  const auto s = train::pretrain(cfg);
  EXPECT_EQ(s.start_iteration, 0);
}
