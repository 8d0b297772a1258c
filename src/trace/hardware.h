// The machines a trace is read against and a projection is made for: the data-sheet numbers of
// named accelerators (dense bf16 peak, memory, links), and this machine's CPU measured on the spot.
// Every number and its source is listed in docs/profiling.md.
#pragma once

#include <string>
#include <vector>

#include "kernels/fp8.h"

namespace primus::ops {
class Backend;
}

namespace primus::trace {

struct RunInfo;

struct Hardware {
  std::string name;          // "H100", "MI300X", "CPU"
  std::string description;   // "NVIDIA H100 SXM5 80GB"
  double peak_tflops = 0;    // dense bf16 matrix peak (the CPU: its measured fp32 SGEMM peak)
  double memory_gb = 0;      // device memory
  double memory_bandwidth_gbs = 0;
  // Links, per GPU and direction, and a collective step's latency. Intra-node: NVLink or Infinity
  // Fabric; inter-node: one NIC per GPU.
  double link_gbs = 0, link_latency_us = 0;
  double nic_gbs = 0, nic_latency_us = 0;
  int gpus_per_node = 8;
  std::string source;        // where the numbers come from
  bool measured = false;     // measured on this machine (the CPU) rather than a data sheet
  // Dense FP8 matrix peak (0: none, FP8 GEMMs run at the bf16 peak, as the CPU's emulation does),
  // and whether the matrix units take MX block scales (E8M0 per 32 values) at that peak.
  double fp8_tflops = 0;
  bool mx_blocks = false;
  // Whether an FP8 GEMM whose operands are scaled so (kernels/fp8.h) runs at the FP8 peak: tensor
  // scales and DeepSeek's 1x128 / 128x128 blocks wherever there is one, MX blocks where the matrix
  // units take them.
  bool runs_fp8(fp8::Granularity g) const { return fp8_tflops > 0 && (g != fp8::Granularity::Mx32 || mx_blocks); }
};

// H100, H200, MI300X, MI325X, MI355X.
const std::vector<Hardware>& named_hardware();
// By name ("mi300x", "H100"), or by a GPU's reported name ("NVIDIA H100 80GB HBM3"); nullptr when
// unknown.
const Hardware* find_hardware(const std::string& name);
std::vector<std::string> hardware_names();  // the named ones and "CPU"

// This machine's CPU: the SGEMM peak the CPU backend measures (kernels/cpu/gemm.h), memory
// bandwidth from a copy, and its shared-memory transport as the link (a message crosses memory
// twice: into the shared segment and out of it).
Hardware this_cpu();
// Memory bandwidth in GB/s from copying `bytes` (read + write counted), best of a few runs.
double measure_memory_bandwidth_gbs(size_t bytes = size_t(64) << 20);

// The device a trace was recorded on, for its roofline: name, dense peak, memory bandwidth (a
// GPU's from its data sheet when it is a named one, the CPU's measured).
void describe_device(RunInfo& info, const ops::Backend& backend);

}  // namespace primus::trace
