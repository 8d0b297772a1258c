// `primus-cli direct -- analyze model`: the JSON numbers, the text table, and failures that
// exit non-zero with a message naming the problem.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "support/run_command.h"

namespace {

using Result = primus::test::CommandResult;

Result run(const std::string& args, bool with_stderr = false) {
  return primus::test::run_command(std::string(PRIMUS_CLI_PATH) + " direct -- analyze model " + args +
                                   (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

}  // namespace

TEST(AnalyzeModel, JsonNumbersForLlama2_7B) {
  Result r = run("--model llama2_7B --seq-length 4096 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["parameters"].get<int64_t>(), 6'738'415'616);
  EXPECT_EQ(j["embedding_parameters"].get<int64_t>(), 262'144'000);
  EXPECT_EQ(j["non_embedding_parameters"].get<int64_t>(), 6'476'271'616);
  EXPECT_DOUBLE_EQ(j["flops_per_token"].get<double>(), 42'865'287'168.0);
  EXPECT_EQ(j["seq_length"].get<int64_t>(), 4096);
  // 32 layers x 4 B x (4*4096 + 2 + 12288 + 4096 + 32 + 3*11008) + 4 B x 4097
  EXPECT_DOUBLE_EQ(j["activation_bytes_per_token"].get<double>(),
                   32 * 4.0 * (4 * 4096 + 2 + 12288 + 4096 + 32 + 3 * 11008) + 4.0 * 4097);
  ASSERT_EQ(j["layers"].size(), 32u + 3u);
  EXPECT_EQ(j["layers"][1]["name"], "decoder.layers.0");
  EXPECT_EQ(j["config"]["num_query_groups"].get<int64_t>(), 32);
}

TEST(AnalyzeModel, DefaultSeqLengthIsCappedContext) {
  Result r = run("--model llama3.1_8B --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["seq_length"].get<int64_t>(), 4096);
  EXPECT_EQ(j["parameters"].get<int64_t>(), 8'030'261'248);
  EXPECT_TRUE(j["config"]["use_rope_scaling"].get<bool>());
}

TEST(AnalyzeModel, TextHasPerLayerTable) {
  Result r = run("--model tiny --seq-length 64");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("94,528"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decoder.layers.0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decoder.layers.1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("output_layer"), std::string::npos) << r.out;
}

TEST(AnalyzeModel, BadInputFailsWithMessage) {
  Result r = run("--model llama3_8b", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("error: unknown model preset 'llama3_8b' (did you mean 'llama3_8B'?)"), std::string::npos)
      << r.out;
  r = run("--model tiny --seq-length 4096", true);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("max_position_embeddings"), std::string::npos) << r.out;
  r = run("--model tiny --format yaml", true);
  EXPECT_NE(r.code, 0);
}

TEST(AnalyzeModel, MoeActiveParametersAndFlops) {
  Result r = run("--model mixtral_8x7B_v0.1 --seq-length 4096 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["parameters"].get<int64_t>(), 46'702'792'704);
  EXPECT_EQ(j["active_parameters"].get<int64_t>(), 12'879'925'248);
  EXPECT_EQ(j["active_parameters_without_input_embedding"].get<int64_t>(), 12'879'925'248 - 131'072'000);
  EXPECT_TRUE(j["active_parameters_counts_input_embedding"].get<bool>());
  // 6 per active non-embedding weight (the output layer's logits included) + attention.
  EXPECT_DOUBLE_EQ(j["flops_per_token"].get<double>(),
                   6.0 * double(12'879'925'248 - 131'072'000) + 6.0 * 32 * 4096 * 4096);
  EXPECT_EQ(j["config"]["num_experts"].get<int64_t>(), 8);
  Result t = run("--model deepseek_v3");
  ASSERT_EQ(t.code, 0);
  EXPECT_NE(t.out.find("main model active                 37,552,297,472"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("MTP parameters                    11,610,068,224"), std::string::npos) << t.out;
}
