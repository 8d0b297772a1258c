// What the `benchmark` tasks share: choosing the device, timing on the CPU, random inputs on the
// GPU, and the FLOP conventions (the PyTorch peers in benchmarks/cuda count the same way).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/launch_env.h"
#include "core/rng.h"

#ifdef PRIMUS_HAVE_CUDA
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/runtime.h"
#endif

namespace primus::cli::bench {

enum class BenchDevice { CPU, CUDA };

// --device auto|cpu|cuda -> the device to run on. auto: the GPU when this build has the CUDA
// backend and a GPU is usable, else the CPU. cuda without one is an error that says why.
inline BenchDevice resolve_device(const std::string& d) {
  if (d == "cpu") return BenchDevice::CPU;
  if (d != "auto" && d != "cuda") fail("--device must be auto, cpu or cuda, got '{}'", d);
#ifdef PRIMUS_HAVE_CUDA
  if (d == "cuda") {
    if (!cuda::available()) fail("--device cuda: {}", cuda::unavailable_reason());
    return BenchDevice::CUDA;
  }
  return cuda::available() ? BenchDevice::CUDA : BenchDevice::CPU;
#else
  if (d == "cuda") fail("--device cuda: this primus-cli was built without the CUDA backend (no nvcc at build time)");
  return BenchDevice::CPU;
#endif
}

// The options every benchmark task takes: where to run, how often, and how to print.
struct RunOptions {
  std::string device = "auto";
  int warmup = 3, iters = 10;
  bool json = false;

  void add_to(CLI::App& app) {
    app.add_option("--device", device, "auto (the GPU when there is one), cpu or cuda")->capture_default_str();
    app.add_option("--warmup", warmup, "untimed runs first")->capture_default_str();
    app.add_option("--iters", iters, "timed runs (the mean is reported)")->capture_default_str();
    app.add_flag("--json", json, "one JSON object on stdout");
  }
  void check() const {
    if (warmup < 0) fail("--warmup must be >= 0, got {}", warmup);
    if (iters < 1) fail("--iters must be at least 1, got {}", iters);
  }
};

#ifdef PRIMUS_HAVE_CUDA
// Initialises the GPU of this rank (LOCAL_RANK modulo the devices visible) and returns its name.
inline std::string init_cuda() {
  int n = 0;
  PRIMUS_CUDA_CHECK(cudaGetDeviceCount(&n));
  cuda::init(discover_launch_env().local_rank % std::max(n, 1));
  return cuda::device_info().name;
}

// Fills `bytes` of device memory with values uniform in [-1, 1) (bf16 or fp32): a random 1 MiB
// block from the host, repeated by doubling device-to-device copies.
inline void fill_device_random(void* dst, size_t bytes, bool is_bf16, uint64_t seed) {
  if (!bytes) return;
  const size_t esize = is_bf16 ? 2 : 4;
  const size_t first = std::min(bytes, size_t(1) << 20);
  const Rng rng(seed);
  std::vector<unsigned char> host(first);
  for (size_t i = 0; i < first / esize; ++i) {
    const float v = float(2.0 * ((rng.at(i) >> 11) * 0x1.0p-53) - 1.0);
    if (is_bf16) {
      const uint16_t b = bf16::from_float(v).bits;
      std::memcpy(host.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(host.data() + 4 * i, &v, 4);
    }
  }
  char* d = static_cast<char*>(dst);
  cuda::copy_to_device(d, host.data(), first);
  for (size_t done = first; done < bytes;) {
    const size_t n = std::min(done, bytes - done);
    PRIMUS_CUDA_CHECK(cudaMemcpyAsync(d + done, d, n, cudaMemcpyDeviceToDevice, cuda::stream()));
    done += n;
  }
}
#endif

// Mean milliseconds of `iters` runs of fn after `warmup` untimed ones (CPU work).
template <typename Fn>
double cpu_time_ms(Fn&& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count() / std::max(iters, 1);
}

// How the report names the CPU: the threads the OpenMP kernels and OpenBLAS use.
inline std::string cpu_name() { return fmt::format("{} threads", omp_get_max_threads()); }

inline double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e9) : 0.0; }

// Attention FLOPs as the benchmarks count them: 4*b*h*s*s*d forward, halved when causal; the
// backward is 2.5x the forward (cuda::attention_forward_flops, whatever the device).
inline double attention_forward_flops(int64_t batch, int64_t seq, int64_t heads, int64_t groups, int64_t head_dim,
                                      bool causal) {
#ifdef PRIMUS_HAVE_CUDA
  cuda::AttentionDims d;
  d.batch = batch, d.seq = seq, d.heads = heads, d.groups = groups, d.head_dim = head_dim;
  return cuda::attention_forward_flops(d, causal);
#else
  (void)groups;
  return 4.0 * double(batch) * double(heads) * double(seq) * double(seq) * double(head_dim) * (causal ? 0.5 : 1.0);
#endif
}
constexpr double kAttentionBackwardFactor = 2.5;

}  // namespace primus::cli::bench
