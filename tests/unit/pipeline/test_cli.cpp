// primus-cli direct -- analyze schedule, end to end: JSON keys and values, SVG, --compare, errors.
#include <gtest/gtest.h>

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
