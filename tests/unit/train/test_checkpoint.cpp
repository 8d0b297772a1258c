#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <fstream>

#include <zlib.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
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
  std::string ckpt(int it) const { return (fs::path(cfg.checkpoint_dir()) / checkpoint::checkpoint_name(it)).string(); }
};

std::string load_error(const std::string& dir, const ModelSpec& spec) {
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp32);
  try {
    checkpoint::load_checkpoint(dir, m.params());
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

// A resume reads straight into the model's own state, so a load that fails has written part of it:
// the trainer starts again from the initial state. With every checkpoint damaged near its end (the
// values and first moments already read in) and `overwrite`, the run starts over exactly as a
// fresh run does.
TEST(Checkpoint, AFailedLoadLeavesNothingOfItInTheModel) {
  Saved s;
  for (int it : {3, 6}) {
    const fs::path shard = fs::path(s.ckpt(it)) / "rank_00000.bin";
    const auto at = std::streamoff(fs::file_size(shard)) - 1000;
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(at);
    f.write(&c, 1);
  }
  const auto over = train::pretrain(
      s.exp.load({{"train_iters", "6"}, {"save_interval", "0"}, {"eval_interval", "0"}, {"overwrite", "true"}}));
  EXPECT_EQ(over.start_iteration, 0);
  test::TinyExperiment fresh_exp;
  const auto fresh = train::pretrain(
      fresh_exp.load({{"train_iters", "6"}, {"save_interval", "0"}, {"eval_interval", "0"}}));
  EXPECT_EQ(over.first_loss, fresh.first_loss);
  EXPECT_EQ(over.last_loss, fresh.last_loss);
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
    checkpoint::TrainState st{9, 36, 9, 1234, "crash-test"};
    checkpoint::save_checkpoint(s.cfg.checkpoint_dir(), m.params(), moments.data(), moments.data(), st, "x");
    std::_Exit(0);  // not reached
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(s.ckpt(9)));
  EXPECT_EQ(checkpoint::resolve_checkpoint(s.cfg.checkpoint_dir()), s.ckpt(6));
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
  auto list = checkpoint::list_checkpoints(cfg.checkpoint_dir());
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(fs::path(list[0]).filename(), "iter_0000008");
  EXPECT_EQ(fs::path(list[1]).filename(), "iter_0000006");
}

// ---- identity, save order, other runs (issue 21, findings 1 and 2) ---------------------------

namespace {

using test::pretrain_error;
using test::slurp;
using test::spit;

}  // namespace

// Finding 1: a run that starts over (no auto-resume) in a folder holding higher-numbered
// checkpoints used to delete its own new checkpoints at once (pruning kept the highest numbers),
// leaving `latest` naming a missing folder; the next restart then resumed the abandoned run.
TEST(Checkpoint, StartingOverKeepsTheNewSavesAndTheOtherRunsCheckpoints) {
  test::TinyExperiment exp;
  const std::vector<std::pair<std::string, std::string>> base{
      {"save_interval", "1"}, {"lr_warmup_iters", "1"}, {"eval_interval", "0"}, {"log_interval", "1"}};
  auto with = [&](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.end(), base.begin(), base.end());
    return exp.load(more);
  };
  const auto a = with({{"train_iters", "6"}});
  train::pretrain(a);
  const std::string run_a = checkpoint::read_checkpoint_identity(
                                (fs::path(a.checkpoint_dir()) / checkpoint::checkpoint_name(6)).string())
                                .run_id;
  // Iterations 1-3 of a new run: they do not collide with the first run's 4, 5, 6.
  auto b = with({{"train_iters", "3"}, {"auto_resume", "false"}});
  EXPECT_EQ(train::pretrain(b).start_iteration, 0);
  const fs::path dir(a.checkpoint_dir());
  for (int it : {3, 2, 1}) EXPECT_TRUE(fs::exists(dir / checkpoint::checkpoint_name(it))) << it;  // keep 3: all of them
  for (int it : {4, 5, 6}) {
    ASSERT_TRUE(fs::exists(dir / checkpoint::checkpoint_name(it))) << "another run's checkpoint deleted: " << it;
    EXPECT_EQ(checkpoint::read_checkpoint_identity((dir / checkpoint::checkpoint_name(it)).string()).run_id, run_a);
  }
  EXPECT_EQ(checkpoint::resolve_checkpoint(dir.string()), (dir / checkpoint::checkpoint_name(3)).string());
  EXPECT_TRUE(fs::exists(checkpoint::resolve_checkpoint(dir.string())));
  // The next start resumes the new run at 3, not the abandoned one at 6.
  auto again = with({{"train_iters", "3"}});
  EXPECT_EQ(train::pretrain(again).start_iteration, 3);
  // Going on to 4 would replace the first run's iteration 4: refused unless asked.
  EXPECT_NE(pretrain_error(with({{"train_iters", "4"}})).find("--overwrite"), std::string::npos);
  EXPECT_EQ(checkpoint::read_checkpoint_identity((dir / checkpoint::checkpoint_name(4)).string()).run_id, run_a);
}

// Finding 1, the other half: a changed model that auto-resume skips must not overwrite the old
// model's checkpoints of the same numbers, unless asked.
TEST(Checkpoint, AnotherModelsCheckpointsAreNotOverwrittenWithoutOverwrite) {
  test::TinyExperiment exp;
  const auto a = exp.load({{"train_iters", "4"}, {"save_interval", "2"}, {"eval_interval", "0"}, {"lr_warmup_iters", "1"}});
  train::pretrain(a);
  const fs::path ck4 = fs::path(a.checkpoint_dir()) / checkpoint::checkpoint_name(4);
  const std::string before = slurp(ck4 / "rank_00000.bin");
  auto b = exp.load({{"train_iters", "4"}, {"save_interval", "2"}, {"eval_interval", "0"}, {"lr_warmup_iters", "1"}, {"num_layers", "2"}});
  const std::string e = pretrain_error(b);
  // The error names the real reason, and no flag that would replace the old model's checkpoints (issue 32).
  EXPECT_NE(e.find("num_layers is 1 there and 2"), std::string::npos) << e;
  EXPECT_EQ(e.find("--overwrite"), std::string::npos) << e;
  EXPECT_EQ(slurp(ck4 / "rank_00000.bin"), before) << "the old model's checkpoint was replaced";
  auto c = exp.load({{"train_iters", "4"}, {"save_interval", "2"}, {"eval_interval", "0"}, {"lr_warmup_iters", "1"}, {"num_layers", "2"},
                     {"overwrite", "true"}});
  EXPECT_EQ(pretrain_error(c), "(no error)");
  EXPECT_NE(slurp(ck4 / "rank_00000.bin"), before);
}

TEST(Checkpoint, CheckSaveFolderNamesConflictsAndAFileAsSavePath) {
  test::TinyExperiment exp;
  const auto a = exp.load({{"train_iters", "4"}, {"save_interval", "2"}, {"eval_interval", "0"}, {"lr_warmup_iters", "1"}});
  train::pretrain(a);
  const std::string run_a =
      checkpoint::read_checkpoint_identity(checkpoint::resolve_checkpoint(a.checkpoint_dir())).run_id;
  EXPECT_EQ(checkpoint::planned_saves(0, 4, 2), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(checkpoint::planned_saves(3, 7, 2), (std::vector<int64_t>{4, 6, 7}));
  EXPECT_EQ(checkpoint::planned_saves(0, 5, 0), (std::vector<int64_t>{5}));
  EXPECT_NO_THROW(checkpoint::check_save_folder(a.checkpoint_dir(), run_a, {2, 4, 6}, false));
  EXPECT_NO_THROW(checkpoint::check_save_folder(a.checkpoint_dir(), "other", {6, 8}, false));
  try {
    checkpoint::check_save_folder(a.checkpoint_dir(), "other", {2, 4, 6}, false);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("iter_0000002, iter_0000004"), std::string::npos) << m;
    EXPECT_NE(m.find(run_a), std::string::npos) << m;
    EXPECT_NE(m.find("--overwrite"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(checkpoint::check_save_folder(a.checkpoint_dir(), "other", {2, 4}, true));
  const fs::path file = exp.dir / "a_file";
  spit(file, "x");
  try {
    checkpoint::check_save_folder(file.string(), "r", {1}, false);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a file"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, PruningFollowsSaveOrderWithinTheRunOnly) {
  test::TinyExperiment exp;
  LlamaModel m(exp.load().model_spec, cpu::cpu_backend(), Precision::Fp32);
  std::vector<float> moments(m.params().numel(), 0.0f);
  const fs::path dir = exp.dir / "ck";
  auto save = [&](int64_t it, const std::string& run) {
    return checkpoint::save_checkpoint(dir.string(), m.params(), moments.data(), moments.data(), {it, it, it, 1, run},
                                       "x");
  };
  for (int it : {10, 11, 12}) save(it, "old");
  // Run "new" resumed from an early checkpoint (say 3) and saves 4, 5, 6: its newest saves are
  // kept though their numbers are lower, and "old" keeps all of its own.
  std::string last;
  for (int it : {4, 5, 6}) {
    last = save(it, "new");
    checkpoint::prune_checkpoints(dir.string(), 2, "new", last);
  }
  EXPECT_FALSE(fs::exists(dir / checkpoint::checkpoint_name(4)));
  for (int it : {5, 6, 10, 11, 12}) EXPECT_TRUE(fs::exists(dir / checkpoint::checkpoint_name(it))) << it;
  // Newest first: latest, then by save order (the old run's last save is older than all of these).
  const auto list = checkpoint::list_checkpoints(dir.string());
  ASSERT_EQ(list.size(), 5u);
  EXPECT_EQ(fs::path(list[0]).filename(), "iter_0000006");
  EXPECT_EQ(fs::path(list[1]).filename(), "iter_0000005");
  EXPECT_EQ(fs::path(list[2]).filename(), "iter_0000012");
  // A save of the same number by the same run replaces it; by another run it is refused.
  EXPECT_NO_THROW(save(6, "new"));
  EXPECT_THROW(save(12, "new"), Error);
  // keep 1: the one just written is never deleted, even when it is not the newest by number.
  checkpoint::prune_checkpoints(dir.string(), 1, "new", (dir / checkpoint::checkpoint_name(6)).string());
  EXPECT_TRUE(fs::exists(dir / checkpoint::checkpoint_name(6)));
  EXPECT_FALSE(fs::exists(dir / checkpoint::checkpoint_name(5)));
}

// Finding 2: a shard copied from another iteration (same size) loaded silently, and meta.json's
// numbers could be edited without a word.
TEST(Checkpoint, AShardFromAnotherCheckpointIsRefused) {
  Saved s;
  const fs::path from = fs::path(s.ckpt(3)) / "rank_00000.bin", to = fs::path(s.ckpt(6)) / "rank_00000.bin";
  ASSERT_EQ(fs::file_size(from), fs::file_size(to));
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
  const std::string e = load_error(s.ckpt(6), s.cfg.model_spec);
  EXPECT_NE(e.find("rank_00000.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("does not belong"), std::string::npos) << e;
  // Auto-resume falls back to the newest checkpoint that verifies, saying why.
  auto more = s.exp.load({{"train_iters", "7"}, {"save_interval", "0"}, {"eval_interval", "0"}});
  EXPECT_EQ(train::pretrain(more).start_iteration, 3);
}

TEST(Checkpoint, AShardWithTheRightIdentityButOtherBytesIsRefused) {
  // Same run and iteration in the header, other contents (e.g. another rank's data under this
  // name): the CRC-32 the header's checksums describe is not meta.json's.
  Saved s;
  const fs::path shard = fs::path(s.ckpt(6)) / "rank_00000.bin";
  std::string bytes = slurp(shard);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data() + 8, 8);
  std::string header = bytes.substr(24, header_bytes);
  const size_t at = header.find("\"block_crc32\":[") + 15;
  header[at] = header[at] == '1' ? '2' : '1';  // another block checksum, same length
  bytes.replace(24, header_bytes, header);
  const uint32_t crc = uint32_t(crc32(0, reinterpret_cast<const Bytef*>(header.data()), uInt(header.size())));
  std::memcpy(bytes.data() + 16, &crc, 4);
  spit(shard, bytes);
  const std::string e = load_error(s.ckpt(6), s.cfg.model_spec);
  EXPECT_NE(e.find("does not match its meta.json"), std::string::npos) << e;
}

TEST(Checkpoint, AnEditedNumberInMetaJsonIsRefused) {
  Saved s;
  const fs::path meta = fs::path(s.ckpt(6)) / "meta.json";
  const std::string orig = slurp(meta);
  for (const std::string key : {"\"iteration\": 6", "\"consumed_samples\": 24", "\"optimizer_step\": 6"}) {
    const size_t at = orig.find(key);
    ASSERT_NE(at, std::string::npos) << key << " in\n" << orig.substr(0, 400);
    std::string edited = orig;
    edited[at + key.size() - 1] = '5';
    spit(meta, edited);
    const std::string e = load_error(s.ckpt(6), s.cfg.model_spec);
    EXPECT_NE(e.find("meta.json"), std::string::npos) << key << ": " << e;
    EXPECT_NE(e.find("altered or damaged"), std::string::npos) << key << ": " << e;
  }
  spit(meta, orig);
  EXPECT_EQ(load_error(s.ckpt(6), s.cfg.model_spec), "(loaded)");
}

// `generate` reads the weights only: damaged optimizer state does not stop it.
TEST(Checkpoint, WeightsLoadDespiteDamagedOptimizerState) {
  Saved s;
  const fs::path shard = fs::path(s.ckpt(6)) / "rank_00000.bin";
  std::string bytes = slurp(shard);
  bytes[bytes.size() - 8] ^= 0x40;  // in exp_avg_sq
  spit(shard, bytes);
  LlamaModel m(s.cfg.model_spec, cpu::cpu_backend(), Precision::Fp32);
  checkpoint::LoadOptions o;
  o.optimizer = false;
  EXPECT_NO_THROW(checkpoint::load_checkpoint(s.ckpt(6), m.params(), o));
  EXPECT_NE(load_error(s.ckpt(6), s.cfg.model_spec).find("corrupted"), std::string::npos);
}
