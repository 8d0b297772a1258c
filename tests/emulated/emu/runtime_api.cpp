// The CUDA runtime API functions the kernels, src/kernels/cuda/runtime.cpp and the GPU tests call,
// for one emulated H100-like device. The test binary links these instead of libcudart.
//
// Device memory is host memory: every cudaMalloc block is its own mapping, 256-byte aligned and
// placed so that it ends right before a guard page (an access past the end of a block whose size
// is a multiple of 256 faults, and the fault handler names the block). Work on streams runs
// synchronously when it is issued, so streams and events only have to keep their order, which
// they do trivially; event times are host wall-clock times. Errors follow the runtime: a
// refused call returns its error and leaves it for cudaGetLastError.
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "emu/emulator.h"

namespace emu::detail {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kTotalMemory = size_t(80) << 30;  // H100 SXM: 80 GB

struct Allocation {
  char* map = nullptr;  // the mapping (data + guard page)
  size_t map_bytes = 0;
  size_t size = 0;
};

struct Event {
  bool recorded = false;
  std::chrono::steady_clock::time_point t;
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, Allocation> allocs;  // by start address
  size_t allocated = 0;
  std::set<cudaStream_t> streams;
  std::set<cudaEvent_t> events;
  std::map<const void*, size_t> max_dynamic_smem;
  int device = 0;
  std::atomic<uint64_t> frees{0};  // invalidates the threads' lookup caches
};
State& st() {
  static State s;
  return s;
}
thread_local cudaError_t t_last_error = cudaSuccess;
// find_allocation's last hit on this thread (kernels check every 16-byte store).
thread_local uintptr_t t_cache_lo = 0, t_cache_hi = 0;
thread_local uint64_t t_cache_frees = 0;

cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

// The allocation containing [p, p + n), with the lock held.
const std::pair<const uintptr_t, Allocation>* lookup(State& s, uintptr_t p, size_t n) {
  auto it = s.allocs.upper_bound(p);
  if (it == s.allocs.begin()) return nullptr;
  --it;
  if (p + n > it->first + it->second.size || p + n < p) return nullptr;
  return &*it;
}

bool is_device(const void* p, size_t n) { return n == 0 || find_allocation(p, n); }

}  // namespace

bool find_allocation(const void* ptr, size_t bytes, const char** base, size_t* size) {
  State& s = st();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (!base && !size && t_cache_frees == s.frees.load(std::memory_order_relaxed) && p >= t_cache_lo &&
      p + bytes <= t_cache_hi && p + bytes >= p)
    return true;
  std::lock_guard<std::mutex> lock(s.mu);
  const auto* a = lookup(s, p, bytes);
  if (!a) return false;
  t_cache_lo = a->first;
  t_cache_hi = a->first + a->second.size;
  t_cache_frees = s.frees;
  if (base) *base = reinterpret_cast<const char*>(a->first);
  if (size) *size = a->second.size;
  return true;
}

bool in_allocation_guard(const void* ptr, const char** base, size_t* size) {
  State& s = st();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& [start, a] : s.allocs) {
    const uintptr_t guard = reinterpret_cast<uintptr_t>(a.map) + a.map_bytes - kPage;
    if (p >= guard && p < guard + kPage) {
      *base = reinterpret_cast<const char*>(start);
      *size = a.size;
      return true;
    }
  }
  return false;
}

bool valid_stream(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> lock(st().mu);
  return st().streams.count(s) > 0;
}

void set_last_error(cudaError_t e) { t_last_error = e; }

size_t max_dynamic_smem(const void* kernel) {
  std::lock_guard<std::mutex> lock(st().mu);
  const auto it = st().max_dynamic_smem.find(kernel);
  return it == st().max_dynamic_smem.end() ? kDefaultSmemPerBlock : it->second;
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
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
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
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (size > kTotalMemory - s.allocated) return fail(cudaErrorMemoryAllocation);
  const size_t data = (size + 255) / 256 * 256;
  const size_t map_bytes = (data + kPage - 1) / kPage * kPage + kPage;
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  char* map = static_cast<char*>(m);
  mprotect(map + map_bytes - kPage, kPage, PROT_NONE);
  char* p = map + map_bytes - kPage - data;  // 256-byte aligned, ends at the guard page
  s.allocs[reinterpret_cast<uintptr_t>(p)] = Allocation{map, map_bytes, size};
  s.allocated += size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.allocs.end()) return fail(cudaErrorInvalidDevicePointer);
  s.allocated -= it->second.size;
  munmap(it->second.map, it->second.map_bytes);  // a later access through the pointer faults
  s.allocs.erase(it);
  ++s.frees;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  std::lock_guard<std::mutex> lock(st().mu);
  if (free_bytes) *free_bytes = kTotalMemory - st().allocated;
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

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice: ok = is_device(dst, count); break;
    case cudaMemcpyDeviceToHost: ok = is_device(src, count); break;
    case cudaMemcpyDeviceToDevice: ok = is_device(dst, count) && is_device(src, count); break;
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault: break;
    default: return fail(cudaErrorInvalidMemcpyDirection);
  }
  if (!ok) return fail(cudaErrorInvalidValue);  // a device range outside every allocation
  std::memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, count, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!is_device(ptr, count)) return fail(cudaErrorInvalidValue);
  std::memset(ptr, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* ptr, int value, size_t count) { return cudaMemsetAsync(ptr, value, count, nullptr); }

// ---- streams and events ----

static Event* event_of(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(st().mu);
  return st().events.count(e) ? reinterpret_cast<Event*>(e) : nullptr;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  if (!stream) return fail(cudaErrorInvalidValue);
  *stream = reinterpret_cast<cudaStream_t>(new char);
  std::lock_guard<std::mutex> lock(st().mu);
  st().streams.insert(*stream);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(st().mu);
  if (!st().streams.erase(stream)) return fail(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<char*>(stream);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return valid_stream(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  return valid_stream(stream) && event_of(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  return valid_stream(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  if (!event) return fail(cudaErrorInvalidValue);
  *event = reinterpret_cast<cudaEvent_t>(new Event);
  std::lock_guard<std::mutex> lock(st().mu);
  st().events.insert(*event);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(st().mu);
  if (!st().events.erase(event)) return fail(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Event* e = event_of(event);
  if (!e || !valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  e->recorded = true;
  e->t = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return event_of(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  return event_of(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Event *a = event_of(start), *b = event_of(end);
  if (!ms || !a || !b) return fail(cudaErrorInvalidResourceHandle);
  if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}

// ---- kernels ----

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return fail(cudaErrorInvalidDeviceFunction);
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || size_t(value) > kMaxSmemPerBlockOptin) return fail(cudaErrorInvalidValue);
      {
        std::lock_guard<std::mutex> lock(st().mu);
        st().max_dynamic_smem[func] = size_t(value);
      }
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      return value >= -1 && value <= 100 ? cudaSuccess : fail(cudaErrorInvalidValue);
    default: return cudaSuccess;
  }
}

}  // extern "C"
