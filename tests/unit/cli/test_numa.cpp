// --numa's choice of node (cli/lib/numa.h) on fake /sys trees: each rank on its GPU's node, the
// ranks spread over the nodes without GPUs or where a GPU's node is unknown.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cli/lib/numa.h"
#include "support/temp_dir.h"

using namespace primus::cli;
namespace fs = std::filesystem;

namespace {
void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}
}  // namespace

TEST(Numa, GpusInBusOrderWithTheirNodes) {
  primus::test::TempDir d;
  put(d.path / "bus/pci/drivers/nvidia/0000:c1:00.0/numa_node", "1");
  put(d.path / "bus/pci/drivers/nvidia/0000:41:00.0/numa_node", "0");
  put(d.path / "bus/pci/drivers/nvidia/0000:e1:00.0/numa_node", "-1");
  put(d.path / "bus/pci/drivers/nvidia/module/refcnt", "1");  // not a device
  EXPECT_EQ(gpu_numa_nodes(d.path), (std::vector<int>{0, 1, -1}));
  put(d.path / "devices/system/node/node0/cpulist", "0-7");
  put(d.path / "devices/system/node/node1/cpulist", "8-15");
  put(d.path / "devices/system/node/node2/cpulist", "");  // memory only
  EXPECT_EQ(cpu_numa_nodes(d.path), (std::vector<int>{0, 1}));
}

TEST(Numa, EachRankOnItsGpusNode) {
  const std::vector<int> gpus = {0, 0, 1, 1}, nodes = {0, 1};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(numa_node_for_rank(r, 8, gpus, nodes), r % 4 < 2 ? 0 : 1) << r;
  // A GPU whose node the kernel does not know: that rank falls back to the spread.
  EXPECT_EQ(numa_node_for_rank(3, 4, {0, 0, 1, -1}, nodes), 1);
}

TEST(Numa, WithoutGpusRanksAreSpreadInBlocks) {
  const std::vector<int> nodes = {0, 1};
  EXPECT_EQ(numa_node_for_rank(0, 4, {}, nodes), 0);
  EXPECT_EQ(numa_node_for_rank(1, 4, {}, nodes), 0);
  EXPECT_EQ(numa_node_for_rank(2, 4, {}, nodes), 1);
  EXPECT_EQ(numa_node_for_rank(3, 4, {}, nodes), 1);
  EXPECT_EQ(numa_node_for_rank(2, 3, {}, {0, 1, 2, 3}), 2);
  EXPECT_EQ(numa_node_for_rank(0, 1, {}, {}), -1);
}
