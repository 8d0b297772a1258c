#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "safe/run_lock.h"
#include "support/error_of.h"
#include "support/hostile_files.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using namespace primus;

static std::vector<nlohmann::json> metrics_rows(const config::ExperimentConfig& cfg) {
  std::ifstream in(fs::path(cfg.run_dir()) / "metrics.jsonl");
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json row = nlohmann::json::parse(line);
    if (!row.contains("save_bytes")) rows.push_back(std::move(row));  // not the saves' rows (docs/checkpoints.md)
  }
  return rows;
}

TEST(Trainer, LossFallsWellBelowItsStart) {
  test::TinyExperiment exp;
  auto cfg = exp.load();
  auto s = train::pretrain(cfg);
  EXPECT_EQ(s.iterations, 40);
  EXPECT_NEAR(s.first_loss, std::log(256.0), 0.3);
  EXPECT_LT(s.last_loss, 0.5 * s.first_loss);
  EXPECT_GT(s.last_eval_loss, 0);
  EXPECT_LT(s.last_eval_loss, 0.6 * s.first_loss);
  auto rows = metrics_rows(cfg);
  ASSERT_GE(rows.size(), 8u);
  for (const char* key :
       {"iteration", "consumed_samples", "lm_loss", "lr", "grad_norm", "tokens_per_sec", "tflops", "mfu", "mfu_ceiling"})
    EXPECT_TRUE(rows[0].contains(key)) << key;
  // On the CPU, MFU against the instruction ceiling too (kernels/cpu/ceiling.h).
  EXPECT_GT(rows[0]["mfu_ceiling"].get<double>(), 0.0);
  EXPECT_EQ(rows[0]["iteration"], 5);
  EXPECT_EQ(rows[0]["consumed_samples"], 20);
  bool saw_eval = false;
  for (const auto& r : rows) saw_eval |= r.contains("eval_lm_loss");
  EXPECT_TRUE(saw_eval);
  // The final checkpoint exists and `latest` names it.
  EXPECT_EQ(checkpoint::resolve_checkpoint(cfg.checkpoint_dir()),
            (fs::path(cfg.checkpoint_dir()) / "iter_0000040").string());
}

TEST(Trainer, ResumeContinuesExactlyAsTheUninterruptedRun) {
  test::TinyExperiment exp;
  auto full = exp.load({{"exp_name", "full"}, {"train_iters", "12"}, {"log_interval", "1"}, {"eval_interval", "0"}});
  train::pretrain(full);
  auto part = exp.load({{"exp_name", "part"}, {"train_iters", "5"}, {"log_interval", "1"}, {"eval_interval", "0"},
                        {"lr_decay_iters", "12"}});
  train::pretrain(part);  // saves iter 5 at its end
  auto rest = exp.load({{"exp_name", "part"}, {"train_iters", "12"}, {"log_interval", "1"}, {"eval_interval", "0"}});
  auto s = train::pretrain(rest);  // auto-resumes from iter 5
  EXPECT_EQ(s.start_iteration, 5);
  auto a = metrics_rows(full), b = metrics_rows(rest);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);  // 5 from the first part, 7 after the resume
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(a[i]["iteration"], b[i]["iteration"]);
    // Bit for bit: the same doubles, not merely close ones.
    EXPECT_EQ(a[i]["lm_loss"].get<double>(), b[i]["lm_loss"].get<double>()) << "iteration " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>()) << "iteration " << i + 1;
  }
}

TEST(Trainer, BadInputFailsBeforeTraining) {
  test::TinyExperiment exp;
  auto missing = exp.load({{"data_path", (exp.dir / "nope").string()}});
  try {
    train::pretrain(missing);
    FAIL() << "missing data accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
  auto tok = exp.load({{"tokenizer_type", "SentencePieceTokenizer"}, {"tokenizer_model", (exp.dir / "no.model").string()}});
  try {
    train::pretrain(tok);
    FAIL() << "unreadable tokenizer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no.model"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(fs::path(missing.run_dir()) / "checkpoints"));
}

// Issue 32: two runs sharing one `save` folder (different exp_names, so different run folders and
// run locks) collided only at their first save. The save folder has a lock of its own, taken at
// start: a second run stops before step 1 naming the holder, and runs once the holder is gone.
TEST(Trainer, ASecondRunSharingTheSaveFolderIsRefusedAtStart) {
  test::TinyExperiment exp;
  const fs::path save = exp.dir / "shared_checkpoints";
  safe::RunLock other = safe::RunLock::acquire(save, "the other run's rank 0", safe::kSaveFolder);
  const auto cfg = exp.load({{"exp_name", "second"}, {"save", save.string()}, {"train_iters", "6"}, {"eval_interval", "0"}});
  const std::string e = test::error_of([&] { train::pretrain(cfg); });
  EXPECT_NE(e.find("the save folder " + save.string() + " is in use by another run"), std::string::npos) << e;
  EXPECT_NE(e.find("pid " + std::to_string(::getpid())), std::string::npos) << e;
  EXPECT_NE(e.find("another save folder"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(fs::path(cfg.run_dir()) / "metrics.jsonl"));  // nothing ran
  other = safe::RunLock();  // the other run ends
  EXPECT_EQ(train::pretrain(cfg).iterations, 6);
}

// Issue 32: a tokenizer.json whose normalizer is nested 50,000 deep killed the trainer with SIGSEGV
// while it loaded the tokenizer; now it is an error naming the file.
TEST(Trainer, ATokenizerNested50000DeepIsRefused) {
  test::TinyExperiment exp;
  const std::string deep = test::write_nested_normalizer_tokenizer(exp.dir / "deep", 50'000);
  const auto cfg = exp.load({{"tokenizer_type", "HuggingFaceTokenizer"}, {"tokenizer_model", deep}});
  const std::string e = test::error_of([&] { train::pretrain(cfg); });
  EXPECT_NE(e.find("nests objects and arrays more than 64 levels deep"), std::string::npos) << e;
}


// reset_attention_mask and reset_position_ids (with eod_mask_loss): samples of a corpus of short
// documents, each ending with the tokenizer's eod, are split after every eod (data/microbatch.h)
// and trained with attention inside each document and positions restarting at each. The keys are
// applied: the run trains, and its losses differ from the same run without them. Without a
// tokenizer (no eod known) the keys are refused by name.
TEST(Trainer, ResetKeysTrainDocumentsSplitAtTheEodToken) {
  test::TinyExperiment exp;
  const int32_t eod = 258;  // ByteLevelTokenizer's </s>
  {
    data::IndexedDatasetBuilder b((exp.dir / "eod_corpus").string(), data::TokenDType::u16);
    for (int d = 0; d < 200; ++d) {
      std::vector<int32_t> doc;
      for (int i = 0; i < 5 + d % 9; ++i) doc.push_back(int32_t((d * 5 + i * (1 + d % 4)) % 50));
      doc.push_back(eod);
      b.add_item(doc);
      b.end_document();
    }
    b.finalize();
  }
  const std::vector<std::pair<std::string, std::string>> common = {
      {"data_path", (exp.dir / "eod_corpus").string()}, {"tokenizer_type", "ByteLevelTokenizer"},
      {"vocab_size", "260"}, {"eod_mask_loss", "true"}, {"train_iters", "6"}, {"log_interval", "1"},
      {"eval_interval", "0"}};
  auto with = [&](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.end(), common.begin(), common.end());
    return exp.load(more);
  };
  const auto packed = with({{"exp_name", "packed"}, {"reset_attention_mask", "true"}, {"reset_position_ids", "true"}});
  const auto plain = with({{"exp_name", "plain"}});
  EXPECT_EQ(train::pretrain(packed).iterations, 6);
  train::pretrain(plain);
  const auto a = metrics_rows(packed), b = metrics_rows(plain);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  EXPECT_NE(a[0]["lm_loss"].get<double>(), b[0]["lm_loss"].get<double>());
  for (const auto& r : a) EXPECT_TRUE(std::isfinite(r["lm_loss"].get<double>()));
  const auto no_eod = exp.load({{"exp_name", "no_eod"}, {"reset_attention_mask", "true"}});
  const std::string e = test::error_of([&] { train::pretrain(no_eod); });
  EXPECT_NE(e.find("reset_attention_mask needs tokenizer_type"), std::string::npos) << e;
}
