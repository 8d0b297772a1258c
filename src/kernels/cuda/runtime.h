// The CUDA runtime layer every CUDA kernel and the backend share: error checks that raise
// primus::Error, the device and its properties, the compute stream, and a caching device
// allocator (freed blocks are kept by size and handed out again, as PyTorch's allocator does;
// cudaMalloc/cudaFree synchronise the device and cost far more than a training step can spare).
//
// One process drives one GPU (the launcher gives each rank its own device). All work goes on one
// compute stream; communication (NCCL) runs on its own stream and orders itself with events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "core/error.h"
#include "core/memory.h"

namespace primus::cuda {

[[noreturn]] void raise_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

#define PRIMUS_CUDA_CHECK(expr)                                                       \
  do {                                                                                \
    const cudaError_t primus_err_ = (expr);                                           \
    if (primus_err_ != cudaSuccess)                                                   \
      ::primus::cuda::raise_cuda_error(primus_err_, #expr, __FILE__, __LINE__);       \
  } while (0)

// Checks the last kernel launch (bad configuration, too much shared memory) without waiting.
#define PRIMUS_CUDA_CHECK_LAUNCH() PRIMUS_CUDA_CHECK(cudaGetLastError())

// Whether a usable GPU and driver are present. Never throws: without a GPU (or without a driver)
// it is false and unavailable_reason() says why.
bool available();
std::string unavailable_reason();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t total_memory = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;  // the most dynamic shared memory a block may ask for
  // Dense bf16 tensor-core peak from the data sheet (TFLOP/s), the denominator of MFU; 0 when the
  // GPU is not in our table. PRIMUS_PEAK_TFLOPS overrides it.
  double peak_bf16_tflops = 0;
};

// Selects `device` for this process, creates the compute stream and registers Device::CUDA
// tensor storage with core (core/device.h). Idempotent for the same device. Throws when no GPU.
void init(int device = 0);
bool initialized();
const DeviceInfo& device_info();  // of the initialised device
cudaStream_t stream();            // the compute stream
void synchronize();               // waits for the compute stream

// Caching allocator on the initialised device. Blocks are rounded to 512 bytes (small) or 2 MiB
// (large) and reused by rounded size; stream-ordered reuse is safe because every user of a block
// is on the compute stream (or, for NCCL, holds the block until its Work is waited on).
// Out of memory, it frees the cache and retries once, then throws primus::Error with the sizes.
void* device_alloc(size_t bytes);
void device_free(void* ptr, size_t bytes);
MemoryStats device_memory_stats();
void reset_peak_device_memory();
void release_cached_device_memory();

// Temporary device memory for one call (e.g. a kernel's workspace), from the caching allocator.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(bytes), ptr_(bytes ? device_alloc(bytes) : nullptr) {}
  ~Scratch() {
    if (ptr_) device_free(ptr_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }
  template <typename T> T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  void* ptr_;
};

// Copies between host and device on the compute stream. to_host returns once the data is there.
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);

// Times `fn` (which queues work on the compute stream) with CUDA events: the mean milliseconds of
// `iters` runs after `warmup` untimed ones.
template <typename Fn>
double time_ms(Fn&& fn, int warmup, int iters);
double elapsed_ms(cudaEvent_t a, cudaEvent_t b);

template <typename Fn>
double time_ms(Fn&& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t a, b;
  PRIMUS_CUDA_CHECK(cudaEventCreate(&a));
  PRIMUS_CUDA_CHECK(cudaEventCreate(&b));
  PRIMUS_CUDA_CHECK(cudaEventRecord(a, stream()));
  for (int i = 0; i < iters; ++i) fn();
  PRIMUS_CUDA_CHECK(cudaEventRecord(b, stream()));
  const double ms = elapsed_ms(a, b) / (iters > 0 ? iters : 1);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

}  // namespace primus::cuda
