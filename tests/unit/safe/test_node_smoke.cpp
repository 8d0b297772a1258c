// preflight node-smoke's verdicts (safe/node_smoke.h) on made-up nodes: wrong GEMM results, a GPU
// below its data-sheet figure, slow outliers named with their figure, a slow disk, a version that
// differs from the other nodes, merging one node's GPUs, and the exclude list.
#include <gtest/gtest.h>

#include "safe/node_smoke.h"

using namespace primus::safe;

namespace {

NodeFigures node(const std::string& name, double gemm = 100, double mem = 50, double disk = 500) {
  NodeFigures f;
  f.node = name;
  f.device = "gpu";
  f.gpus = 1;
  f.gemm_gflops = gemm;
  f.memory_gbs = mem;
  f.disk_write_mbps = f.disk_read_mbps = disk;
  f.nics_up = {"eth0"};
  f.versions = {{"kernel", "6.1"}, {"mpi", "Open MPI v4.1.4"}};
  return f;
}

bool has(const NodeVerdict& v, const std::string& text) {
  for (const auto& r : v.reasons)
    if (r.find(text) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(NodeSmoke, HealthyNodesPass) {
  const auto v = judge_nodes({node("a"), node("b"), node("c")}, {});
  for (const auto& x : v) EXPECT_TRUE(x.pass) << verdict_line(x);
  EXPECT_EQ(exclude_list(v), "");
  EXPECT_EQ(verdict_line(v[0]).rfind("PASS a: gemm 100.0 GFLOP/s (gpu)", 0), 0u) << verdict_line(v[0]);
}

TEST(NodeSmoke, EachRuleNamesTheNodeAndItsFigure) {
  std::vector<NodeFigures> n = {node("a"), node("b", 60), node("c"), node("d", 100, 50, 20), node("e")};
  n[0].gemm_wrong = 3;
  n[2].versions["kernel"] = "6.2";
  n[4].gemm_expected = 400;  // 100 GFLOP/s is 25% of its data sheet
  n[4].problems.push_back("InfiniBand mlx5_0 port 1 is 1: DOWN");
  NodeSmokeOptions o;
  o.min_disk_mbps = 50;
  const auto v = judge_nodes(n, o);
  EXPECT_TRUE(has(v[0], "GEMM results wrong: 3 elements")) << verdict_line(v[0]);
  EXPECT_TRUE(has(v[1], "slow GEMM: 60.0 GFLOP/s against the nodes' median 100.0")) << verdict_line(v[1]);
  EXPECT_TRUE(has(v[2], "kernel '6.2' differs from '6.1' on 4 of 5 nodes")) << verdict_line(v[2]);
  EXPECT_TRUE(has(v[3], "slow disk: write 20.0 MB/s is below the floor of 50 MB/s")) << verdict_line(v[3]);
  EXPECT_TRUE(has(v[3], "slow disk write: 20.0 MB/s against the nodes' median 500.0")) << verdict_line(v[3]);
  EXPECT_TRUE(has(v[4], "below 50% of the device's 400.0")) << verdict_line(v[4]);
  EXPECT_TRUE(has(v[4], "port 1 is 1: DOWN")) << verdict_line(v[4]);
  for (const auto& x : v) EXPECT_FALSE(x.pass) << x.node;
  EXPECT_EQ(exclude_list(v), "a,b,c,d,e");
  EXPECT_EQ(verdict_line(v[1]).rfind("FAIL b: slow GEMM", 0), 0u) << verdict_line(v[1]);
}

TEST(NodeSmoke, TwoNodesThatDisagreeBothFail) {
  std::vector<NodeFigures> n = {node("a"), node("b")};
  n[1].versions["mpi"] = "Open MPI v5.0";
  const auto v = judge_nodes(n, {});
  EXPECT_TRUE(has(v[0], "the nodes disagree")) << verdict_line(v[0]);
  EXPECT_TRUE(has(v[1], "the nodes disagree")) << verdict_line(v[1]);
}

TEST(NodeSmoke, OneNodesGpusMergeIntoItsSlowest) {
  NodeFigures g0 = node("a", 100, 50), g1 = node("a", 70, 40), other = node("b");
  g1.disk_write_mbps = g1.disk_read_mbps = 0;
  g1.versions.clear();
  g1.gemm_wrong = 2;
  const auto m = merge_by_node({g0, g1, other});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].gpus, 2);
  EXPECT_EQ(m[0].gemm_gflops, 70);
  EXPECT_EQ(m[0].memory_gbs, 40);
  EXPECT_EQ(m[0].gemm_wrong, 2);
  EXPECT_EQ(m[0].disk_write_mbps, 500);
  EXPECT_EQ(node_figures_from_json(to_json(m[0])).gemm_gflops, 70);
}
