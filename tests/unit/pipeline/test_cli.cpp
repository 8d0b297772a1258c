// primus-cli direct -- analyze schedule, end to end: JSON keys and values, SVG, --compare, errors.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/run_command.h"

namespace {

using Result = primus::test::CommandResult;

// stdout only unless `with_stderr` (the runtime may log to stderr); run in a temporary folder
// because the runtime may create a run folder there.
Result cli(const std::string& args, bool with_stderr = false) {
  return primus::test::run_command("cd '" + testing::TempDir() + "' && " + std::string(PRIMUS_CLI_PATH) +
                                   " direct -- analyze schedule " + args + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

}  // namespace

TEST(AnalyzeScheduleCli, Json) {
  Result r = cli("--algorithm 1f1b --pp 4 --microbatches 8 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["algorithm"], "1f1b");
  EXPECT_EQ(j["pp"], 4);
  EXPECT_EQ(j["vpp"], 1);
  EXPECT_EQ(j["microbatches"], 8);
  EXPECT_DOUBLE_EQ(j["makespan"].get<double>(), 33);
  EXPECT_NEAR(j["bubble_rate"].get<double>(), 9.0 / 33, 1e-12);
  ASSERT_EQ(j["per_rank"].size(), 4u);
  EXPECT_DOUBLE_EQ(j["per_rank"][0]["peak_activations"].get<double>(), 4);
  EXPECT_DOUBLE_EQ(j["per_rank"][0]["span"].get<double>(), 33);
  EXPECT_DOUBLE_EQ(j["per_rank"][3]["span"].get<double>(), 24);  // the last rank starts at 3, ends at 27
  ASSERT_EQ(j["ops"].size(), 4u);
  EXPECT_EQ(j["ops"][0].size(), 16u);  // 8 F + 8 BW
  EXPECT_EQ(j["ops"][1][0]["recv"]["peer"], 0);
}

TEST(AnalyzeScheduleCli, SvgTextCompare) {
  Result svg = cli("--algorithm zbv --pp 4 --microbatches 8 --format svg");
  ASSERT_EQ(svg.code, 0) << svg.out;
  EXPECT_EQ(svg.out.rfind("<svg", 0), 0u);
  Result text = cli("--algorithm zb-h1 --pp 4 --microbatches 8");
  ASSERT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("makespan 27"), std::string::npos) << text.out;
  Result cmp = cli("--compare --pp 4 --microbatches 8");
  ASSERT_EQ(cmp.code, 0);
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-auto", "zbv", "v-half", "v-min", "dualpipev"})
    EXPECT_NE(cmp.out.find(name), std::string::npos) << name;
  EXPECT_NE(cmp.out.find("25 overlapped F&B pairs, each max + 0 x min"), std::string::npos) << cmp.out;
}

TEST(AnalyzeScheduleCli, ZbAutoMemoryLimitAndIlp) {
  // Megatron's name for the limit; the text says how the schedule was found.
  Result r = cli("--algorithm zb-auto --pp 4 --microbatches 8 --max-pending-backward 7 --ilp-seconds 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("bubble rate 0.0000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zb-auto: heuristic, memory limit 7 microbatches; ILP refinement off"), std::string::npos)
      << r.out;
  // The paper's 1.5B model at p 8, m 24 (Table 5: ZB-2p 0.0433), M_W / M_B of its Table 1.
  r = cli("--algorithm zb-auto --pp 8 --microbatches 24 --t-forward 18.522 --t-backward 18.086 --t-weight 9.337 "
          "--t-comm 0.601 --memory-limit 16 --activation-after-b 0.3664 --ilp-seconds 0 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NEAR(nlohmann::json::parse(r.out)["bubble_rate"].get<double>(), 0.0433, 5e-5);
}

TEST(AnalyzeScheduleCli, ModelBalance) {
  // tiny_llama's layers with 16 of them and a 32k vocabulary: the output layer weighs about ten.
  const std::string model = testing::TempDir() + "/tiny_32k.yaml";
  std::ofstream(model) << "num_layers: 16\nhidden_size: 256\nffn_hidden_size: 768\nnum_attention_heads: 8\n"
                          "num_query_groups: 4\nvocab_size: 32000\nmax_position_embeddings: 256\n";
  Result r = cli("--algorithm 1f1b --pp 4 --microbatches 8 --model '" + model +
                 "' --seq-length 128 --micro-batch-size 4 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["layers_per_stage"], nlohmann::json::parse("[5, 5, 5, 1]"));
  EXPECT_LT(j["balanced_step"].get<double>(), j["even_split_step"].get<double>());
  EXPECT_NEAR(j["makespan"].get<double>(), j["balanced_step"].get<double>(), 1e-9);
  r = cli("--algorithm 1f1b --pp 4 --microbatches 8 --model '" + model +
          "' --seq-length 128 --micro-batch-size 4 --balance none --gflops 100");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("stage times per microbatch (F+B+W, ms at 100 GFLOP/s)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("layers per stage"), std::string::npos) << "the even split is not listed";
  r = cli("--algorithm 1f1b --pp 4 --microbatches 8 --model '" + model + "' --t-forward 2", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("drop --t-forward"), std::string::npos) << r.out;
  // An experiment config: the trainer's own plan (the same split).
  const std::string config = testing::TempDir() + "/balanced.yaml";
  std::ofstream(config) << "work_group: t\nuser_name: t\nexp_name: balanced\nworkspace: " << testing::TempDir()
                        << "/ws\nmodules:\n  pre_trainer:\n    model: '" << model
                        << "'\n    overrides:\n      micro_batch_size: 4\n      global_batch_size: 32\n"
                           "      seq_length: 128\n      train_iters: 1\n      mock_data: true\n"
                           "      pipeline_model_parallel_size: 4\n      pipeline_balance: auto\n";
  r = cli("--config '" + config + "'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("layers per stage 5,5,5,1"), std::string::npos) << r.out;
  r = cli("--config '" + config + "' --pp 4", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("drop --algorithm, --pp and --microbatches"), std::string::npos) << r.out;
}

TEST(AnalyzeScheduleCli, Errors) {
  Result r = cli("--algorithm zb-h3 --pp 4 --microbatches 8", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("error: unknown pipeline schedule 'zb-h3'"), std::string::npos) << r.out;
  r = cli("--algorithm dualpipev --pp 4 --microbatches 6", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("at least 2p microbatches"), std::string::npos) << r.out;
  r = cli("--algorithm zb-auto --pp 4 --microbatches 8 --memory-limit 0.5", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("too small"), std::string::npos) << r.out;
  r = cli("--algorithm 1f1b --pp 0 --microbatches 8", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("at least 1"), std::string::npos) << r.out;
}
