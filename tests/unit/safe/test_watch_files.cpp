// Fault specs, the event log, heartbeats and the rank-side watch (NaN policy), on real files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "safe/events.h"
#include "safe/fault.h"
#include "safe/heartbeat.h"
#include "safe/train_watch.h"
#include "support/error_of.h"

namespace fs = std::filesystem;
using namespace primus;
using namespace primus::safe;

namespace {
struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() /
          ("primus_safe_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
};

using test::error_of;
}  // namespace

TEST(Faults, ParseAndReject) {
  auto k = parse_fault("kill", "rank=1,iteration=7", "PRIMUS_FAULT_KILL");
  EXPECT_EQ(k.rank, 1);
  EXPECT_EQ(k.iteration, 7);
  EXPECT_EQ(k.during, "");
  EXPECT_EQ(parse_fault("kill", "iteration=3,during=checkpoint", "V").during, "checkpoint");
  auto s = parse_fault("slow", "rank=1,ms=150", "PRIMUS_FAULT_SLOW");
  EXPECT_EQ(s.ms, 150);
  EXPECT_EQ(s.iteration, 1);
  EXPECT_NE(error_of([] { parse_fault("kill", "rank=1", "PRIMUS_FAULT_KILL"); }).find("iteration=<n>"), std::string::npos);
  EXPECT_NE(error_of([] { parse_fault("stall", "rank=x,iteration=2", "PRIMUS_FAULT_STALL"); }).find("rank='x'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_fault("nan", "iteration=2,when=now", "PRIMUS_FAULT_NAN"); }).find("unknown key 'when'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_fault("slow", "rank=0", "PRIMUS_FAULT_SLOW"); }).find("ms="), std::string::npos);
}

TEST(Faults, FireOncePerRunFolder) {
  TempDir t;
  EXPECT_TRUE(claim_fault_once(t.dir, "kill"));
  EXPECT_FALSE(claim_fault_once(t.dir, "kill"));
  EXPECT_TRUE(claim_fault_once(t.dir, "stall"));
  EXPECT_TRUE(fs::exists(t.dir / "watch" / "faults" / "kill.fired"));
}

TEST(Events, AppendAndReadBackSkippingBrokenLines) {
  TempDir t;
  auto e = make_event("launcher", "hang", "error", "rank 1 hung");
  e["ranks"] = {1};
  append_event(t.dir, e);
  { std::ofstream(events_path(t.dir), std::ios::app) << "{\"kind\": \"trunc"; }  // a crash mid-write
  { std::ofstream(events_path(t.dir), std::ios::app) << "\n"; }
  append_event(t.dir, make_event("rank", "nan", "warn", "x"));
  int bad = 0;
  auto ev = read_events(t.dir, &bad);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(bad, 1);
  EXPECT_EQ(ev[0]["kind"], "hang");
  EXPECT_EQ(ev[0]["ranks"][0], 1);
  EXPECT_TRUE(ev[0]["time"].get<std::string>().ends_with("Z"));
  EXPECT_EQ(ev[1]["source"], "rank");
}

TEST(Heartbeat, RoundTripIncludingNaN) {
  TempDir t;
  Heartbeat hb;
  hb.rank = 3;
  hb.world_size = 4;
  hb.pid = 1234;
  hb.host = "node7";
  hb.iteration = 42;
  hb.phase = "save";
  hb.step_time = 0.25;
  hb.compute_time = 0.2;
  hb.loss = std::numeric_limits<double>::quiet_NaN();
  hb.grad_norm = 1.5;
  hb.beat = 9;
  write_heartbeat(t.dir, hb);
  auto all = read_heartbeats(t.dir);
  ASSERT_EQ(all.size(), 1u);
  const Heartbeat& r = all.at(3);
  EXPECT_EQ(r.host, "node7");
  EXPECT_EQ(r.iteration, 42);
  EXPECT_EQ(r.phase, "save");
  EXPECT_EQ(r.beat, 9);
  EXPECT_DOUBLE_EQ(r.compute_time, 0.2);
  EXPECT_TRUE(std::isnan(r.loss));
  EXPECT_DOUBLE_EQ(r.grad_norm, 1.5);
  claim_fault_once(t.dir, "kill");
  clear_heartbeats(t.dir);
  EXPECT_TRUE(read_heartbeats(t.dir).empty());
  EXPECT_TRUE(fs::exists(t.dir / "watch" / "faults" / "kill.fired"));  // markers survive a relaunch
}

TEST(TrainWatch, NanPolicySkipThenStopAfterTooMany) {
  TempDir t;
  ::setenv("PRIMUS_NAN_POLICY", "skip", 1);
  ::setenv("PRIMUS_NAN_MAX_SKIPS", "2", 1);
  {
    TrainWatch w(t.dir, 0);
    EXPECT_EQ(w.check(1, 2.0, 1.0), StepAction::Continue);
    EXPECT_EQ(w.check(2, NAN, 1.0), StepAction::Skip);
    EXPECT_EQ(w.check(3, 2.0, INFINITY), StepAction::Skip);
    EXPECT_EQ(w.skipped_iterations(), 2);
    const std::string err = error_of([&] { w.check(4, NAN, NAN); });
    EXPECT_NE(err.find("iteration 4"), std::string::npos) << err;
    EXPECT_NE(err.find("3 non-finite steps in a row"), std::string::npos) << err;
    w.end_step(4, 2.0, 1.0, 0.1);
    auto hb = read_heartbeats(t.dir).at(0);
    EXPECT_EQ(hb.iteration, 4);
    EXPECT_EQ(hb.phase, "step");
  }
  auto ev = read_events(t.dir);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0]["kind"], "nan");
  EXPECT_EQ(ev[0]["iteration"], 2);
  EXPECT_EQ(ev[2]["severity"], "error");
  ::unsetenv("PRIMUS_NAN_MAX_SKIPS");
  ::unsetenv("PRIMUS_NAN_POLICY");
}

TEST(TrainWatch, NanPolicyStopAndWarn) {
  TempDir t;
  ::setenv("PRIMUS_NAN_POLICY", "stop", 1);
  {
    TrainWatch w(t.dir, 0);
    EXPECT_NE(error_of([&] { w.check(5, NAN, 1.0); }).find("NaN policy stop"), std::string::npos);
  }
  ::setenv("PRIMUS_NAN_POLICY", "warn", 1);
  {
    TrainWatch w(t.dir, 0);
    EXPECT_EQ(w.check(6, NAN, 1.0), StepAction::Continue);
  }
  ::setenv("PRIMUS_NAN_POLICY", "sometimes", 1);
  EXPECT_NE(error_of([&] { TrainWatch w(t.dir, 0); }).find("unknown NaN policy 'sometimes'"), std::string::npos);
  ::unsetenv("PRIMUS_NAN_POLICY");
}

TEST(TrainWatch, LossSpikeBecomesAnEvent) {
  TempDir t;
  TrainWatch w(t.dir, 0);
  for (int i = 1; i <= 20; ++i) w.check(i, 3.0 - 0.01 * i, 1.0);
  w.check(21, 8.0, 1.0);
  auto ev = read_events(t.dir);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["kind"], "loss_spike");
  EXPECT_EQ(ev[0]["iteration"], 21);
}

TEST(TrainWatch, InjectedNaNReachesTheGradients) {
  TempDir t;
  ::setenv("PRIMUS_FAULT_NAN", "rank=0,iteration=3", 1);
  {
    TrainWatch w(t.dir, 0);
    std::vector<float> g(10, 1.0f);
    w.inject_faults(2, g.data(), 10);
    for (float v : g) EXPECT_FALSE(std::isnan(v));
    w.inject_faults(3, g.data(), 10);
    EXPECT_TRUE(std::isnan(g[5]));
    std::vector<float> again(10, 1.0f);
    TrainWatch w2(t.dir, 0);  // a restarted run: the fault already fired in this folder
    w2.inject_faults(3, again.data(), 10);
    for (float v : again) EXPECT_FALSE(std::isnan(v));
  }
  ::unsetenv("PRIMUS_FAULT_NAN");
}

TEST(TrainWatch, FailedPhaseWhenLeftByAnException) {
  TempDir t;
  try {
    TrainWatch w(t.dir, 7);
    throw Error("boom");
  } catch (const Error&) {
  }
  EXPECT_EQ(read_heartbeats(t.dir).at(0).phase, "failed");
  {
    TrainWatch w(t.dir, 7);
    w.finish(9);
  }
  EXPECT_EQ(read_heartbeats(t.dir).at(0).phase, "done");
}
