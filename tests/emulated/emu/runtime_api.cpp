// The CUDA runtime API functions the kernels, src/kernels/cuda/runtime.cpp and the GPU tests call,
// for one emulated H100-like device per process. The test binary links these instead of
// libcudart. Device memory: emu/memory.cpp; streams and events: emu/streams.cpp (copies and
// memsets are ops queued on their stream like kernels). Errors follow the runtime: a refused call
// returns its error and leaves it for cudaGetLastError.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "emu/emulator.h"

namespace emu::detail {
namespace {

struct State {
  std::mutex mu;
  std::map<const void*, size_t> max_dynamic_smem;
  int device = 0;
};
State& st() {
  static State s;
  return s;
}
thread_local cudaError_t t_last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

bool is_device(const void* p, size_t n) { return n == 0 || find_allocation(p, n); }

const char* copy_name(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice: return "cudaMemcpyAsync (host to device)";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyAsync (device to host)";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyAsync (device to device)";
    default: return "cudaMemcpyAsync";
  }
}

// A copy between device buffers, or from host bytes taken when the copy was issued (pageable
// host memory is staged by the runtime: the caller may reuse its buffer at once), or to host
// memory (the caller waits for it).
class CopyOp final : public Op {
 public:
  CopyOp(void* dst, const void* src, size_t n, bool dst_dev, bool src_dev)
      : dst_(dst), src_(src), n_(n), dst_dev_(dst_dev), src_dev_(src_dev) {
    if (!src_dev) staged_.assign(static_cast<const char*>(src), static_cast<const char*>(src) + n);
  }
  Status run() override {
    if (src_dev_) note_access(src_, n_, Access::kRead, 0);
    if (dst_dev_) note_access(dst_, n_, Access::kWrite, 0);
    std::memmove(dst_, src_dev_ ? src_ : staged_.data(), n_);
    return kDone;
  }

 private:
  void* dst_;
  const void* src_;
  size_t n_;
  bool dst_dev_, src_dev_;
  std::vector<char> staged_;
};

// cudaMemcpy2DAsync between device buffers: `rows` rows of `width` bytes.
class Copy2DOp final : public Op {
 public:
  Copy2DOp(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows)
      : dst_(dst), src_(src), dpitch_(dpitch), spitch_(spitch), width_(width), rows_(rows) {}
  Status run() override {
    note_strided(src_, rows_, width_, spitch_, Access::kRead);
    note_strided(dst_, rows_, width_, dpitch_, Access::kWrite);
    for (size_t r = 0; r < rows_; ++r)
      std::memmove(static_cast<char*>(dst_) + r * dpitch_, static_cast<const char*>(src_) + r * spitch_, width_);
    return kDone;
  }

 private:
  void* dst_;
  const void* src_;
  size_t dpitch_, spitch_, width_, rows_;
};

class MemsetOp final : public Op {
 public:
  MemsetOp(void* p, int value, size_t n) : p_(p), value_(value), n_(n) {}
  Status run() override {
    note_access(p_, n_, Access::kWrite, 0);
    std::memset(p_, value_, n_);
    return kDone;
  }

 private:
  void* p_;
  int value_;
  size_t n_;
};

}  // namespace

void set_last_error(cudaError_t e) { t_last_error = e; }

size_t max_dynamic_smem(const void* kernel) {
  std::lock_guard<std::mutex> lock(st().mu);
  const auto it = st().max_dynamic_smem.find(kernel);
  return it == st().max_dynamic_smem.end() ? kDefaultSmemPerBlock : it->second;
}

void set_max_dynamic_smem(const void* kernel, size_t bytes) {
  std::lock_guard<std::mutex> lock(st().mu);
  st().max_dynamic_smem[kernel] = bytes;
}

}  // namespace emu::detail

using namespace emu::detail;

extern "C" {

// ---- errors ----

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    default: return "unknown error (emulated runtime)";
  }
}

// ---- the device ----

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice);
  st().device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = st().device;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}

// An H100 SXM (compute capability 9.0), as the kernels are tuned for.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "NVIDIA H100 80GB HBM3 (emulated on the CPU)");
  p->totalGlobalMem = kTotalMemory;
  p->sharedMemPerBlock = kDefaultSmemPerBlock;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->memPitch = size_t(1) << 31;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->totalConstMem = 65536;
  p->major = 9;
  p->minor = 0;
  p->textureAlignment = 512;
  p->texturePitchAlignment = 32;
  p->multiProcessorCount = 132;
  p->canMapHostMemory = 1;
  p->concurrentKernels = 1;
  p->asyncEngineCount = 3;
  p->unifiedAddressing = 1;
  p->memoryBusWidth = 5120;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->persistingL2CacheMaxSize = 30 * 1024 * 1024;
  p->maxThreadsPerMultiProcessor = 2048;
  p->streamPrioritiesSupported = 1;
  p->globalL1CacheSupported = 1;
  p->localL1CacheSupported = 1;
  p->sharedMemPerMultiprocessor = kSmemPerSm;
  p->regsPerMultiprocessor = 65536;
  p->managedMemory = 1;
  p->computePreemptionSupported = 1;
  p->cooperativeLaunch = 1;
  p->sharedMemPerBlockOptin = kMaxSmemPerBlockOptin;
  p->maxBlocksPerMultiProcessor = 32;
  p->accessPolicyMaxWindowSize = 134213632;
  p->reservedSharedMemPerBlock = 1024;
  p->memoryPoolsSupported = 1;
  p->clusterLaunch = 1;
  return cudaSuccess;
}

// ---- memory ----

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = device_alloc(size);
  if (!p) return fail(cudaErrorMemoryAllocation);
  *ptr = p;
  return cudaSuccess;
}

// As on a GPU, cudaFree waits for the device: nothing queued may still use the memory.
cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  if (!find_allocation(ptr, 1)) return fail(cudaErrorInvalidDevicePointer);
  cudaDeviceSynchronize();
  return device_free(ptr) ? cudaSuccess : fail(cudaErrorInvalidDevicePointer);
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  const size_t used = device_allocated();
  if (free_bytes) *free_bytes = kTotalMemory - used;
  if (total) *total = kTotalMemory;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  if (!attr) return fail(cudaErrorInvalidValue);
  std::memset(attr, 0, sizeof *attr);
  if (find_allocation(ptr, 1)) {
    attr->type = cudaMemoryTypeDevice;
    attr->device = 0;
    attr->devicePointer = const_cast<void*>(ptr);
  } else {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

// Copies from pageable host memory read the source now (the runtime stages it); copies to
// pageable host memory return once done (every host buffer here is pageable).
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  bool dst_dev = false, src_dev = false;
  switch (kind) {
    case cudaMemcpyHostToDevice: dst_dev = true; break;
    case cudaMemcpyDeviceToHost: src_dev = true; break;
    case cudaMemcpyDeviceToDevice: dst_dev = src_dev = true; break;
    case cudaMemcpyHostToHost: break;
    case cudaMemcpyDefault:  // unified addressing: the pointers say
      dst_dev = find_allocation(dst, 1);
      src_dev = find_allocation(src, 1);
      break;
    default: return fail(cudaErrorInvalidMemcpyDirection);
  }
  if ((dst_dev && !is_device(dst, count)) || (src_dev && !is_device(src, count)))
    return fail(cudaErrorInvalidValue);  // a device range outside every allocation
  auto op = std::make_unique<CopyOp>(dst, src, count, dst_dev, src_dev);
  if (dst_dev)
    enqueue(stream, std::move(op), OpLabel{copy_name(kind)});
  else
    run_and_wait(stream, std::move(op), OpLabel{copy_name(kind)});
  return cudaSuccess;
}

// On the legacy default stream. As the runtime documents ("API synchronization behavior"), only
// a copy to pageable host memory makes the host wait for it; one from pageable host memory
// returns once the source is staged, one between device buffers at once.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, count, kind, nullptr);
}

// Device to device only (what the runtime layer uses it for).
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (width == 0 || height == 0) return cudaSuccess;
  if (kind != cudaMemcpyDeviceToDevice) return fail(cudaErrorInvalidMemcpyDirection);
  if (!dst || !src || width > dpitch || width > spitch) return fail(cudaErrorInvalidPitchValue);
  if (!is_device(dst, (height - 1) * dpitch + width) || !is_device(src, (height - 1) * spitch + width))
    return fail(cudaErrorInvalidValue);
  enqueue(stream, std::make_unique<Copy2DOp>(dst, dpitch, src, spitch, width, height),
          OpLabel{"cudaMemcpy2DAsync (device to device)"});
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!is_device(ptr, count)) return fail(cudaErrorInvalidValue);
  enqueue(stream, std::make_unique<MemsetOp>(ptr, value, count), OpLabel{"cudaMemsetAsync"});
  return cudaSuccess;
}
// Asynchronous for device memory, as documented.
cudaError_t cudaMemset(void* ptr, int value, size_t count) { return cudaMemsetAsync(ptr, value, count, nullptr); }

// ---- kernels ----

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return fail(cudaErrorInvalidDeviceFunction);
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || size_t(value) > kMaxSmemPerBlockOptin) return fail(cudaErrorInvalidValue);
      set_max_dynamic_smem(func, size_t(value));
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      return value >= -1 && value <= 100 ? cudaSuccess : fail(cudaErrorInvalidValue);
    default: return cudaSuccess;
  }
}

}  // extern "C"
