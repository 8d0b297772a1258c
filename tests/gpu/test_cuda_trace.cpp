// The trace of a profiled run on the GPU comes from CUDA events (trace/clock_cuda.cpp): each op of
// the op set is timed by events recorded around it on the compute stream, resolved into the host's
// clock at the window's end. On one stream the ops run one after the other, so their intervals
// follow each other in issue order without overlapping, every F / B pass span holds the ops
// recorded inside it, and analyze trace's timeline adds up. Runs on a GPU and, in CI, on the
// emulated GPU (tests/emulated, test_emulated_cuda).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gpu_test_util.h"
#include "trace/analysis.h"
#include "train/trainer.h"

using namespace primus;

TEST(CudaTrace, ATrainingStepIsTimedByCudaEventsOnTheComputeStream) {
  PRIMUS_REQUIRE_GPU();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("primus_gpu_trace_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "exp.yaml") << "exp_name: trace\nworkspace: " << (dir / "ws").string() << R"(
modules:
  pre_trainer:
    model: tiny
    overrides:
      num_layers: 2
      num_attention_heads: 1
      num_query_groups: 1
      micro_batch_size: 2
      global_batch_size: 4
      seq_length: 64
      train_iters: 2
      log_interval: 1
      eval_interval: 0
      save_interval: 0
      mock_data: true
      bf16: true
      device: cuda
      profile: true
      profile_step_start: 1
      profile_step_end: 2
)";
  const auto cfg = config::load_experiment((dir / "exp.yaml").string());
  train::pretrain(cfg);
  const fs::path file = fs::path(cfg.run_dir()) / "trace" / "rank-0.json";
  ASSERT_TRUE(fs::exists(file)) << file;
  nlohmann::json j;
  std::ifstream(file) >> j;
  EXPECT_EQ(j["otherData"]["clock"], "CUDA events");
  const trace::RankTrace t = trace::parse_trace(j, file.string());

  // The compute stream's ops (track 0), in issue order: the file lists them so.
  std::vector<const trace::TraceEvent*> ops;
  for (const trace::TraceEvent& e : t.events)
    if (e.cat == "compute" && e.tid == 0) ops.push_back(&e);
  ASSERT_GT(ops.size(), 30u);
  const double eps = 1.0;  // microseconds: events' elapsed times are floats in milliseconds
  int gemms = 0;
  double gemm_us = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_GE(ops[i]->dur(), 0.0) << ops[i]->op;
    if (i > 0) EXPECT_GE(ops[i]->ts, ops[i - 1]->end - eps) << ops[i - 1]->op << " then " << ops[i]->op;
    if (ops[i]->op == "gemm") ++gemms, gemm_us += ops[i]->dur();
  }
  EXPECT_GT(gemms, 0);
  EXPECT_GT(gemm_us, 0.0) << "GEMM kernels take time on the device";

  // Each forward pass span holds the ops of its microbatch: every op starting inside it ends inside it.
  int spans = 0;
  for (const trace::TraceEvent& s : t.events) {
    if (s.cat != "annotation" || s.op != "F") continue;  // the pass spans, not the layers inside them
    ++spans;
    int inside = 0;
    for (const trace::TraceEvent* o : ops)
      if (o->ts >= s.ts - eps && o->ts < s.end) {
        EXPECT_LE(o->end, s.end + eps) << o->op << " leaves its F span";
        ++inside;
      }
    EXPECT_GT(inside, 10) << "F span of microbatch " << s.microbatch;
  }
  EXPECT_EQ(spans, 2) << "two microbatches in the profiled step";

  // Copies between host and device (the tokens going up, the loss coming back) are memcpy events
  // with their bytes; those between ops are exposed (nothing computes meanwhile on one stream).
  int copies = 0;
  for (const trace::TraceEvent& e : t.events)
    if (e.cat == "memcpy") {
      ++copies;
      EXPECT_EQ(e.op.rfind("memcpy ", 0), 0u) << e.op;
      EXPECT_GT(e.bytes, 0.0) << e.op;
      EXPECT_GE(e.dur(), 0.0) << e.op;
    }
  EXPECT_GT(copies, 0);

  const trace::Timeline tl = trace::timeline_of(t.events);
  EXPECT_GT(tl.total_ms, 0.0);
  EXPECT_GT(tl.total_memcpy_ms, 0.0);
  EXPECT_GT(tl.exposed_memcpy_ms, 0.0);
  EXPECT_LE(tl.exposed_memcpy_ms, tl.total_memcpy_ms + 1e-9);
  EXPECT_NEAR(tl.computation_ms + tl.exposed_comm_ms + tl.exposed_memcpy_ms + tl.idle_ms, tl.total_ms,
              1e-9 * tl.total_ms);
  EXPECT_GT(tl.computation_ms, 0.0);
  fs::remove_all(dir);
}
