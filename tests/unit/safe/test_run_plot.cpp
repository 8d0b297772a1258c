// Issue 18: `analyze run` pictures: curves read from metrics.jsonl (last row per iteration wins),
// several runs overlaid in one SVG, PNG through rsvg-convert, and the CLI writing both.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "safe/run_plot.h"
#include "support/run_command.h"

namespace fs = std::filesystem;
using namespace primus;
using namespace primus::safe;

namespace {

struct Runs {
  fs::path root = fs::temp_directory_path() / ("primus_plot_" + std::to_string(::getpid()));
  Runs() {
    fs::remove_all(root);
    // Two runs of 40 logged steps; the first was resumed at 20 and logged 17..20 again.
    for (int r = 0; r < 2; ++r) {
      fs::create_directories(root / "ws" / ("run" + std::to_string(r)));
      std::ofstream m(root / "ws" / ("run" + std::to_string(r)) / "metrics.jsonl");
      for (int i = 1; i <= 40; ++i) {
        m << "{\"iteration\":" << i << ",\"lm_loss\":" << 7.0 - 0.05 * i - r * 0.3 << ",\"lr\":" << 1e-3 * i / 40
          << ",\"grad_norm\":" << 1.0 + 0.01 * i << ",\"tokens_per_sec\":" << 5000 + 10 * i << "}\n";
        if (i % 10 == 0) m << "{\"iteration\":" << i << ",\"eval_lm_loss\":" << 7.1 - 0.05 * i << "}\n";
        if (r == 0 && i == 20)
          for (int k = 17; k <= 20; ++k) m << "{\"iteration\":" << k << ",\"lm_loss\":1.5,\"lr\":0.5}\n";
      }
      m << "{\"iteration\": 41, \"lm_lo";  // a row cut short by a crash
    }
  }
  ~Runs() { fs::remove_all(root); }
  fs::path run(int r) const { return root / "ws" / ("run" + std::to_string(r)); }
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

}  // namespace

TEST(RunPlot, ReadsCurvesLastRowWins) {
  Runs runs;
  const RunCurves c = read_run_curves(runs.run(0));
  EXPECT_EQ(c.label, "run0");
  ASSERT_EQ(c.loss.x.size(), 40u);      // one value per iteration
  EXPECT_DOUBLE_EQ(c.loss.y[18], 1.5);  // iteration 19: the resumed run's row
  EXPECT_DOUBLE_EQ(c.loss.y[20], 7.0 - 0.05 * 21);
  ASSERT_EQ(c.eval_loss.x.size(), 4u);
  EXPECT_DOUBLE_EQ(c.eval_loss.x[3], 40);
  EXPECT_EQ(c.tokens_per_sec.y.back(), 5400);
  const fs::path none = runs.root / "empty";
  fs::create_directories(none);
  EXPECT_THROW(read_run_curves(none), Error);
}

TEST(RunPlot, OverlaysRunsInOneSvg) {
  Runs runs;
  std::vector<RunCurves> cs = {read_run_curves(runs.run(0)), read_run_curves(runs.run(1))};
  const std::string svg = render_run_svg(cs);
  EXPECT_EQ(count(svg, "<svg"), 1u);
  for (const char* title : {"lm loss", "learning rate", "grad norm", "throughput (tokens/s)"})
    EXPECT_NE(svg.find(title), std::string::npos) << title;
  // Per run: four curves and the dashed evaluation curve; both runs in the legend.
  EXPECT_EQ(count(svg, "<polyline"), 10u);
  EXPECT_EQ(count(svg, "stroke-dasharray"), 2u);
  EXPECT_NE(svg.find(">run0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">run1</text>"), std::string::npos);
  // Same folder names under different parents are told apart.
  std::vector<RunCurves> same = {cs[0], cs[0]};
  label_runs(same, {runs.run(0), runs.root / "other" / "run0"});
  EXPECT_EQ(same[0].label, "ws/run0");
  EXPECT_EQ(same[1].label, "other/run0");
}

TEST(RunPlot, CliWritesSvgAndPng) {
  Runs runs;
  const fs::path out = runs.root / "both.svg";
  const std::string cmd = std::string("'") + PRIMUS_CLI_PATH + "' direct -- analyze run " + runs.run(0).string() + " " +
                          runs.run(1).string() + " --plot " + out.string() + " 2>&1";
  const auto [code, text] = test::run_command(cmd);
  ASSERT_EQ(code, 0) << text;
  ASSERT_TRUE(fs::exists(out)) << text;
  EXPECT_NE(text.find("curves: " + out.string()), std::string::npos) << text;
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") != 0) GTEST_SKIP() << "no rsvg-convert: SVG only";
  const fs::path png = runs.root / "both.png";
  ASSERT_TRUE(fs::exists(png)) << text;
  std::ifstream f(png, std::ios::binary);
  char sig[8] = {};
  f.read(sig, 8);
  EXPECT_EQ(std::string(sig + 1, 3), "PNG");  // rsvg-convert parsed our SVG and drew it
  EXPECT_GT(fs::file_size(png), 20000u);
}
