// Issue 32 through primus-cli, as a new user would meet it: a tokenizer.json nested 50,000 deep
// (it killed `data preprocess` and `train pretrain` with SIGSEGV), a config error under
// `direct --nproc 4` (printed once per rank), `--print-config` under `direct` (printed twice),
// `projection --target-nodes 0` (taken as 1 while -3 was refused).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "support/hostile_files.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

const std::string kCli = PRIMUS_CLI_PATH;
const std::string kRoot = PRIMUS_SOURCE_DIR;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

struct Hostile : ::testing::Test {
  primus::test::TempDir t{"primus_hostile_"};
  primus::test::CommandResult cli(const std::string& args) {
    return primus::test::run_command(
        fmt::format("cd {} && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 {} {} 2>&1",
                    t.path.string(), kCli, args));
  }
  // A tiny mock-data run's config.
  std::string config() {
    return t.write("exp.yaml", R"(exp_name: hostile
modules:
  pre_trainer:
    model: tiny
    overrides:
      micro_batch_size: 1
      global_batch_size: 4
      seq_length: 32
      train_iters: 2
      mock_data: true
      eval_interval: 0
)");
  }
};

}  // namespace

TEST_F(Hostile, ATokenizerNested50000DeepIsAnErrorNotACrash) {
  const std::string deep = primus::test::write_nested_normalizer_tokenizer(t.path / "deep", 50'000);
  t.write("corpus.jsonl", "{\"text\": \"hello world\"}\n");
  auto r = cli("direct -- data preprocess --input corpus.jsonl --json-keys text --tokenizer-type HuggingFaceTokenizer "
               "--tokenizer-model deep --output-prefix corpus");
  EXPECT_EQ(r.code, 1) << r.out;  // SIGSEGV before
  EXPECT_NE(r.out.find("error: tokenizer file 'deep/tokenizer.json' nests objects and arrays more than 64 levels deep"),
            std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("SIGSEGV"), std::string::npos) << r.out;
  r = cli("direct -- train pretrain --config " + config() + " --tokenizer_type HuggingFaceTokenizer --tokenizer_model " +
          deep);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(count(r.out, "more than 64 levels deep"), 1u) << r.out;
}

TEST_F(Hostile, AnErrorOfEveryRankIsPrintedOnceUnderNproc4) {
  // Every rank fails the same way after the launcher's checks (the checkpoint to start from is
  // missing): one line, not four.
  const auto r = cli("direct --nproc 4 -- train pretrain --config " + config() + " --pretrained_checkpoint nowhere");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "error: checkpoint path nowhere does not exist"), 1u) << r.out;
  // The run's stderr.log keeps what every rank said.
  std::ifstream log(t.path / "output/hostile/logs/stderr.log");
  const std::string all((std::istreambuf_iterator<char>(log)), {});
  EXPECT_GE(count(all, "error: checkpoint path nowhere does not exist"), 2u) << all;
}

TEST_F(Hostile, PrintConfigPrintsOnce) {
  const auto r = cli("direct -- train pretrain --config " + config() + " --print-config");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "model_spec:"), 1u) << r.out;
}

TEST_F(Hostile, ProjectionTargetNodesMustBeOneOrMore) {
  for (const char* n : {"0", "-3"}) {
    const auto r = cli(std::string("direct -- projection memory --config ") + config() + " --target-nodes " + n);
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("--target-nodes: must be a whole number of 1 or more, got ") + n),
              std::string::npos) << r.out;
  }
  const auto r = cli("direct -- projection memory --config " + config() + " --target-nodes 2");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("on 2 node(s)"), std::string::npos) << r.out;
}
