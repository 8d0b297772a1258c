// The traces of a profiled 2-rank run on GPUs (run under mpirun, one GPU per rank): collectives
// are timed by CUDA events on their group's communication stream, each starting on the device no
// earlier than the host issued it, and analyze trace matches them across the two ranks.
// tests/emulated runs it on emulated GPUs with the emulated NCCL, one per rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "config/experiment.h"
#include "mpi/gpu_per_rank.h"
#include "parallel/mpi_process_group.h"
#include "trace/analysis.h"
#include "trace/profiler.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace primus {
namespace {

TEST(CudaTraceRanks, DataParallelCollectivesAreTimedOnTheCommunicationStream) {
  PRIMUS_REQUIRE_A_GPU_PER_RANK();
  auto& world = parallel::mpi_world();
  const fs::path dir = gputest::shared_temp_dir("primus_gpu_trace_ranks_");  // one folder for both ranks
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "exp.yaml") << "exp_name: dp\nworkspace: " << (dir / "ws").string() << R"(
modules:
  pre_trainer:
    model: tiny
    overrides:
      num_layers: 2
      hidden_size: 128
      num_attention_heads: 2
      num_query_groups: 2
      ffn_hidden_size: 256
      vocab_size: 512
      micro_batch_size: 2
      global_batch_size: 8
      seq_length: 64
      train_iters: 2
      log_interval: 1
      eval_interval: 0
      save_interval: 0
      mock_data: true
      bf16: true
      device: cuda
      ddp_bucket_size: 20000
      profile: true
      profile_step_start: 1
      profile_step_end: 2
      profile_ranks: [0, 1]
)";
  }
  world.barrier();
  const auto cfg = config::load_experiment((dir / "exp.yaml").string());
  train::pretrain(cfg);
  world.barrier();
  if (world.rank() == 0) {
    const auto traces = trace::load_traces({cfg.run_dir()});
    ASSERT_EQ(traces.size(), 2u);
    for (const trace::RankTrace& t : traces) {
      EXPECT_EQ(t.info["clock"], "CUDA events") << t.file;
      int collectives = 0;
      for (const trace::TraceEvent& e : t.events) {
        if (e.cat != "communication") continue;
        ++collectives;
        EXPECT_GE(e.dur(), 0.0) << e.op;
        EXPECT_NE(e.tid, 0) << e.op << " on the compute row";
      }
      EXPECT_GT(collectives, 0) << t.file;
    }
    // The raw files: each collective's device start is not before the host issued it (1 us for
    // the events' float resolution).
    for (int r = 0; r < 2; ++r) {
      nlohmann::json j;
      std::ifstream(trace::trace_file(cfg.run_dir(), r)) >> j;
      for (const auto& e : j["traceEvents"])
        if (e.value("cat", "") == "communication")
          EXPECT_GE(e["ts"].get<double>(), e["args"]["issue_us"].get<double>() - 1.0) << e.dump();
    }
    const trace::TraceReport rep = trace::analyze(traces);
    bool matched = false;
    for (const trace::CollectiveRow& c : rep.collectives)
      if (c.group == "dp" && c.op == "all_reduce" && c.ranks == 2) matched = true;
    EXPECT_TRUE(matched) << "the gradients' all-reduces matched on both ranks";
    for (const trace::Timeline& tl : rep.per_rank)
      EXPECT_NEAR(tl.computation_ms + tl.exposed_comm_ms + tl.exposed_memcpy_ms + tl.idle_ms, tl.total_ms,
                  1e-9 * tl.total_ms);
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace primus
