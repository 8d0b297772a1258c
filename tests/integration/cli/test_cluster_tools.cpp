// Cluster tools through primus-cli on real ranks (issue 37): `benchmark collectives` (and its
// Primus name `benchmark rccl`) on 4 MPI ranks with --check, its JSON read back and its bus
// bandwidth recomputed by hand; `preflight node-smoke` on this machine, with and without a fault.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/files.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using nlohmann::json;
using primus::test::run_command;
using primus::test::slurp;

namespace {

std::string cli(const primus::test::TempDir& d, const std::string& runtime_and_task) {
  return "cd " + d.path.string() + " && " + PRIMUS_CLI_PATH + " direct --workspace " + (d.path / "ws").string() + " " +
         runtime_and_task;
}

TEST(BenchmarkCollectives, FourRanksCheckEveryOpAndBusBandwidthByHand) {
  primus::test::TempDir d;
  const auto r = run_command(cli(d, "--nproc 4 -- benchmark collectives --check --min-bytes 1K --max-bytes 64K "
                                    "--step-factor 8 --iters 3 --warmup 1 --format json --output " +
                                        (d.path / "out.json").string() + " 2>/dev/null"));
  ASSERT_EQ(r.code, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["check"], "pass");
  EXPECT_EQ(j["world_size"], 4);
  std::set<std::string> ops;
  int sizes = 0;
  for (const json& x : j["results"]) {
    ops.insert(x["op"].get<std::string>());
    EXPECT_EQ(x["wrong"], 0) << x.dump();
    const double algbw = double(x["bytes"]) / (double(x["time_us"]) * 1e-6) / 1e9;
    EXPECT_NEAR(x["algbw_gbs"].get<double>(), algbw, 1e-9 * algbw) << x.dump();
    if (x["op"] == "all_reduce") {
      ++sizes;
      EXPECT_NEAR(x["busbw_gbs"].get<double>(), algbw * 2 * 3 / 4, 1e-9 * algbw) << x.dump();
    }
  }
  EXPECT_EQ(ops,
            (std::set<std::string>{"all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv"}));
  EXPECT_EQ(sizes, 3);  // 1K, 8K, 64K
  std::ifstream f(d.path / "out.json");
  EXPECT_EQ(json::parse(f), j);
}

TEST(BenchmarkCollectives, RcclAliasOnAPipelineGroupInMarkdown) {
  primus::test::TempDir d;
  const auto r = run_command(cli(d, "--nproc 4 -- benchmark rccl --pp 2 --group pp --ops sendrecv,all_reduce --check "
                                    "--max-bytes 4K --iters 2 --format markdown 2>&1"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("group pp (2 of 4 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| sendrecv | 4096 | 1024 | fp32 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check: every result is correct"), std::string::npos) << r.out;
}

TEST(BenchmarkCollectives, BadOptionsAreNamed) {
  primus::test::TempDir d;
  auto r = run_command(cli(d, "-- benchmark collectives --ops allreduse 2>&1"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("unknown collective 'allreduse'"), std::string::npos) << r.out;
  r = run_command(cli(d, "-- benchmark collectives --group tpp 2>&1"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("did you mean 'tp'"), std::string::npos) << r.out;
}

std::string hostname() {
  char h[256] = {0};
  ::gethostname(h, sizeof h - 1);
  return h;
}

std::string smoke(const primus::test::TempDir& d, const std::string& env) {
  return "cd " + d.path.string() + " && env " + env + " " + PRIMUS_CLI_PATH + " direct --workspace " +
         (d.path / "ws").string() + " -- preflight node-smoke --device cpu --disk-mb 8 --disk-path " +
         (d.path / "disk").string() + " --exclude-file " + (d.path / "exclude.txt").string() + " 2>&1";
}

TEST(NodeSmoke, ThisMachinePassesWithAnEmptyExcludeFile) {
  primus::test::TempDir d;
  const auto r = run_command(smoke(d, "X=1"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("PASS " + hostname() + ": gemm "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("node-smoke: 1 of 1 node(s) passed"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(d.path / "exclude.txt"));
  EXPECT_EQ(slurp(d.path / "exclude.txt"), "");
}

TEST(NodeSmoke, AWrongGemmFailsTheNodeAndExcludesIt) {
  primus::test::TempDir d;
  const auto r = run_command(smoke(d, "PRIMUS_FAULT_SMOKE=gemm"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL " + hostname() + ": GEMM results wrong: 1024 elements on cpu fp32"), std::string::npos)
      << r.out;
  EXPECT_EQ(slurp(d.path / "exclude.txt"), hostname() + "\n");
}

TEST(NodeSmoke, ASlowDiskFailsWithItsFigure) {
  primus::test::TempDir d;
  // 2 blocks of 4 MiB, 1 s after each: about 4 MB/s against the floor of 50.
  const auto r = run_command(smoke(d, "PRIMUS_FAULT_SMOKE=disk_delay_ms=1000"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL " + hostname() + ": slow disk: write "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MB/s is below the floor of 50 MB/s"), std::string::npos) << r.out;
  EXPECT_EQ(slurp(d.path / "exclude.txt"), hostname() + "\n");
}

TEST(Numa, RanksAreBoundAndInfoRanksShowsTheirNode) {
  primus::test::TempDir d;
  const auto r = run_command(cli(d, "--nproc 2 --numa --log-ranks all -- info ranks 2>&1"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* rank : {"rank=0 ", "rank=1 "}) {
    const size_t at = r.out.find(std::string("\n") + rank);
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_NE(r.out.substr(at, r.out.find('\n', at + 1) - at).find(" numa=0"), std::string::npos) << r.out;
  }
  // This machine: one NUMA node, no GPU.
  EXPECT_NE(r.out.find("numa: local rank 1 of 2 bound to NUMA node 0 (spread over the host's 1 node; no GPU)"),
            std::string::npos)
      << r.out;
  const auto both = run_command(cli(d, "--numa --no-numa -- info ranks 2>&1"));
  EXPECT_NE(both.code, 0);
  EXPECT_NE(both.out.find("--numa and --no-numa contradict each other"), std::string::npos) << both.out;
}

}  // namespace
