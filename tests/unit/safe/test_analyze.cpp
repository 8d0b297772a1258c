// Post-mortem analysis on hand-made run folders: each known cause is named from its evidence.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "safe/analyze.h"
#include "safe/events.h"
#include "safe/heartbeat.h"

namespace fs = std::filesystem;
using namespace primus;
using namespace primus::safe;
using nlohmann::json;

namespace {
struct FakeRun {
  fs::path dir;
  FakeRun() {
    dir = fs::temp_directory_path() /
          ("primus_analyze_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir / "logs");
  }
  ~FakeRun() { fs::remove_all(dir); }
  void event(const std::string& source, const std::string& kind, int attempt, json extra = json::object()) {
    json e = make_event(source, kind, "info", kind + " message");
    e["attempt"] = attempt;
    for (auto& [k, v] : extra.items()) e[k] = v;
    append_event(dir, e);
  }
  void log(const std::string& file, const std::string& text) { std::ofstream(dir / "logs" / file, std::ios::app) << text; }
  void beat(int rank, const std::string& host, int64_t it, const std::string& phase) {
    Heartbeat hb;
    hb.rank = rank, hb.host = host, hb.iteration = it, hb.phase = phase, hb.world_size = 2;
    write_heartbeat(dir, hb);
  }
};
}  // namespace

TEST(Analyze, ClassifiesLogLines) {
  EXPECT_EQ(classify_log_line("terminate called after throwing an instance of 'std::bad_alloc'"), "out_of_memory");
  EXPECT_EQ(classify_log_line("torch.cuda.OutOfMemoryError: CUDA out of memory."), "out_of_memory");
  EXPECT_EQ(classify_log_line("[E ProcessGroupNCCL.cpp] Watchdog caught collective operation timeout"), "comm_timeout");
  EXPECT_EQ(classify_log_line("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."), "hardware");
  EXPECT_EQ(classify_log_line("error: iteration 4: lm loss nan / grad norm nan is not finite"), "nan");
  EXPECT_EQ(classify_log_line("iteration 10 | lm loss 2.3"), "");
  EXPECT_EQ(classify_log_line("hexidecimal"), "");
  EXPECT_EQ(classify_log_line("primus watch: restart after out of memory"), "");  // our own lines are not evidence
}

TEST(Analyze, HangWithRestartThenFinished) {
  FakeRun r;
  r.beat(0, "nodeA", 12, "done");
  r.beat(1, "nodeB", 12, "done");
  r.event("launcher", "launch", 1, {{"world_size", 2}});
  r.event("launcher", "hang", 1, {{"ranks", {1}}, {"iteration", 6}});
  r.event("launcher", "stack_dump", 1, {{"ranks", {1}}, {"file", "/x/stacks_attempt1_rank1.txt"}});
  r.event("launcher", "restart", 1, {{"reason", "hang"}, {"ranks", {1}}, {"iteration", 6}, {"detail", "rank 1 hung"}});
  r.event("launcher", "launch", 2);
  r.event("launcher", "job_end", 2, {{"status", "ok"}, {"reason", "finished"}, {"restarts", 1}});
  auto a = analyze_run(r.dir);
  EXPECT_EQ(a.status, "finished");
  EXPECT_EQ(a.attempts, 2);
  EXPECT_EQ(a.restarts, 1);
  ASSERT_EQ(a.stops.size(), 1u);
  EXPECT_EQ(a.stops[0].cause, "hang");
  EXPECT_EQ(a.stops[0].ranks, std::vector<int>{1});
  EXPECT_EQ(a.stops[0].nodes, std::vector<std::string>{"nodeB"});
  EXPECT_NE(a.stops[0].evidence.find("stacks_attempt1_rank1.txt"), std::string::npos);
  EXPECT_NE(a.verdict.find("finished after 1 restart(s); first failure: hang"), std::string::npos) << a.verdict;
  const std::string text = render_text(a);
  EXPECT_NE(text.find("suggestion:"), std::string::npos);
  EXPECT_EQ(to_json(a)["stops"][0]["cause"], "hang");
}

TEST(Analyze, CrashedRankRefinedToOutOfMemoryByTheLog) {
  FakeRun r;
  r.log("stderr.log", "=== primus watch: attempt 1 started 2026 ===\nterminate called after throwing an instance of "
                      "'std::bad_alloc'\n");
  r.event("launcher", "launch", 1);
  r.event("launcher", "job_end", 1,
          {{"status", "failed"}, {"reason", "rank_died"}, {"ranks", {0}}, {"iteration", 3}, {"detail", "rank 0 killed by SIGABRT"}});
  auto a = analyze_run(r.dir);
  EXPECT_EQ(a.status, "failed");
  ASSERT_EQ(a.stops.size(), 1u);
  EXPECT_EQ(a.stops[0].cause, "out_of_memory");
  EXPECT_NE(a.stops[0].evidence.find("std::bad_alloc"), std::string::npos);
  EXPECT_NE(a.verdict.find("out of memory on rank 0 at iteration 3"), std::string::npos) << a.verdict;
}

TEST(Analyze, ErrorExitNamesNaNFromTheMessage) {
  FakeRun r;
  r.event("launcher", "launch", 1);
  r.event("launcher", "job_end", 1,
          {{"status", "failed"}, {"reason", "rank_failed"}, {"ranks", {0}}, {"iteration", 4},
           {"error", "iteration 5: lm loss nan / grad norm nan is not finite; stopping"}});
  auto a = analyze_run(r.dir);
  ASSERT_EQ(a.stops.size(), 1u);
  EXPECT_EQ(a.stops[0].cause, "nan");
}

TEST(Analyze, WithoutEventsFallsBackOnHeartbeatsAndLogs) {
  FakeRun r;
  r.beat(0, "n0", 30, "step");
  r.log("rank-0.log", "[..] [error] NCCL error: unhandled system error, connection reset by peer\n");
  auto a = analyze_run(r.dir);
  EXPECT_EQ(a.status, "failed");
  ASSERT_EQ(a.stops.size(), 1u);
  EXPECT_EQ(a.stops[0].cause, "comm_timeout");
  EXPECT_EQ(a.stops[0].iteration, 30);
}

TEST(Analyze, ThroughputDropAndWarnings) {
  FakeRun r;
  {
    std::ofstream m(r.dir / "metrics.jsonl");
    for (int i = 1; i <= 12; ++i)
      m << json{{"iteration", i}, {"lm_loss", 5.0 - 0.1 * i}, {"tokens_per_sec", i >= 7 && i <= 8 ? 300.0 : 1000.0}}.dump()
        << "\n";
  }
  r.event("launcher", "launch", 1);
  r.event("launcher", "straggler", 1, {{"ranks", {1}}});
  r.event("rank", "loss_spike", 1, {{"iteration", 9}});
  r.event("launcher", "job_end", 1, {{"status", "ok"}, {"reason", "finished"}});
  auto a = analyze_run(r.dir);
  EXPECT_EQ(a.status, "finished");
  EXPECT_EQ(a.last_iteration, 12);
  std::map<std::string, int> causes;
  for (const auto& w : a.warnings) causes[w.cause]++;
  EXPECT_EQ(causes["straggler"], 1);
  EXPECT_EQ(causes["loss_spike"], 1);
  EXPECT_EQ(causes["throughput_drop"], 1);
  for (const auto& w : a.warnings)
    if (w.cause == "throughput_drop") EXPECT_NE(w.detail.find("iterations 7-8"), std::string::npos) << w.detail;
}

TEST(Analyze, RefusesWhatIsNotARun) {
  FakeRun r;
  fs::remove_all(r.dir / "logs");
  auto err = [](const fs::path& p) {
    try {
      analyze_run(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err(r.dir).find("is not a run folder"), std::string::npos);
  EXPECT_NE(err(r.dir / "nope").find("does not exist"), std::string::npos);
  std::ofstream(r.dir / "file.txt") << "x";
  EXPECT_NE(err(r.dir / "file.txt").find("is not a folder"), std::string::npos);
}

// Issue 32: garbage and NaN lines of metrics.jsonl were skipped without a word. They are passed
// over still (the curves and numbers use the good rows), and the analysis says which and why.
TEST(Analyze, MetricsLinesPassedOverAreReported) {
  FakeRun r;
  {
    std::ofstream m(r.dir / "metrics.jsonl");
    m << json{{"iteration", 1}, {"lm_loss", 5.0}}.dump() << "\n"
      << "garbage from another writer\n"
      << json{{"iteration", 2}, {"lm_loss", nullptr}, {"grad_norm", 1.0}}.dump() << "\n"  // a NaN loss, as JSON writes it
      << R"({"iteration": 3, "lm_loss": NaN})" << "\n"                                      // NaN written as text
      << json{{"lm_loss", 4.0}}.dump() << "\n"
      << json{{"iteration", 4}, {"lm_loss", 4.5}}.dump() << "\n"
      << R"({"iteration": 5, "lm_lo)";  // cut short by a crash
  }
  r.event("launcher", "job_end", 1, {{"status", "ok"}, {"reason", "finished"}});
  const auto a = analyze_run(r.dir);
  EXPECT_DOUBLE_EQ(a.first_loss, 5.0);
  EXPECT_DOUBLE_EQ(a.last_loss, 4.5);
  const Finding* skipped = nullptr;
  for (const auto& w : a.warnings)
    if (w.cause == "metrics_skipped") skipped = &w;
  ASSERT_NE(skipped, nullptr) << render_text(a);
  EXPECT_NE(skipped->detail.find("5 of 7 lines: line 2 not JSON; line 3 lm_loss is null (NaN or infinite); line 4 "
                                 "not JSON; line 5 no numeric iteration; line 7 not JSON"),
            std::string::npos)
      << skipped->detail;
  EXPECT_NE(render_text(a).find("metrics lines passed over"), std::string::npos) << render_text(a);
}
