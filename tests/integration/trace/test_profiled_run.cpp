// A profiled run end to end: `primus-cli direct --nproc 2 -- train pretrain --profile true ...` on
// real mpirun ranks writes one Chrome trace per listed rank under the run folder's trace/, each a
// valid trace (every event complete, in a known category, with its arguments), and `analyze trace`
// reads them back into tables whose parts add up: per rank and on average computation + exposed
// communication + exposed memcpy + idle = total, and the op summary's percentages (by op and by
// category) sum to 100 with a cumulative percentage ending at 100.
#include <gtest/gtest.h>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "support/run_command.h"

namespace fs = std::filesystem;

namespace primus {
namespace {

const char* kConfig = R"(work_group: t
user_name: t
exp_name: run
workspace: ws
modules:
  pre_trainer:
    framework: megatron
    model: tiny
    overrides:
      num_layers: 4
      micro_batch_size: 2
      global_batch_size: 8
      seq_length: 32
      train_iters: 4
      lr: 1.0e-3
      log_interval: 1
      eval_interval: 0
      mock_data: true
      save_interval: 0
)";

using test::CommandResult;

class ProfiledRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("primus_profiled_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(::getpid()));  // other checkouts may run the same test at once
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "exp.yaml") << kConfig;
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  CommandResult sh(const std::string& args) {
    return test::run_command("cd " + dir_.string() +
                             " && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 "
                             "PRIMUS_PEAK_GFLOPS=100 " PRIMUS_CLI_PATH " " + args + " 2>&1");
  }

  // Trains on 2 ranks with steps 2..3 profiled on both ranks, into ws/<name>.
  void train(const std::string& name, const std::string& overrides) {
    const CommandResult r = sh("direct --nproc 2 --exp-name " + name +
                        " -- train pretrain --config exp.yaml --profile true --profile_step_start 1"
                        " --profile_step_end 3 --profile_ranks '[0,1]' " + overrides);
    ASSERT_EQ(r.code, 0) << r.out;
  }

  // The Chrome trace of a rank: JSON with complete events in the project's categories.
  nlohmann::json valid_trace(const std::string& name, int rank) {
    const fs::path file = dir_ / "ws" / name / "trace" / ("rank-" + std::to_string(rank) + ".json");
    EXPECT_TRUE(fs::exists(file)) << file;
    std::ifstream in(file);
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_TRUE(j.contains("traceEvents") && j["traceEvents"].is_array()) << file;
    EXPECT_EQ(j["otherData"]["rank"], rank);
    const std::set<std::string> cats = {"compute", "communication", "memcpy", "host", "annotation"};
    size_t complete = 0;
    for (const auto& e : j["traceEvents"]) {
      EXPECT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name")) << e.dump();
      if (e["ph"] != "X") {
        EXPECT_EQ(e["ph"], "M") << e.dump();  // metadata: process and thread names
        continue;
      }
      EXPECT_TRUE(e.contains("tid")) << e.dump();
      ++complete;
      EXPECT_TRUE(cats.count(e["cat"].get<std::string>())) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0.0) << e.dump();
      EXPECT_TRUE(e["ts"].is_number()) << e.dump();
    }
    EXPECT_GT(complete, 50u) << file;
    return j;
  }

  // Events of a trace with this category and args.op.
  static int count(const nlohmann::json& t, const std::string& cat, const std::string& op) {
    int n = 0;
    for (const auto& e : t["traceEvents"])
      if (e["ph"] == "X" && e["cat"] == cat && e.contains("args") && e["args"].value("op", "") == op) ++n;
    return n;
  }

  // `analyze trace` on the run folder, in JSON; the other formats and the SVG must work too.
  nlohmann::json analyze(const std::string& name) {
    const std::string run = "ws/" + name;
    for (const char* f : {"text", "markdown", "csv"}) {
      const CommandResult r = sh("direct -- analyze trace " + run + " --format " + f);
      EXPECT_EQ(r.code, 0) << f << "\n" << r.out;
      EXPECT_NE(r.out.find("omputation"), std::string::npos) << f << "\n" << r.out;
    }
    const CommandResult svg = sh("direct -- analyze trace " + run + " --svg step.svg --output report.md");
    EXPECT_EQ(svg.code, 0) << svg.out;
    std::ifstream s(dir_ / "step.svg");
    std::string head(4, ' ');
    s.read(head.data(), 4);
    EXPECT_EQ(head, "<svg");
    const CommandResult r = sh("direct -- analyze trace " + run + " --format json --output report.json");
    EXPECT_EQ(r.code, 0) << r.out;
    std::ifstream in(dir_ / "report.json");
    return nlohmann::json::parse(in);
  }

  static void expect_parts_sum_to_total(const nlohmann::json& t) {
    const double total = t["total_ms"].get<double>();
    const double parts = t["computation_ms"].get<double>() + t["exposed_comm_ms"].get<double>() +
                         t["exposed_memcpy_ms"].get<double>() + t["idle_ms"].get<double>();
    EXPECT_GT(total, 0.0) << t.dump();
    EXPECT_NEAR(parts, total, 1e-9 * total) << t.dump();
    for (const char* k : {"computation_ms", "exposed_comm_ms", "exposed_memcpy_ms", "idle_ms"})
      EXPECT_GE(t[k].get<double>(), 0.0) << k << " " << t.dump();
  }

  static void expect_percentages_sum_to_100(const nlohmann::json& rows) {
    ASSERT_FALSE(rows.empty());
    double sum = 0, time = 0;
    for (const auto& o : rows) {
      sum += o["percent"].get<double>();
      time += o["time_ms"].get<double>();
      EXPECT_NEAR(o["cumulative_percent"].get<double>(), sum, 1e-9) << o.dump();
      EXPECT_GT(o["count"].get<int64_t>(), 0) << o.dump();
    }
    EXPECT_NEAR(sum, 100.0, 1e-9);
    EXPECT_NEAR(rows.back()["cumulative_percent"].get<double>(), 100.0, 1e-9);
    EXPECT_GT(time, 0.0);
  }

  void expect_consistent_report(const nlohmann::json& rep) {
    EXPECT_EQ(rep["ranks"], nlohmann::json::array({0, 1}));
    EXPECT_EQ(rep["steps"], 2);
    expect_parts_sum_to_total(rep["timeline"]);
    ASSERT_EQ(rep["per_rank"].size(), 2u);
    for (const auto& t : rep["per_rank"]) expect_parts_sum_to_total(t);
    expect_percentages_sum_to_100(rep["ops"]);
    expect_percentages_sum_to_100(rep["op_categories"]);
    EXPECT_FALSE(rep["gemms"].empty());
  }

  fs::path dir_;
};

// Data parallel: every op of both ranks, the gradients' all-reduces in group dp matched across
// the two ranks.
TEST_F(ProfiledRun, DataParallelTracesAddUp) {
  train("dp", "");
  for (int rank : {0, 1}) {
    const nlohmann::json t = valid_trace("dp", rank);
    EXPECT_GT(count(t, "compute", "gemm"), 0);
    EXPECT_GT(count(t, "communication", "all_reduce"), 0) << "rank " << rank;
  }
  const nlohmann::json rep = analyze("dp");
  expect_consistent_report(rep);
  bool dp_all_reduce = false;
  for (const auto& c : rep["collectives"])
    if (c["op"] == "all_reduce" && c["group"] == "dp" && c["seen_on_ranks"] == 2) dp_all_reduce = true;
  EXPECT_TRUE(dp_all_reduce) << rep["collectives"].dump(1);
  EXPECT_FALSE(rep["straggler"].is_null());
}

// Pipeline parallel (1F1B over 4 microbatches): sends and receives in group pp, F and B spans
// per microbatch, and the pipeline table with the simulator's bubble beside the measured one.
TEST_F(ProfiledRun, PipelineParallelTracesAddUp) {
  train("pp", "--pipeline_model_parallel_size 2 --pipeline_schedule 1f1b");
  for (int rank : {0, 1}) {
    const nlohmann::json t = valid_trace("pp", rank);
    EXPECT_GT(count(t, "compute", "gemm"), 0);
    EXPECT_GT(count(t, "communication", "send") + count(t, "communication", "recv"), 0) << "rank " << rank;
    int f_spans = 0;
    for (const auto& e : t["traceEvents"])
      if (e["ph"] == "X" && e["cat"] == "annotation" && e["args"].value("op", "") == "F") ++f_spans;
    EXPECT_EQ(f_spans, 2 * 4) << "rank " << rank << ": 4 microbatches in each of 2 steps";
  }
  const nlohmann::json rep = analyze("pp");
  expect_consistent_report(rep);
  ASSERT_TRUE(rep.contains("pipeline")) << rep.dump(1);
  EXPECT_EQ(rep["pipeline"]["pp"], 2);
  EXPECT_EQ(rep["pipeline"]["ranks"].size(), 2u);
  const double measured = rep["pipeline"]["measured_bubble"].get<double>();
  EXPECT_GT(measured, 0.0);
  EXPECT_LT(measured, 1.0);
  EXPECT_FALSE(rep["pipeline"]["simulated_bubble"].is_null()) << rep["pipeline"].dump(1);
}

// Context parallel (ring): the attention of each rank's query chunks against key/value blocks,
// their merges and block backwards, and the ring's transfers in group cp.
TEST_F(ProfiledRun, ContextParallelBlocksAreTraced) {
  train("cp", "--context_parallel_size 2");
  for (int rank : {0, 1}) {
    const nlohmann::json t = valid_trace("cp", rank);
    EXPECT_GT(count(t, "compute", "attention_block_forward"), 0) << "rank " << rank;
    EXPECT_GT(count(t, "compute", "attention_merge"), 0) << "rank " << rank;
    EXPECT_GT(count(t, "compute", "attention_block_backward"), 0) << "rank " << rank;
    EXPECT_EQ(count(t, "compute", "attention_forward"), 0) << "rank " << rank << ": cp runs blocks only";
  }
  expect_consistent_report(analyze("cp"));
}

// Profiling off writes no trace; analyze trace names the folder it found nothing in.
TEST_F(ProfiledRun, OffWritesNothingAndAnalyzeSaysSo) {
  const CommandResult r = sh("direct --nproc 2 --exp-name off -- train pretrain --config exp.yaml");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "ws" / "off" / "trace"));
  const CommandResult a = sh("direct -- analyze trace ws/off");
  EXPECT_NE(a.code, 0);
  EXPECT_NE(a.out.find("ws/off"), std::string::npos) << a.out;
}

}  // namespace
}  // namespace primus
