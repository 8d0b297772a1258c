// Internals shared by the parts of the GPU emulation (docs/cuda.md, "Emulated GPU tests in CI"):
//
//   memory.cpp       the device's address space: allocations (poisoned, exact bounds, sparse),
//                    and the access shadow that finds races between blocks and hazards between
//                    streams
//   streams.cpp      streams, events and the deferred executor (work runs when the host waits,
//                    in a seeded order that respects only stream order and events)
//   emulator.cpp     kernels: resident blocks, threads, barriers, warp collectives, cp.async, PTX
//   runtime_api.cpp, cublaslt_api.cpp, nccl_api.cpp: the libraries' C APIs on top of these
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace emu::detail {

// ------------------------------------------------------------------------------ memory.cpp

constexpr size_t kTotalMemory = size_t(80) << 30;  // H100 SXM: 80 GB

// A new allocation of exactly `bytes` (> 0), 256-byte aligned, every byte 0xff (NaN as bf16,
// fp32 and fp64; -1 as integers), as memory the caching allocators of real programs hand out
// again would hold. Large allocations are sparse: a page costs memory once touched. nullptr when
// the 80 GB are used up.
void* device_alloc(size_t bytes);
bool device_free(void* p);  // false: not the start of a live allocation
size_t device_allocated();

// The device allocation holding [p, p + bytes), or false.
bool find_allocation(const void* p, size_t bytes, const char** base = nullptr, size_t* size = nullptr);
// Where a device address is, for messages ("8 bytes past the end of the 100-byte allocation at
// 0x..", "inside an allocation freed earlier"); empty when `p` is not in the device's range.
std::string describe_device_address(const void* p);
// For the fault handler: a touched page of a sparse allocation gets its memory (true), or the
// faulting address belongs to the access shadow (then *device_addr is the address it shadows).
bool materialize_page(const void* fault_addr);
bool shadow_to_device(const void* fault_addr, const void** device_addr);

extern uintptr_t g_device_lo, g_device_span;  // the device's address range
inline bool in_device_range(const void* p) {
  return reinterpret_cast<uintptr_t>(p) - g_device_lo < g_device_span;
}

enum class Access : uint8_t { kRead, kWrite, kAtomic };
// Records an access of the running op to device memory and checks it: bytes outside every
// allocation abort; two blocks of one launch touching the same bytes (one of them writing, not
// both atomically) abort as a race; an access that an earlier op of another stream made
// conflicting (one of them writing) without anything ordering the two aborts as a hazard.
// `who`: the block (linear index + 1) of the running kernel, or 0 for an op run by the host side
// of the emulation (copies, cuBLASLt, NCCL).
void note_access(const void* p, size_t bytes, Access a, uint32_t who);
// The code address of the kernel access being checked (for reports), set by the instrumentation.
extern const void* g_access_pc;
// Accesses by host-side ops that skip bytes: `rows` runs of `row_bytes`, `stride` bytes apart.
void note_strided(const void* p, size_t rows, size_t row_bytes, size_t stride, Access a);

// ----------------------------------------------------------------------------- streams.cpp

// Work queued on a stream. run() executes it (an op that waits for other processes, NCCL, may
// need several calls: it then returns kProgress or kStalled until done).
class Op {
 public:
  enum Status { kDone, kProgress, kStalled };
  virtual ~Op() = default;
  virtual Status run() = 0;
  // What a stalled op waits for, for hang reports.
  virtual std::string waits_for() const { return ""; }
};
// What an op is, for reports (static strings only: they outlive the op).
struct OpLabel {
  const char* what = "";     // "kernel fa_bwd_dkdv_kernel<64, true>", "cudaMemcpyAsync"
  const char* file = nullptr;  // a kernel's launch site
  int line = 0;
  const char* caller = nullptr;  // the launching function
};

bool valid_stream(cudaStream_t s);
// Queues `op` on `s` (a valid stream); returns its id. (The stream and event functions of the
// runtime API live in streams.cpp.)
uint32_t enqueue(cudaStream_t s, std::unique_ptr<Op> op, const OpLabel& label);
// Queues `op` and waits until it has run, as the host does in a copy to pageable host memory or
// a synchronous call.
void run_and_wait(cudaStream_t s, std::unique_ptr<Op> op, const OpLabel& label);
// The host waits until `done()` holds, running queued work meanwhile (`done` reads state that only
// ops change, e.g. how many ops of a communicator are still queued).
void wait_until(const std::function<bool()>& done);
// Runs ready work, if any, without waiting for anything (host-blocking calls that wait for other
// processes use it, as a GPU keeps working while its host waits).
void progress_some();
// How many times the host has waited for the device (a stream, an event, the whole device, or a
// copy to host memory): emu::Counters::host_waits.
uint64_t host_wait_count();
// Multi-process use (NCCL across ranks): a device thread runs queued work when the host has been
// idle for a while, as a GPU does while its host blocks elsewhere (e.g. in MPI).
void start_device_thread();

// The op being run, set by the executor around each run: its id (0 when none), its vector clock,
// and every op's stream and position (read without locks: one thread runs ops at a time).
struct Running {
  uint32_t op = 0;
  const uint32_t* vc = nullptr;
  size_t vc_size = 0;
  const std::pair<uint32_t, uint32_t>* op_pos = nullptr;  // by op id: (stream, position in it)
};
extern Running g_running;
inline uint32_t running_op() { return g_running.op; }
// Whether op `earlier` happens before the running op: stream order, event waits and host
// synchronisation in between (its stream's clock component has passed it).
inline bool ordered_before_running(uint32_t earlier) {
  const auto& [stream, pos] = g_running.op_pos[earlier];
  return stream < g_running.vc_size && g_running.vc[stream] >= pos;
}
std::string describe_op(uint32_t id);

// ---------------------------------------------------------------------------- emulator.cpp

// The emulation's random choices (splitmix64), all derived from PRIMUS_EMU_SEED.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed = 1) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return uint32_t((next() >> 32) * n >> 32); }
  bool coin(double p) { return p > 0 && double(next() >> 11) * 0x1.0p-53 < p; }
};
// bf16 bits <-> float on the host side of the emulation (cuBLASLt, NCCL, mma): exact one way,
// round to nearest even the other (as __float2bfloat16), NaN kept quiet.
inline float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline uint64_t mix_seed(uint64_t a, uint64_t b) {
  Rng r(a * 0x2545f4914f6cdd1dull ^ b);
  r.next();
  return r.next();
}

// Reports a kernel bug (or a misuse of the emulation) with the kernel, block, thread and seed, and
// aborts.
[[noreturn]] void fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// "(x, y, z)" of block `who` (linear index + 1) of the running launch.
std::string block_name(uint32_t who);
// Gives the calling OS thread its own stack for the emulator's fault handler.
void install_fault_stack();
uint64_t base_seed();

// The dynamic shared memory limit cudaFuncSetAttribute gave `kernel` (48 KB by default).
size_t max_dynamic_smem(const void* kernel);
void set_max_dynamic_smem(const void* kernel, size_t bytes);
constexpr size_t kDefaultSmemPerBlock = 48 * 1024;
constexpr size_t kMaxSmemPerBlockOptin = 227 * 1024;  // H100: 227 KB opt-in per block
constexpr size_t kSmemPerSm = 228 * 1024;

// ---------------------------------------------------------------------------- runtime_api.cpp

void set_last_error(cudaError_t e);

}  // namespace emu::detail
