#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using namespace primus;

namespace {

struct Saved {
  test::TinyExperiment exp;
  config::ExperimentConfig cfg;
  Saved() : cfg(exp.load({{"train_iters", "6"}, {"save_interval", "3"}, {"eval_interval", "0"}})) {
    train::pretrain(cfg);  // checkpoints at 3 and 6
  }
  std::string ckpt(int it) const { return (fs::path(cfg.checkpoint_dir()) / train::checkpoint_name(it)).string(); }
};

std::string load_error(const std::string& dir, const ModelSpec& spec) {
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32);
  try {
    train::load_checkpoint(dir, m.params());
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

}  // namespace

TEST(Checkpoint, FlippedByteIsDetectedAndAutoResumeFallsBack) {
  Saved s;
  {
    // A byte of the data near the end (AdamW's exp_avg_sq), past the shard file's header.
    const fs::path shard = fs::path(s.ckpt(6)) / "rank_00000.bin";
    const auto at = std::streamoff(fs::file_size(shard)) - 1000;
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(at);
    f.write(&c, 1);
  }
  const std::string e = load_error(s.ckpt(6), s.cfg.model_spec);
  EXPECT_NE(e.find("rank_00000.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("corrupted"), std::string::npos) << e;
  // Auto-resume skips the damaged newest checkpoint and continues from iteration 3.
  auto more = s.exp.load({{"train_iters", "7"}, {"save_interval", "0"}, {"eval_interval", "0"}});
  auto r = train::pretrain(more);
  EXPECT_EQ(r.start_iteration, 3);
  // An explicit --load of the damaged one is refused.
  auto explicit_load = s.exp.load({{"train_iters", "8"}, {"load", s.ckpt(6)}, {"eval_interval", "0"}});
  EXPECT_THROW(train::pretrain(explicit_load), Error);
}

TEST(Checkpoint, TruncatedAndMissingFilesAreNamed) {
  Saved s;
  fs::resize_file(fs::path(s.ckpt(6)) / "rank_00000.bin", 100);
  std::string e = load_error(s.ckpt(6), s.cfg.model_spec);
  EXPECT_NE(e.find("rank_00000.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  fs::remove(fs::path(s.ckpt(3)) / "meta.json");
  e = load_error(s.ckpt(3), s.cfg.model_spec);
  EXPECT_NE(e.find("meta.json"), std::string::npos) << e;
  // A model of another shape is refused with the parameter named.
  ModelSpec other = s.cfg.model_spec;
  other.ffn_hidden_size += 8;
  Saved fresh;
  e = load_error(fresh.ckpt(6), other);
  EXPECT_NE(e.find("linear_fc1"), std::string::npos) << e;
}

TEST(Checkpoint, CrashMidWriteLeavesThePreviousOneLoadable) {
  Saved s;
  LlamaModel m(s.cfg.model_spec, cpu::cpu_backend(), Precision::Fp32);
  std::vector<float> moments(m.params().numel(), 0.0f);
  // A child process dies (SIGKILL, as a killed rank would) right after writing its shard file of
  // a new checkpoint; nothing of it may become visible.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("PRIMUS_FAULT_CHECKPOINT_KILL_AFTER", "rank_00000.bin", 1);
    train::TrainState st{9, 36, 9, 1234};
    train::save_checkpoint(s.cfg.checkpoint_dir(), m.params(), moments.data(), moments.data(), st, "x");
    std::_Exit(0);  // not reached
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(s.ckpt(9)));
  EXPECT_EQ(train::resolve_checkpoint(s.cfg.checkpoint_dir()), s.ckpt(6));
  EXPECT_EQ(load_error(s.ckpt(6), s.cfg.model_spec), "(loaded)");
  // The next save cleans the leftover temporary folder away.
  auto cont = s.exp.load({{"train_iters", "7"}, {"eval_interval", "0"}});
  EXPECT_EQ(train::pretrain(cont).start_iteration, 6);
  for (const auto& e : fs::directory_iterator(s.cfg.checkpoint_dir()))
    EXPECT_FALSE(e.path().filename().string().find(".tmp") != std::string::npos) << e.path();
}

TEST(Checkpoint, KeepsTheLastK) {
  test::TinyExperiment exp;
  auto cfg = exp.load({{"train_iters", "8"}, {"save_interval", "2"}, {"keep_last_checkpoints", "2"}, {"eval_interval", "0"}});
  train::pretrain(cfg);
  auto list = train::list_checkpoints(cfg.checkpoint_dir());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(fs::path(list[0]).filename(), "iter_0000008");
  EXPECT_EQ(fs::path(list[1]).filename(), "iter_0000006");
}
