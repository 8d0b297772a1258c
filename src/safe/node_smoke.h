// `preflight node-smoke`: each node checks itself before a large run, and the nodes are judged
// together, as Primus's node smoke tests do before they hand Slurm a list of nodes to exclude:
//
//   compute   a GEMM on each GPU (the CPU when the node has none) whose result is verified, its
//             speed against the device's data-sheet peak (GPUs) and against the other nodes
//   memory    a copy of a large buffer (device memory on GPUs), its bandwidth against the others
//   gpus      health as `preflight check` reads it (nvidia-smi: ECC, retired pages, ...)
//   nics      the network interfaces that are up, InfiniBand / RoCE ports that are not ACTIVE
//   disk      a file written with fsync and read back, its speed against a floor and the others
//   versions  kernel, glibc, MPI, compiler, the GPU driver: a node that differs from the
//             majority fails
//
// measure_node() runs on one rank per node; judge_nodes() is pure, so its rules are unit-tested.
// One PASS or FAIL line per node, and the failed nodes in Slurm's --exclude format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace primus::safe {

struct NodeFigures {
  std::string node;
  std::string device;  // "cpu fp32" or the GPU's name
  int gpus = 0;
  double gemm_gflops = 0;    // the slowest device's
  double gemm_expected = 0;  // data-sheet peak (GFLOP/s) of the device; 0: none (a CPU)
  int64_t gemm_wrong = 0;    // elements of the GEMM results that differ from the exact answer
  double memory_gbs = 0;     // copy bandwidth (read + write bytes / time)
  double disk_write_mbps = 0, disk_read_mbps = 0;
  std::vector<std::string> nics_up;
  std::vector<std::string> problems;  // found by the node itself (GPU health, a port down, I/O errors)
  std::map<std::string, std::string> versions;
};
nlohmann::json to_json(const NodeFigures& f);
NodeFigures node_figures_from_json(const nlohmann::json& j);

struct NodeSmokeOptions {
  std::filesystem::path disk_path = "/tmp";
  int64_t disk_bytes = 64 << 20;
  double min_disk_mbps = 50;       // write or read below this fails
  double min_gemm_fraction = 0.5;  // of the data-sheet peak (GPUs)
  double slow_factor = 0.8;        // a figure below this fraction of the nodes' median fails
  int64_t memory_bytes = 256 << 20;
};

// The GEMM on one device: returns {GFLOP/s, wrong elements}. The caller supplies it (the backend
// of the node's device: the CPU backend, or the CUDA backend on each GPU).
struct GemmProbe {
  std::string device;
  bool gpu = false;
  double expected_gflops = 0;
  std::function<std::pair<double, int64_t>()> run;
  std::function<double(int64_t bytes)> copy_gbs;  // memory bandwidth of the device
};

// This node's figures. PRIMUS_FAULT_SMOKE (tests only) injects a fault: "disk_delay_ms=N" sleeps N
// ms after each 4 MiB written; "version" changes this node's kernel version; the GEMM fault is the
// probe's (see the CLI task).
NodeFigures measure_node(const std::vector<GemmProbe>& devices, const NodeSmokeOptions& o);

// Figures gathered from several ranks of one node (one per GPU) become one per node: the slowest
// device's speed, every wrong element and problem, the disk, NICs and versions of the rank that
// measured them.
std::vector<NodeFigures> merge_by_node(const std::vector<NodeFigures>& parts);

struct NodeVerdict {
  std::string node;
  bool pass = true;
  std::vector<std::string> reasons;  // why it failed, each with its figure
  std::string summary;               // the figures, one line
};
std::vector<NodeVerdict> judge_nodes(const std::vector<NodeFigures>& nodes, const NodeSmokeOptions& o);
// "PASS node01: ..." / "FAIL node02: reason; reason (figures)".
std::string verdict_line(const NodeVerdict& v);
// The failed nodes, comma-separated, for `srun --exclude=...` / `sbatch --exclude=...` ("" when none).
std::string exclude_list(const std::vector<NodeVerdict>& verdicts);

}  // namespace primus::safe
