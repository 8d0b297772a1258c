// NUMA binding of the ranks (`--numa`, as Primus's runner): each local rank runs on the NUMA node
// of its GPU (the GPU the rank uses: local rank modulo the GPUs, in PCI bus order, as
// CUDA_DEVICE_ORDER=PCI_BUS_ID and ROCm number them), or, without GPUs (or where the kernel does
// not know a GPU's node), the local ranks are spread over the host's NUMA nodes in blocks. The CPUs
// are bound to the node (libnuma's numa_run_on_node) and memory is taken from it first
// (numa_set_preferred: a rank that outgrows its node spills over rather than dying). It happens in
// the rank before the task starts, so OpenMP's and OpenBLAS's threads inherit it.
//
//   --numa / --no-numa, PRIMUS_NUMA=1|0, .primus.yaml `numa: true`; off by default.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace primus::cli {

// The NUMA node of each GPU (PCI devices bound to the nvidia or amdgpu driver, in bus order; -1
// where the kernel does not say), read under `sys` (/sys; a fake tree in tests).
std::vector<int> gpu_numa_nodes(const std::filesystem::path& sys = "/sys");
// The host's NUMA nodes that have CPUs (node ids), under `sys`.
std::vector<int> cpu_numa_nodes(const std::filesystem::path& sys = "/sys");

// The node for `local_rank` of `local_world`: its GPU's when known, else the block spread of the
// local ranks over `nodes`. -1 when there is no node.
int numa_node_for_rank(int local_rank, int local_world, const std::vector<int>& gpu_nodes,
                       const std::vector<int>& nodes);

// Binds this process (a rank) to its node; returns the line it logs ("local rank 1 bound to NUMA
// node 1 (the node of its GPU 0000:41:00.0)"). Throws primus::Error when this build has no libnuma
// or the kernel has no NUMA support.
std::string bind_rank_to_numa_node(int local_rank, int local_world);

// The NUMA nodes whose CPUs this process may run on, e.g. "0" or "0,1" ("?" when unknown).
std::string current_numa_nodes();

}  // namespace primus::cli
