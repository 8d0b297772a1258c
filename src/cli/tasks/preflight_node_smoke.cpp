// `preflight node-smoke [--exclude-file FILE]`: every node checks itself (safe/node_smoke.h) and
// rank 0 prints one PASS or FAIL line per node and writes the failed ones in Slurm's --exclude
// format. Run one rank per GPU (each checks its own GPU) or one per node:
//
//   primus-cli slurm srun -N 64 --ntasks-per-node 8 -- preflight node-smoke --exclude-file bad_nodes.txt
//   primus-cli slurm sbatch -N 64 --exclude ./bad_nodes.txt -- train pretrain --config c.yaml
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "cli/registry.h"
#include "cli/tasks/bench_common.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_backend.h"
#include "parallel/mpi_process_group.h"
#include "safe/node_smoke.h"
#include "safe/preflight.h"
#ifdef PRIMUS_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/runtime.h"
#endif

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::cli {
namespace preflight_node_smoke_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct Options {
  std::string exclude_file, json_file, device = "auto";
  std::string disk_path;
  double disk_mb = 64;
  safe::NodeSmokeOptions smoke;
};

// PRIMUS_FAULT_SMOKE=gemm (tests only): one element of A is 1 + n/2 instead of 1, so a row of the
// product is wrong (by more than bf16 rounds away), as on a GPU that computes wrong answers.
bool gemm_fault() {
  const char* e = std::getenv("PRIMUS_FAULT_SMOKE");
  return e && std::string(",").append(e).append(",").find(",gemm,") != std::string::npos;
}

double best_seconds(int runs, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// A x B with A and B all ones (see gemm_fault): every element of the product is exactly
// n in fp32 and bf16 (n a power of two), so the check is exact. Returns {GFLOP/s, wrong elements}.
std::pair<double, int64_t> ones_gemm(ops::Backend& b, Device dev, DType t, int64_t n) {
  Tensor a = Tensor::empty({n, n}, DType::F32);
  std::fill(a.data<float>(), a.data<float>() + n * n, 1.0f);
  if (gemm_fault()) a.data<float>()[0] = 1.0f + float(n / 2);
  Tensor a_t = Tensor::empty({n, n}, t), ones = Tensor::empty({n, n}, t);
  for (int64_t i = 0; i < n * n; ++i) {
    if (t == DType::BF16) {
      a_t.data<bf16>()[i] = bf16::from_float(a.data<float>()[i]);
      ones.data<bf16>()[i] = bf16::from_float(1.0f);
    } else {
      a_t.data<float>()[i] = a.data<float>()[i];
      ones.data<float>()[i] = 1.0f;
    }
  }
  const Tensor A = a_t.to(dev), B = ones.to(dev);
  Tensor D = Tensor::empty({n, n}, t, dev);
  auto run = [&] {
    b.gemm(false, false, 1.0f, A, B, 0.0f, Tensor(), D, Tensor());
    b.synchronize();
  };
  run();
  const double s = best_seconds(3, run);
  const Tensor h = D.to(Device::CPU);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n * n; ++i) {
    const float v = t == DType::BF16 ? h.data<bf16>()[i].to_float() : h.data<float>()[i];
    if (v != float(n)) ++wrong;
  }
  return {2.0 * double(n) * double(n) * double(n) / s / 1e9, wrong};
}

// Read + write bytes per second of a device-to-device copy of `bytes`.
double copy_gbs(ops::Backend& b, Device dev, int64_t bytes) {
  const int64_t n = bytes / 4;
  Tensor src = Tensor::zeros({n}, DType::F32, dev), dst = Tensor::zeros({n}, DType::F32, dev);
  auto run = [&] {
    dst.copy_from(src);
    b.synchronize();
  };
  run();
  return 2.0 * double(n * 4) / best_seconds(3, run) / 1e9;
}

std::vector<safe::GemmProbe> probes(const Options& o, const LaunchEnv& where) {
  if (bench::resolve_device(o.device) == bench::BenchDevice::CUDA) {
#ifdef PRIMUS_HAVE_CUDA
    int gpus = 0;
    PRIMUS_CUDA_CHECK(cudaGetDeviceCount(&gpus));
    auto backend = std::make_shared<cuda::CudaBackend>(where.local_rank % std::max(gpus, 1));
    safe::GemmProbe p;
    p.device = cuda::device_info().name;
    p.gpu = true;
    p.expected_gflops = cuda::device_info().peak_bf16_tflops * 1e3;
    p.run = [backend] { return ones_gemm(*backend, Device::CUDA, DType::BF16, 8192); };
    // Four times the host's buffer (1 GiB by default): well past the GPU's caches.
    p.copy_gbs = [backend](int64_t bytes) { return copy_gbs(*backend, Device::CUDA, bytes * 4); };
    return {p};
#endif
  }
  if (where.local_rank != 0) return {};  // the CPU is the node's: one rank measures it
  safe::GemmProbe p;
  p.device = "cpu fp32";
  p.run = [] { return ones_gemm(cpu::cpu_backend(), Device::CPU, DType::F32, 1024); };
  p.copy_gbs = [](int64_t bytes) { return copy_gbs(cpu::cpu_backend(), Device::CPU, bytes); };
  return {p};
}

int run(Options o) {
  if (!o.exclude_file.empty()) safe::check_report_path(o.exclude_file);
  if (!o.json_file.empty()) safe::check_report_path(o.json_file);
  if (o.disk_mb <= 0 || o.smoke.min_disk_mbps < 0 || o.smoke.slow_factor <= 0 || o.smoke.slow_factor > 1)
    fail("--disk-mb must be positive, --min-disk-mbps not negative, --slow-factor in (0, 1]");
  o.smoke.disk_bytes = int64_t(o.disk_mb * (1 << 20));
  if (!o.disk_path.empty()) {
    o.smoke.disk_path = o.disk_path;
  } else {
    const char* ws = std::getenv("PRIMUS_WORKSPACE");
    o.smoke.disk_path = ws && *ws ? ws : "./output";
  }
  const LaunchEnv where = discover_launch_env();
  std::vector<safe::NodeFigures> parts;
  const std::vector<safe::GemmProbe> devices = probes(o, where);
  if (where.local_rank == 0) {
    parts.push_back(safe::measure_node(devices, o.smoke));
  } else if (!devices.empty()) {  // another GPU of the node: its GEMM and memory only
    safe::NodeFigures f;
    f.node = host_name();
    f.device = devices[0].device;
    f.gpus = 1;
    std::tie(f.gemm_gflops, f.gemm_wrong) = devices[0].run();
    f.gemm_expected = devices[0].expected_gflops;
    f.memory_gbs = devices[0].copy_gbs(o.smoke.memory_bytes);
    parts.push_back(f);
  }
  if (where.world_size > 1) {
    parallel::init_mpi();
    json mine = json::array();
    for (const auto& f : parts) mine.push_back(safe::to_json(f));
    parts.clear();
    for (const std::string& text : parallel::all_gather_strings(parallel::mpi_world(), mine.dump()))
      for (const json& j : json::parse(text)) parts.push_back(safe::node_figures_from_json(j));
  }
  if (where.rank != 0) return 0;

  const std::vector<safe::NodeFigures> nodes = safe::merge_by_node(parts);
  const std::vector<safe::NodeVerdict> verdicts = safe::judge_nodes(nodes, o.smoke);
  int failed = 0;
  for (const auto& v : verdicts) {
    std::cout << safe::verdict_line(v) << "\n";
    failed += v.pass ? 0 : 1;
  }
  const std::string exclude = safe::exclude_list(verdicts);
  std::cout << fmt::format("node-smoke: {} of {} node(s) passed{}\n", nodes.size() - size_t(failed), nodes.size(),
                           failed ? "; exclude: " + exclude : "")
            << std::flush;
  if (!o.exclude_file.empty()) {
    std::ofstream f(o.exclude_file);
    f << exclude << (exclude.empty() ? "" : "\n");
    if (!f.flush()) fail("cannot write the exclude file {}", o.exclude_file);
  }
  if (!o.json_file.empty()) {
    json j{{"nodes", json::array()}, {"exclude", exclude}};
    for (size_t i = 0; i < nodes.size(); ++i) {
      json n = safe::to_json(nodes[i]);
      n["pass"] = verdicts[i].pass;
      n["reasons"] = verdicts[i].reasons;
      j["nodes"].push_back(n);
    }
    std::ofstream f(o.json_file);
    f << j.dump(1) << "\n";
    if (!f.flush()) fail("cannot write {}", o.json_file);
  }
  return failed ? 1 : 0;
}

TaskRegistrar reg{
    {"preflight", "node-smoke",
     "each node checks its GPUs (GEMM, memory), NICs, disk and versions; PASS/FAIL per node and an exclude file",
     [](CLI::App& app) -> TaskAction {
       auto o = std::make_shared<Options>();
       app.add_option("--exclude-file", o->exclude_file,
                      "write the failed nodes here, comma-separated, for srun/sbatch --exclude (empty when all pass)");
       app.add_option("--json", o->json_file, "write every node's figures and verdict here");
       app.add_option("--device", o->device, "auto (the GPUs when there are some), cpu or cuda")->capture_default_str();
       app.add_option("--disk-path", o->disk_path, "folder whose disk is tested (default: the workspace)");
       app.add_option("--disk-mb", o->disk_mb, "MiB written and read back")->capture_default_str();
       app.add_option("--min-disk-mbps", o->smoke.min_disk_mbps, "a disk write or read below this fails")
           ->capture_default_str();
       app.add_option("--min-gemm-fraction", o->smoke.min_gemm_fraction,
                      "a GPU's GEMM below this fraction of its data-sheet peak fails")
           ->capture_default_str();
       app.add_option("--slow-factor", o->smoke.slow_factor,
                      "a node below this fraction of the nodes' median (GEMM, memory, disk) fails")
           ->capture_default_str();
       app.footer("Exit code 1 when a node fails.");
       return [o] { return run(*o); };
     }}};

}  // namespace
}  // namespace primus::cli
