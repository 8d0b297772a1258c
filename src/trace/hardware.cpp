#include "trace/hardware.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <thread>

#include <vector>
#include "kernels/backend.h"
#include "kernels/cpu/gemm.h"
#include "trace/profiler.h"

namespace primus::trace {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

// Data sheets (dense, without sparsity): NVIDIA H100 SXM5 and H200 SXM (989.4 TFLOP/s bf16,
// NVLink 4 at 900 GB/s per GPU in both directions together), AMD Instinct MI300X, MI325X
// (1307.4 TFLOP/s bf16, 896 GB/s Infinity Fabric aggregate) and MI355X (2516.6 TFLOP/s bf16,
// 1075 GB/s); dense FP8 twice the bf16 peak on all five (H100/H200 1978.9, MI300X/MI325X 2614.9,
// MI355X 5033.2 TFLOP/s), MX-scaled FP8 at that peak only on the MI355X (CDNA 4; Hopper and CDNA 3
// have no MX scaling in their matrix units). Inter-node: one 400 Gb/s NIC per GPU (ConnectX-7, Pollara 400). The latencies are
// not data-sheet numbers: a collective step's cost assumed for NCCL/RCCL (docs/profiling.md).
const std::vector<Hardware>& named_hardware() {
  static const std::vector<Hardware> hw = {
      {"H100", "NVIDIA H100 SXM5 80GB", 989.4, 80, 3350, 450, 3, 50, 6, 8, "NVIDIA H100 data sheet (SXM5)", false, 1978.9, false},
      {"H200", "NVIDIA H200 SXM 141GB", 989.4, 141, 4800, 450, 3, 50, 6, 8, "NVIDIA H200 data sheet (SXM)", false, 1978.9, false},
      {"MI300X", "AMD Instinct MI300X 192GB", 1307.4, 192, 5300, 448, 3, 50, 6, 8, "AMD Instinct MI300X data sheet", false, 2614.9, false},
      {"MI325X", "AMD Instinct MI325X 256GB", 1307.4, 256, 6000, 448, 3, 50, 6, 8, "AMD Instinct MI325X data sheet", false, 2614.9, false},
      {"MI355X", "AMD Instinct MI355X 288GB", 2516.6, 288, 8000, 537.6, 3, 50, 6, 8, "AMD Instinct MI355X data sheet", false, 5033.2, true},
  };
  return hw;
}

const Hardware* find_hardware(const std::string& name) {
  const std::string n = lower(name);
  for (const Hardware& h : named_hardware())
    if (n == lower(h.name)) return &h;
  // A GPU's own name: "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X".
  for (const Hardware& h : named_hardware())
    if (n.find(lower(h.name)) != std::string::npos) return &h;
  return nullptr;
}

std::vector<std::string> hardware_names() {
  std::vector<std::string> out;
  for (const Hardware& h : named_hardware()) out.push_back(h.name);
  out.push_back("CPU");
  return out;
}

// Plain allocations, not the tensor pool: the pool's peak is what the trainer reports.
double measure_memory_bandwidth_gbs(size_t bytes) {
  std::vector<char> va(bytes), vb(bytes);
  char* a = va.data();
  char* b = vb.data();
  std::memset(a, 1, bytes);
  std::memset(b, 0, bytes);
  double best = 0;
  for (int r = 0; r < 4; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b, a, bytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * double(bytes) / s / 1e9);
  }
  return best;
}

Hardware this_cpu() {
  Hardware h;
  h.name = "CPU";
  h.description = "this machine's CPU";
  h.peak_tflops = cpu::sgemm_peak_gflops() / 1e3;
  h.memory_bandwidth_gbs = measure_memory_bandwidth_gbs();
  h.link_gbs = h.memory_bandwidth_gbs / 2;
  h.link_latency_us = 5;
  h.nic_gbs = h.link_gbs;
  h.nic_latency_us = 5;
  h.gpus_per_node = std::max(1u, std::thread::hardware_concurrency());
  h.source = "measured here: SGEMM peak, memcpy bandwidth";
  h.measured = true;
  return h;
}

void describe_device(RunInfo& info, const ops::Backend& backend) {
  info.device = backend.name();
  info.peak_tflops = backend.peak_tflops();
  if (backend.device() == Device::CPU) {
    info.memory_bandwidth_gbs = measure_memory_bandwidth_gbs();
    info.bandwidth_source = "measured (memcpy)";
  } else if (const Hardware* h = find_hardware(info.device)) {
    info.memory_bandwidth_gbs = h->memory_bandwidth_gbs;
    info.bandwidth_source = h->source;
  }
}

}  // namespace primus::trace
