// The device side of the GPU emulation: what a CUDA kernel source sees when it is compiled by g++
// as C++ (force-included into every file that cuda_to_cpp.py generates from src/kernels/cuda).
//
// Execution model (emu/emulator.cpp): a launch is queued on its stream and runs when the
// emulated device's executor reaches it (emu/streams.cpp). It keeps 1 to 4 blocks resident at
// once, in a random order; the threads of the resident blocks are cooperative user-level
// threads, each running the kernel function on its own stack (so registers are ordinary locals),
// switched at the points where CUDA threads synchronise or exchange data (__syncthreads, warp
// collectives: __shfl_*_sync, ldmatrix, mma.sync; the cp.async instructions) and, with several
// resident blocks, at a random share of memory accesses. A seeded random scheduler picks which
// thread runs next. Every warp collective is a rendezvous of its lanes, checked for consistent
// arguments; barriers are checked for divergence; cp.async copies land at random times before
// the wait that covers them; every global memory access is checked against the exact bounds of
// its allocation and recorded for the race (between blocks) and hazard (between streams) checks
// of emu/memory.cpp. Violations abort with a message naming the kernel, block, thread and seed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// `#if __CUDA_ARCH__ >= 900` in a kernel source is rewritten to this: the emulation runs the
// device code of the sm_90 build (the one CMake builds for H100/H200).
#define PRIMUS_EMU_CUDA_ARCH 900

namespace emu {

// ---------------------------------------------------------------------------------- launches

struct LaunchSite {
  const char* kernel;  // the launch expression, as written
  const char* file;
  int line;
  const char* caller;  // the launching function
};

struct LaunchConfig {
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  static LaunchConfig make(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = nullptr) {
    return LaunchConfig{grid, block, smem, stream};
  }
};

namespace detail {
using Body = void (*)(void*);
// Validates the configuration as a GPU does (errors go to cudaGetLastError, nothing runs), then
// queues the launch on its stream. `kernel` identifies the function for cudaFuncSetAttribute
// limits; `destroy` frees `closure` once the launch has run (or was refused).
void launch(const LaunchSite& site, const void* kernel, const LaunchConfig& config, Body body, void* closure,
            void (*destroy)(void*));
}  // namespace detail

// kernel<<<config>>>(args): the arguments are converted to the kernel's parameter types once, on
// the host, when the launch is issued, as a CUDA launch does; each emulated thread then calls the
// kernel with its own copy.
template <typename... P, typename... A>
void launch(const LaunchSite& site, void (*kernel)(P...), const LaunchConfig& config, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launch: the number of arguments differs from the kernel's");
  using Params = std::tuple<std::remove_cv_t<P>...>;
  struct Closure {
    void (*kernel)(P...);
    Params params;
  };
  detail::launch(
      site, reinterpret_cast<const void*>(kernel), config,
      [](void* p) {
        auto* c = static_cast<Closure*>(p);
        std::apply(c->kernel, c->params);
      },
      new Closure{kernel, Params(std::forward<A>(args)...)}, [](void* p) { delete static_cast<Closure*>(p); });
}

// ------------------------------------------------------------------ built-in variables

namespace detail {
extern const uint3* g_thread_idx;  // the running thread's threadIdx
extern uint3 g_block_idx;
extern dim3 g_block_dim, g_grid_dim;
}  // namespace detail

// -------------------------------------------------------------------------- shared memory

namespace detail {
void* dynamic_shared(size_t align);
void* static_shared(const void* key, size_t bytes, size_t align);
}  // namespace detail

// extern __shared__ T name[] (the launch's dynamic shared memory).
template <typename T, size_t Align>
T* dynamic_shared() {
  return static_cast<T*>(detail::dynamic_shared(std::max<size_t>(Align, alignof(T))));
}
// __shared__ T name[...]: one object per block, in the block's shared memory. Tag (a lambda type)
// makes every declaration, in every template instantiation, its own object.
template <typename T, size_t Align, typename Tag>
T& static_shared(Tag) {
  static const char key = 0;
  return *static_cast<T*>(detail::static_shared(&key, sizeof(T), std::max<size_t>(Align, alignof(T))));
}

// ------------------------------------------------------------------------ collectives

namespace detail {
void syncthreads(const char* file, int line);
void syncwarp(unsigned mask, const char* file, int line);
enum ShflMode { kShflUp = 0, kShflDown = 1, kShflBfly = 2, kShflIdx = 3 };
// shfl.sync.{up,down,bfly,idx}.b32 semantics (PTX ISA), on up to 8 bytes (64-bit values are two
// 32-bit shuffles from the same lane on a GPU: the same result).
uint64_t shfl(ShflMode mode, unsigned mask, uint64_t value, unsigned size, int b, int c, const char* file, int line);

template <typename T>
T shfl_as(ShflMode mode, unsigned mask, T var, int b, int c, const char* file, int line) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move values of up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = shfl(mode, mask, bits, sizeof(T), b, c, file, line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
int shfl_width_c(int width, bool clamp_all, const char* file, int line);
}  // namespace detail

// ----------------------------------------------------------------------- global memory

namespace detail {
// Aborts unless [p, p + bytes) lies in one device allocation (cudaMalloc) and p is `align`-aligned.
void check_global(const void* p, size_t bytes, size_t align, const char* what, const char* file, int line);
}  // namespace detail

// ------------------------------------------------------------------------------- PTX

// The inline-PTX instructions of the kernels, rewritten by cuda_to_cpp.py into calls of these
// functions with the operands in the template's order (outputs by reference).
namespace ptx {
void cp_async_cg_shared_global(uint32_t dst, const void* src, int cp_size, int src_size,
                               const char* file = __builtin_FILE(), int line = __builtin_LINE());
void cp_async_ca_shared_global(uint32_t dst, const void* src, int cp_size, int src_size,
                               const char* file = __builtin_FILE(), int line = __builtin_LINE());
void cp_async_commit_group(const char* file = __builtin_FILE(), int line = __builtin_LINE());
void cp_async_wait_group(int n, const char* file = __builtin_FILE(), int line = __builtin_LINE());
void cp_async_wait_all(const char* file = __builtin_FILE(), int line = __builtin_LINE());
void ldmatrix_sync_aligned_m8n8_x1_shared_b16(uint32_t& r0, uint32_t addr, const char* file = __builtin_FILE(),
                                              int line = __builtin_LINE());
void ldmatrix_sync_aligned_m8n8_x2_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t addr,
                                              const char* file = __builtin_FILE(), int line = __builtin_LINE());
void ldmatrix_sync_aligned_m8n8_x4_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr,
                                              const char* file = __builtin_FILE(), int line = __builtin_LINE());
void ldmatrix_sync_aligned_m8n8_x1_trans_shared_b16(uint32_t& r0, uint32_t addr, const char* file = __builtin_FILE(),
                                                    int line = __builtin_LINE());
void ldmatrix_sync_aligned_m8n8_x2_trans_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t addr,
                                                    const char* file = __builtin_FILE(), int line = __builtin_LINE());
void ldmatrix_sync_aligned_m8n8_x4_trans_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                    uint32_t addr, const char* file = __builtin_FILE(),
                                                    int line = __builtin_LINE());
void mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32(float& d0, float& d1, float& d2, float& d3, uint32_t a0,
                                                         uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                         uint32_t b1, float c0, float c1, float c2, float c3,
                                                         const char* file = __builtin_FILE(),
                                                         int line = __builtin_LINE());
void ex2_approx_ftz_f32(float& d, float a, const char* file = __builtin_FILE(), int line = __builtin_LINE());
void ex2_approx_f32(float& d, float a, const char* file = __builtin_FILE(), int line = __builtin_LINE());
}  // namespace ptx

}  // namespace emu

// ============================================================== the CUDA names kernels use

// cuda_runtime.h declares its overloads taking the kernel itself (not a `const void*`) for nvcc only.
template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

#define threadIdx (*::emu::detail::g_thread_idx)
#define blockIdx (static_cast<const uint3&>(::emu::detail::g_block_idx))
#define blockDim (static_cast<const dim3&>(::emu::detail::g_block_dim))
#define gridDim (static_cast<const dim3&>(::emu::detail::g_grid_dim))
#define warpSize 32

// Execution-space and launch-bound annotations carry no meaning on the host (the launch-bound
// thread count is not checked against launches).
#undef __global__
#define __global__
#define __launch_bounds__(...)
// Any __shared__ left in a generated source is a transform bug: fail to compile.
#undef __shared__
#define __shared__ __shared__must_be_rewritten_by_cuda_to_cpp_py

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::syncthreads(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::syncwarp(mask, file, line);
}
// The emulation is sequentially consistent (a store is visible to every thread at once): fences
// have nothing to do. Weak ordering is not modelled; an ordering between blocks that relies on
// fences and flags would be reported as a race by the shadow checks (no kernel here needs one).
inline void __threadfence() {}
inline void __threadfence_block() {}

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return ::emu::detail::shfl_as(::emu::detail::kShflIdx, mask, var, src_lane,
                                ::emu::detail::shfl_width_c(width, true, file, line), file, line);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  return ::emu::detail::shfl_as(::emu::detail::kShflUp, mask, var, int(delta),
                                ::emu::detail::shfl_width_c(width, false, file, line), file, line);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, const char* file = __builtin_FILE(),
                   int line = __builtin_LINE()) {
  return ::emu::detail::shfl_as(::emu::detail::kShflDown, mask, var, int(delta),
                                ::emu::detail::shfl_width_c(width, true, file, line), file, line);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) {
  return ::emu::detail::shfl_as(::emu::detail::kShflBfly, mask, var, lane_mask,
                                ::emu::detail::shfl_width_c(width, true, file, line), file, line);
}

// cvta.to.shared: the offset of a generic pointer into the block's shared memory window.
size_t __cvta_generic_to_shared(const void* p);

// ---- IEEE-rounded arithmetic intrinsics: one rounding each, never contracted into an FMA (the
// value passes through a volatile, which g++ cannot fuse across) ----
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline float __fsub_rn(float a, float b) {
  volatile float r = a - b;
  return r;
}
inline float __fdiv_rn(float a, float b) {
  volatile float r = a / b;
  return r;
}
inline float __frcp_rn(float a) { return __fdiv_rn(1.0f, a); }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline double __dmul_rn(double a, double b) {
  volatile double r = a * b;
  return r;
}
inline double __dadd_rn(double a, double b) {
  volatile double r = a + b;
  return r;
}

// ---- Integer min / max of device code (CUDA declares them for every integer type) ----
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// ---- Cache-hinted global loads and stores: plain accesses (checked exactly by the
// instrumentation), checked for alignment and for being device memory first (what would fault on
// a GPU) ----
template <typename T>
void __stwb(T* p, T v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_global(p, sizeof(T), alignof(T), "__stwb (st.global.wb)", file, line);
  *p = v;
}
template <typename T>
void __stcg(T* p, T v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_global(p, sizeof(T), alignof(T), "__stcg (st.global.cg)", file, line);
  *p = v;
}
template <typename T>
void __stcs(T* p, T v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_global(p, sizeof(T), alignof(T), "__stcs (st.global.cs)", file, line);
  *p = v;
}
template <typename T>
T __ldg(const T* p, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_global(p, sizeof(T), alignof(T), "__ldg (ld.global.nc)", file, line);
  return *p;
}
template <typename T>
T __ldcg(const T* p, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_global(p, sizeof(T), alignof(T), "__ldcg (ld.global.cg)", file, line);
  return *p;
}
template <typename T>
T __ldcs(const T* p, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_global(p, sizeof(T), alignof(T), "__ldcs (ld.global.cs)", file, line);
  return *p;
}

// ---- Atomics. Threads never switch inside one (the instrumentation is off in these functions, so
// their loads and stores are not memory-access switch points either): a read-modify-write is
// indivisible; check_atomic records it as an atomic for the race checks. The random block order
// and interleavings give float sums a random order, as on a GPU. fp32 adds flush subnormal inputs
// and results to zero, as atom.add.f32 does. ----
#define PRIMUS_EMU_ATOMIC __attribute__((no_sanitize_thread))
namespace emu::detail {
inline float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
void check_atomic(const void* p, size_t bytes, const char* file, int line);
}  // namespace emu::detail
PRIMUS_EMU_ATOMIC inline float atomicAdd(float* p, float v, const char* file = __builtin_FILE(),
                                         int line = __builtin_LINE()) {
  ::emu::detail::check_atomic(p, sizeof(float), file, line);
  const float old = *p;
  *p = ::emu::detail::ftz(::emu::detail::ftz(old) + ::emu::detail::ftz(v));
  return old;
}
PRIMUS_EMU_ATOMIC inline float2 atomicAdd(float2* p, float2 v, const char* file = __builtin_FILE(),
                                          int line = __builtin_LINE()) {
  static_assert(PRIMUS_EMU_CUDA_ARCH >= 900, "vector atomicAdd needs sm_90");
  ::emu::detail::check_atomic(p, sizeof(float2), file, line);
  const float2 old = *p;
  p->x = ::emu::detail::ftz(::emu::detail::ftz(old.x) + ::emu::detail::ftz(v.x));
  p->y = ::emu::detail::ftz(::emu::detail::ftz(old.y) + ::emu::detail::ftz(v.y));
  return old;
}
PRIMUS_EMU_ATOMIC inline float4 atomicAdd(float4* p, float4 v, const char* file = __builtin_FILE(),
                                          int line = __builtin_LINE()) {
  ::emu::detail::check_atomic(p, sizeof(float4), file, line);
  const float4 old = *p;
  p->x = ::emu::detail::ftz(::emu::detail::ftz(old.x) + ::emu::detail::ftz(v.x));
  p->y = ::emu::detail::ftz(::emu::detail::ftz(old.y) + ::emu::detail::ftz(v.y));
  p->z = ::emu::detail::ftz(::emu::detail::ftz(old.z) + ::emu::detail::ftz(v.z));
  p->w = ::emu::detail::ftz(::emu::detail::ftz(old.w) + ::emu::detail::ftz(v.w));
  return old;
}
PRIMUS_EMU_ATOMIC inline double atomicAdd(double* p, double v, const char* file = __builtin_FILE(),
                                          int line = __builtin_LINE()) {
  ::emu::detail::check_atomic(p, sizeof(double), file, line);
  const double old = *p;
  *p = old + v;
  return old;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
PRIMUS_EMU_ATOMIC T atomicAdd(T* p, T v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_atomic(p, sizeof(T), file, line);
  const T old = *p;
  *p = T(old + v);
  return old;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
PRIMUS_EMU_ATOMIC T atomicMax(T* p, T v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_atomic(p, sizeof(T), file, line);
  const T old = *p;
  *p = old > v ? old : v;
  return old;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
PRIMUS_EMU_ATOMIC T atomicMin(T* p, T v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_atomic(p, sizeof(T), file, line);
  const T old = *p;
  *p = old < v ? old : v;
  return old;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
PRIMUS_EMU_ATOMIC T atomicExch(T* p, T v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_atomic(p, sizeof(T), file, line);
  const T old = *p;
  *p = v;
  return old;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
PRIMUS_EMU_ATOMIC T atomicCAS(T* p, T compare, T v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  ::emu::detail::check_atomic(p, sizeof(T), file, line);
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
