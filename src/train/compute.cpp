#include "train/compute.h"

#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/reference_backend.h"
#include "plan/memory_estimate.h"

#ifdef PRIMUS_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/runtime.h"
#include "parallel/nccl_process_group.h"
#endif

namespace primus::train {

bool cuda_built() {
#ifdef PRIMUS_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_usable() {
#ifdef PRIMUS_HAVE_CUDA
  return cuda::available();
#else
  return false;
#endif
}

uint64_t Compute::memory_available() const {
#ifdef PRIMUS_HAVE_CUDA
  if (device == Device::CUDA) {
    size_t free_bytes = 0, total_bytes = 0;
    PRIMUS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes;
  }
#endif
  return plan::host_available_bytes();
}

std::string Compute::memory_name() const {
  return device == Device::CUDA ? fmt::format("{} free memory", backend->name()) : "host memory (MemAvailable)";
}

std::string Compute::describe() const { return fmt::format("{}, {}", backend->name(), precision_name(precision)); }

Compute choose_compute(const config::TrainingArgs& a, int local_rank) {
  Compute c;
  c.backend = &cpu::cpu_backend();
  const std::string& d = a.device;
  if (d != "auto" && d != "cpu" && d != "cuda") fail("device '{}' is not one of: auto, cpu, cuda", d);
  if (d == "cuda") {
    if (!cuda_built())
      fail("device: cuda, but this primus-cli was built without the CUDA backend (no nvcc at build time)");
    if (!a.bf16) fail("device: cuda trains in bf16 mixed precision: set bf16: true (or device: cpu for fp32)");
  }
  if (!a.bf16) {  // fp32 on the CPU
    if (d == "auto" && cuda_usable())
      log::warn("a GPU is present but bf16 is false: training in fp32 on the CPU (bf16: true trains on the GPU)");
    return c;
  }
  c.precision = Precision::Bf16;
  const bool gpu = d == "cuda" || (d == "auto" && cuda_usable());
#ifdef PRIMUS_HAVE_CUDA
  if (gpu) {
    if (!cuda::available()) fail("device: cuda, but {}", cuda::unavailable_reason());
    int n = 0;
    PRIMUS_CUDA_CHECK(cudaGetDeviceCount(&n));
    c.device = Device::CUDA;
    c.owned = std::make_unique<cuda::CudaBackend>(local_rank % n);
    c.backend = c.owned.get();
    if (!a.gemm_tuning_cache.empty()) {
      const int taken = cuda::load_gemm_cache(a.gemm_tuning_cache);
      log::info("GEMM tuning cache {}: {} entries for this GPU", a.gemm_tuning_cache, taken);
    }
    if (a.gemm_online_tuning) cuda::set_online_tuning(true);
    return c;
  }
#endif
  (void)gpu;
  c.owned = cpu_bf16_backend();
  c.backend = c.owned.get();
  return c;
}

std::unique_ptr<ops::Backend> cpu_bf16_backend() {
  const char* env = std::getenv("PRIMUS_CPU_BF16");
  const std::string want = env ? env : "auto";
  if (want != "auto" && want != "reference")
    fail("PRIMUS_CPU_BF16='{}': expected auto (the fastest bf16 backend this CPU runs) or reference", want);
  if (want == "reference") {
    log::info("PRIMUS_CPU_BF16=reference: bf16 on the CPU reference backend (slow: it checks the bf16 path)");
    return std::make_unique<cpu::ReferenceBackend>();
  }
  std::string why;
  if (!cpu::Bf16Backend::supported(&why)) {
    log::warn("{}: bf16 runs on the CPU reference backend, slowly (bf16: false trains fp32 at full speed)", why);
    return std::make_unique<cpu::ReferenceBackend>();
  }
  const cpu::CpuFeatures& f = cpu::cpu_features();
  if (!f.amx_usable())
    log::info("no AMX on this CPU{}: bf16 on AVX512-BF16 dot products, the next-best path",
              f.amx_tile && f.amx_bf16 ? " (" + f.amx_problem + ")" : std::string());
  return std::make_unique<cpu::Bf16Backend>();
}

std::unique_ptr<parallel::ProcessGroup> device_world(const Compute& compute, parallel::ProcessGroup& host_world) {
  if (compute.device == Device::CPU || host_world.size() == 1) return nullptr;
#ifdef PRIMUS_HAVE_CUDA
  return parallel::NcclProcessGroup::create(host_world, "world");
#else
  fail("GPU tensors across ranks need NCCL, which this build lacks");
#endif
}

}  // namespace primus::train
