#include "kernels/cuda/runtime.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include <cuda_runtime.h>

#include "core/device.h"

namespace primus::cuda {

void raise_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  throw Error(fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err), expr,
                          file, line));
}

namespace {

struct RuntimeState {
  std::mutex mu;
  bool initialized = false;
  DeviceInfo info;
  cudaStream_t stream = nullptr;
  std::multimap<size_t, void*> cache;  // rounded size -> free block
  MemoryStats stats;
};
RuntimeState& runtime_state() {
  static RuntimeState s;
  return s;
}

// Data-sheet dense bf16 peaks (TFLOP/s, without sparsity).
double nominal_peak(const cudaDeviceProp& p) {
  const std::string n = p.name;
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("H200")) return 989.4;
  if (has("H100")) return has("PCIe") ? 756.0 : has("NVL") ? 835.0 : 989.4;
  if (has("H800")) return 989.4;
  if (has("GH200")) return 989.4;
  if (has("B200")) return 2250.0;
  if (has("A100")) return 312.0;
  if (has("A800")) return 312.0;
  if (has("L40S")) return 362.0;
  return 0;
}

size_t round_size(size_t bytes) {
  const size_t small = 512, large = size_t(2) << 20;
  if (bytes <= (size_t(1) << 20)) return (bytes + small - 1) / small * small;
  return (bytes + large - 1) / large * large;
}

}  // namespace

bool available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error for later calls
    return false;
  }
  return n > 0;
}

std::string unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("no usable CUDA device: {}", cudaGetErrorString(e));
  }
  return n > 0 ? "" : "no CUDA device found";
}

void* device_alloc(size_t bytes) {
  RuntimeState& s = runtime_state();
  const size_t size = round_size(bytes ? bytes : 1);
  std::lock_guard<std::mutex> lock(s.mu);
  void* p = nullptr;
  if (auto it = s.cache.find(size); it != s.cache.end()) {
    p = it->second;
    s.cache.erase(it);
    s.stats.cached -= size;
  } else {
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation && !s.cache.empty()) {
      cudaGetLastError();
      PRIMUS_CUDA_CHECK(cudaStreamSynchronize(s.stream));
      for (auto& [sz, q] : s.cache) cudaFree(q);
      s.cache.clear();
      s.stats.cached = 0;
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("CUDA out of memory: tried to allocate {:.1f} MiB; tensors hold {:.1f} MiB (peak {:.1f} MiB), the device "
           "has {:.1f} MiB free of {:.1f} MiB. Lower micro_batch_size or seq_length, or set recompute_granularity",
           size / 1048576.0, s.stats.in_use / 1048576.0, s.stats.peak / 1048576.0, free_b / 1048576.0,
           total_b / 1048576.0);
    }
  }
  s.stats.in_use += size;
  if (s.stats.in_use > s.stats.peak) s.stats.peak = s.stats.in_use;
  return p;
}

void device_free(void* ptr, size_t bytes) {
  if (!ptr) return;
  RuntimeState& s = runtime_state();
  const size_t size = round_size(bytes ? bytes : 1);
  std::lock_guard<std::mutex> lock(s.mu);
  s.cache.emplace(size, ptr);
  s.stats.in_use -= size;
  s.stats.cached += size;
}

MemoryStats device_memory_stats() {
  std::lock_guard<std::mutex> lock(runtime_state().mu);
  return runtime_state().stats;
}

void reset_peak_device_memory() {
  std::lock_guard<std::mutex> lock(runtime_state().mu);
  runtime_state().stats.peak = runtime_state().stats.in_use;
}

void release_cached_device_memory() {
  RuntimeState& s = runtime_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.stream) PRIMUS_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  for (auto& [sz, q] : s.cache) cudaFree(q);
  s.cache.clear();
  s.stats.cached = 0;
}

cudaStream_t stream() {
  PRIMUS_CHECK(runtime_state().initialized, "CUDA used before cuda::init()");
  return runtime_state().stream;
}

void synchronize() { PRIMUS_CUDA_CHECK(cudaStreamSynchronize(stream())); }

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  PRIMUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
  // The host buffer may be freed once we return: wait for the copy to have read it.
  synchronize();
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  PRIMUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
  synchronize();
}

double elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  PRIMUS_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  PRIMUS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

namespace {
void hook_copy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  switch (kind) {
    case CopyKind::HostToDevice: copy_to_device(dst, src, bytes); break;
    case CopyKind::DeviceToHost: copy_to_host(dst, src, bytes); break;
    case CopyKind::DeviceToDevice:
      PRIMUS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
      break;
  }
}
void hook_copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  PRIMUS_CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, stream()));
}
void hook_zero(void* ptr, size_t bytes) { PRIMUS_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream())); }
}  // namespace

bool initialized() { return runtime_state().initialized; }

void init(int device) {
  RuntimeState& s = runtime_state();
  if (s.initialized) {
    PRIMUS_CHECK(s.info.index == device, "CUDA already initialised on device {}, asked for {}", s.info.index, device);
    return;
  }
  if (!available()) fail("the CUDA backend needs a GPU: {}", unavailable_reason());
  int n = 0;
  PRIMUS_CUDA_CHECK(cudaGetDeviceCount(&n));
  if (device < 0 || device >= n) fail("CUDA device {} does not exist: this machine has {}", device, n);
  PRIMUS_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp p{};
  PRIMUS_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  s.info.index = device;
  s.info.name = p.name;
  s.info.cc_major = p.major;
  s.info.cc_minor = p.minor;
  s.info.sm_count = p.multiProcessorCount;
  s.info.total_memory = p.totalGlobalMem;
  s.info.l2_bytes = size_t(p.l2CacheSize);
  s.info.smem_per_block_optin = p.sharedMemPerBlockOptin;
  s.info.peak_bf16_tflops = nominal_peak(p);
  if (const char* e = std::getenv("PRIMUS_PEAK_TFLOPS")) s.info.peak_bf16_tflops = std::atof(e);
  if (p.major < 8)
    fail("GPU {} has compute capability {}.{}: the CUDA backend needs bf16 tensor cores (8.0 or newer)", p.name,
         p.major, p.minor);
  PRIMUS_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  s.initialized = true;
  DeviceHooks h;
  h.alloc = device_alloc;
  h.free = device_free;
  h.zero = hook_zero;
  h.copy = hook_copy;
  h.copy_2d = hook_copy_2d;
  h.stats = device_memory_stats;
  register_device_hooks(Device::CUDA, h);
}

const DeviceInfo& device_info() {
  PRIMUS_CHECK(runtime_state().initialized, "CUDA used before cuda::init()");
  return runtime_state().info;
}

}  // namespace primus::cuda
