// The emulated device's memory: where allocations live, what fresh memory holds, and the access
// shadow that turns races between blocks and hazards between streams into reports.
//
// Addresses. The device owns one reserved range of the address space (1 TiB, no memory until
// used); allocations are carved from it and never placed again where one was freed (until the
// range is used up), so a use after free touches unmapped memory and is reported. An allocation
// is 256-byte aligned (as cudaMalloc's) and ends at an unmapped guard page, and every byte
// between its exact end and the page is marked outside in the shadow: instrumented kernel code,
// cp.async, atomics and the host-side ops (copies, cuBLASLt, NCCL) check each access against the
// exact size, not a rounded one.
//
// Fresh memory holds 0xff bytes (NaN in bf16, fp32 and fp64, -1 in integers), as a block the
// caching allocator hands out again holds old data: a missing initialisation reads NaN. An
// allocation above 64 MiB is sparse: its pages are mapped without access and get their memory
// (and their 0xff bytes) when first touched, through the fault handler, so a test can index a
// buffer of 2^31 elements and more while paying only for the pages it touches.
//
// The shadow: 16 bytes per 2 bytes of device memory (the finest granularity kernels write: one
// bf16), at a fixed offset from the device range, mapped with each allocation. A cell holds the
// last op that wrote the 2 bytes and which block of it (or that it was an atomic), and the last
// op that read them and which block (or several). Every recorded access checks its cells:
//   - the same op (a kernel launch): another block wrote these bytes, or read them before this
//     write, and not both atomically: a race (blocks of one launch are not ordered on a GPU);
//   - an earlier op: if that op wrote (or, for a write, read) these bytes and does not happen
//     before the running op (stream order, event waits, host synchronisation: streams.cpp), the
//     two may run in either order or at once on a GPU: a hazard (atomics of two ops commute).
// Only the last reading op is remembered, so a write is checked against one earlier reader.
#include <signal.h>
#include <sys/mman.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "emu/emulator.h"

namespace emu::detail {

uintptr_t g_device_lo = 0, g_device_span = 0;
const void* g_access_pc = nullptr;

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kSpan = size_t(1) << 40;     // device addresses
constexpr size_t kShadowScale = 8;            // shadow bytes per device byte (16 per 2)
constexpr size_t kEagerMax = size_t(64) << 20;  // larger allocations are poisoned page by page
constexpr size_t kMaxLazy = 256;

struct Cell {
  uint32_t w_op, w_who, r_op, r_who;
};
static_assert(sizeof(Cell) == 2 * kShadowScale, "a cell shadows two bytes");
constexpr uint32_t kOutside = 0xffffffffu;  // w_op of bytes outside the allocation
constexpr uint32_t kPartial = 0xfffffffeu;  // w_op of a unit whose second byte is outside
constexpr uint32_t kAtomicBit = 0x80000000u;
constexpr uint32_t kMany = 0x7fffffffu;

uintptr_t g_shadow_lo = 0;

struct Alloc {
  size_t size;
  uintptr_t lo, hi;  // its pages (without the guard page that follows)
  bool lazy;
};
struct Freed {
  uintptr_t base;
  size_t size;
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, Alloc> live;  // by base address
  std::deque<Freed> freed;          // the most recent ones, for messages
  std::map<uintptr_t, size_t> holes;  // freed ranges, reused once the range is used up
  uintptr_t cursor = 0;
  size_t allocated = 0;
  std::atomic<uint64_t> frees{0};
};
State& st() {
  static State s;
  return s;
}

// Sparse allocations, for the fault handler (no locks there): [lo, hi) of each, lo = 0 when free.
std::atomic<uintptr_t> g_lazy_lo[kMaxLazy], g_lazy_hi[kMaxLazy];
std::atomic<std::atomic<uint64_t>*> g_lazy_bits[kMaxLazy];  // pages given memory
std::atomic_flag g_fault_lock = ATOMIC_FLAG_INIT;

thread_local uintptr_t t_cache_lo = 0, t_cache_hi = 0;
thread_local uint64_t t_cache_frees = 0;

constexpr uintptr_t round_up(uintptr_t v, uintptr_t a) { return (v + a - 1) / a * a; }

Cell* cell_of(uintptr_t a) {
  return reinterpret_cast<Cell*>(g_shadow_lo + ((a - g_device_lo) / 2) * sizeof(Cell));
}

void map_fixed(uintptr_t at, size_t bytes, int prot) {
  void* m = mmap(reinterpret_cast<void*>(at), bytes, prot, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) fatal("emulated device memory: mmap of %zu bytes failed (%s)", bytes, strerror(errno));
}

void reserve() {
  if (g_device_lo) return;
  void* d = mmap(nullptr, kSpan, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* s = mmap(nullptr, kSpan * kShadowScale, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (d == MAP_FAILED || s == MAP_FAILED)
    fatal("cannot reserve the emulated device's address space (%zu GiB and %zu GiB of shadow)", kSpan >> 30,
          (kSpan * kShadowScale) >> 30);
  g_shadow_lo = reinterpret_cast<uintptr_t>(s);
  st().cursor = reinterpret_cast<uintptr_t>(d);
  g_device_span = kSpan;
  g_device_lo = reinterpret_cast<uintptr_t>(d);
}

// `need` bytes of fresh addresses (with the lock held), or 0.
uintptr_t take(size_t need) {
  State& s = st();
  if (s.cursor + need <= g_device_lo + g_device_span) {
    const uintptr_t at = s.cursor;
    s.cursor += need;
    return at;
  }
  for (auto it = s.holes.begin(); it != s.holes.end(); ++it) {
    if (it->second < need) continue;
    const uintptr_t at = it->first;
    const size_t left = it->second - need;
    s.holes.erase(it);
    if (left) s.holes[at + need] = left;
    return at;
  }
  return 0;
}

// (Called with the state's lock held: one writer.)
void register_lazy(uintptr_t lo, uintptr_t hi) {
  for (size_t i = 0; i < kMaxLazy; ++i) {
    if (g_lazy_lo[i].load() != 0) continue;
    delete[] g_lazy_bits[i].load();
    const size_t words = ((hi - lo) / kPage + 63) / 64;
    auto* bits = new std::atomic<uint64_t>[words];
    for (size_t w = 0; w < words; ++w) bits[w].store(0);
    g_lazy_bits[i].store(bits);
    g_lazy_hi[i].store(hi);
    g_lazy_lo[i].store(lo, std::memory_order_release);
    return;
  }
  fatal("more than %zu live device allocations above %zu MiB", kMaxLazy, kEagerMax >> 20);
}

void unregister_lazy(uintptr_t lo) {
  for (size_t i = 0; i < kMaxLazy; ++i)
    if (g_lazy_lo[i].load() == lo) g_lazy_lo[i].store(0);
}


std::string code_location(const void* pc) {
  if (!pc) return "";
  Dl_info info{};
  char buf[512];
  if (dladdr(pc, &info) && info.dli_fname) {
    const uintptr_t off = reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase);
    std::snprintf(buf, sizeof buf, " (code at %s+0x%" PRIxPTR "%s%s; addr2line -Cfe that file 0x%" PRIxPTR
                  " names the line)",
                  info.dli_fname, off, info.dli_sname ? ", in " : "", info.dli_sname ? info.dli_sname : "", off);
    return buf;
  }
  std::snprintf(buf, sizeof buf, " (code at %p)", pc);
  return buf;
}

const char* verb(Access a) {
  switch (a) {
    case Access::kRead: return "reads";
    case Access::kWrite: return "writes";
    case Access::kAtomic: return "atomically updates";
  }
  return "?";
}

std::string who_name(uint32_t who) {
  if ((who & ~kAtomicBit) == kMany) return "several blocks";
  return "block " + block_name(who & ~kAtomicBit);
}

[[noreturn]] void out_of_bounds(const void* p, size_t bytes, Access a, const void* bad) {
  fatal("%s %s %zu bytes at %p, outside the device allocations: %s%s",
        running_op() ? describe_op(running_op()).c_str() : "the host", verb(a), bytes, p,
        describe_device_address(bad).c_str(), code_location(g_access_pc).c_str());
}

[[noreturn]] void race(const void* p, size_t bytes, Access a, uint32_t who, const char* earlier_verb,
                       uint32_t earlier_who) {
  fatal("race between the blocks of one launch: block %s %s %zu bytes at %p (%s), which %s %s earlier in this "
        "launch%s. Blocks of a launch run concurrently on a GPU, in any order: one of the two accesses may see "
        "the other or not (use an atomic, or separate launches)",
        block_name(who).c_str(), verb(a), bytes, p, describe_device_address(p).c_str(),
        who_name(earlier_who).c_str(), earlier_verb, code_location(g_access_pc).c_str());
}

[[noreturn]] void hazard(const void* p, size_t bytes, Access a, uint32_t earlier, const char* earlier_verb) {
  fatal("hazard between streams: %s %s %zu bytes at %p (%s)%s, which %s %s before it in this schedule; no "
        "stream order, event wait (cudaStreamWaitEvent) or host synchronisation makes one wait for the other, "
        "so on a GPU they may run in either order or at once",
        describe_op(running_op()).c_str(), verb(a), bytes, p, describe_device_address(p).c_str(),
        code_location(g_access_pc).c_str(), describe_op(earlier).c_str(), earlier_verb);
}

// Whether op `earlier` happens before the running op, remembering the last answer (an access
// usually meets cells of one earlier op).
struct OrderCache {
  uint32_t op = 0;
  bool ordered = false;
  bool operator()(uint32_t earlier) {
    if (earlier != op) {
      op = earlier;
      ordered = ordered_before_running(earlier);
    }
    return ordered;
  }
};

void check_cells(uintptr_t a0, uintptr_t a1, const void* p, size_t bytes, Access a, uint32_t who) {
  const uint32_t op = running_op();
  OrderCache ordered_before_running;
  // A cell equal to the previous one before the access ends equal to it after (the checks depend
  // on the cell and the access only): the cells of a wide access are usually all alike.
  Cell before{}, after{};
  bool have_prev = false;
  Cell* c = cell_of(a0);
  for (uintptr_t u = a0; u < a1; u += 2, ++c) {
    if (have_prev && std::memcmp(c, &before, sizeof(Cell)) == 0 && c->w_op < kPartial) {
      *c = after;
      continue;
    }
    before = *c;
    have_prev = true;
    if (c->w_op >= kPartial) {
      // Outside the allocation, or a unit whose second byte is: exact down to the byte.
      if (c->w_op == kOutside || reinterpret_cast<uintptr_t>(p) + bytes > u + 1)
        out_of_bounds(p, bytes, a,
                      reinterpret_cast<const void*>(std::max<uintptr_t>(u, reinterpret_cast<uintptr_t>(p))));
      have_prev = false;
      continue;
    }
    if (!op) {  // host-side checks outside any op: bounds only
      have_prev = false;
      continue;
    }
    switch (a) {
      case Access::kRead:
        if (c->w_op == op) {
          if ((c->w_who & ~kAtomicBit) != who || ((c->w_who & kAtomicBit) && (c->w_who & ~kAtomicBit) == kMany))
            race(p, bytes, a, who, c->w_who & kAtomicBit ? "atomically updated" : "wrote", c->w_who);
        } else if (c->w_op && !ordered_before_running(c->w_op)) {
          hazard(p, bytes, a, c->w_op, "wrote");
        }
        if (c->r_op == op) {
          if (c->r_who != who) c->r_who = kMany;
        } else {
          c->r_op = op;
          c->r_who = who;
        }
        break;
      case Access::kWrite:
        if (c->w_op == op) {
          if ((c->w_who & ~kAtomicBit) != who)
            race(p, bytes, a, who, c->w_who & kAtomicBit ? "atomically updated" : "wrote", c->w_who);
        } else if (c->w_op && !ordered_before_running(c->w_op)) {
          hazard(p, bytes, a, c->w_op, "wrote");
        }
        if (c->r_op == op) {
          if (c->r_who != who) race(p, bytes, a, who, "read", c->r_who);
        } else if (c->r_op && !ordered_before_running(c->r_op)) {
          hazard(p, bytes, a, c->r_op, "read");
        }
        c->w_op = op;
        c->w_who = who;
        break;
      case Access::kAtomic:
        if (c->w_op == op) {
          if (!(c->w_who & kAtomicBit)) {
            if (c->w_who != who) race(p, bytes, a, who, "wrote", c->w_who);  // a plain write of another block
          } else if ((c->w_who & ~kAtomicBit) != who) {
            c->w_who = kMany | kAtomicBit;  // atomics of several blocks: fine
          }
        } else {
          // Atomics of unordered ops commute (they are coherent on a GPU); a plain write does not.
          if (c->w_op && !(c->w_who & kAtomicBit) && !ordered_before_running(c->w_op))
            hazard(p, bytes, a, c->w_op, "wrote");
          c->w_op = op;
          c->w_who = who | kAtomicBit;
        }
        if (c->r_op == op) {
          if (c->r_who != who) race(p, bytes, a, who, "read", c->r_who);
        } else if (c->r_op && !ordered_before_running(c->r_op)) {
          hazard(p, bytes, a, c->r_op, "read");
        }
        break;
    }
    after = *c;
  }
}

}  // namespace

void* device_alloc(size_t bytes) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  reserve();
  if (bytes == 0 || bytes > kTotalMemory - s.allocated) return nullptr;
  const size_t rounded = round_up(bytes, 256);
  const size_t data = round_up(rounded, kPage);
  const uintptr_t lo = take(data + kPage);  // + the guard page, left unmapped
  if (!lo) return nullptr;
  const bool lazy = bytes > kEagerMax;
  map_fixed(lo, data, lazy ? PROT_NONE : PROT_READ | PROT_WRITE);
  map_fixed(reinterpret_cast<uintptr_t>(cell_of(lo)), data * kShadowScale, PROT_READ | PROT_WRITE);
  const uintptr_t base = lo + data - rounded;
  // The bytes before the allocation on its first page, and after its exact end.
  for (Cell* c = cell_of(lo); c < cell_of(base); ++c) c->w_op = kOutside;
  const uintptr_t end = base + bytes;
  if (end % 2) cell_of(end - 1)->w_op = kPartial;
  for (Cell* c = cell_of(round_up(end, 2)); c < cell_of(lo + data); ++c) c->w_op = kOutside;
  if (lazy)
    register_lazy(lo, lo + data);
  else
    std::memset(reinterpret_cast<void*>(base), 0xff, bytes);
  s.live[base] = Alloc{bytes, lo, lo + data, lazy};
  s.allocated += bytes;
  return reinterpret_cast<void*>(base);
}

bool device_free(void* p) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.live.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.live.end()) return false;
  const Alloc a = it->second;
  if (a.lazy) unregister_lazy(a.lo);
  // Unmapped again (no memory; a later access through the pointer faults), its shadow too.
  map_fixed(a.lo, a.hi - a.lo, PROT_NONE);
  map_fixed(reinterpret_cast<uintptr_t>(cell_of(a.lo)), (a.hi - a.lo) * kShadowScale, PROT_NONE);
  s.holes[a.lo] = a.hi - a.lo + kPage;
  s.freed.push_back({it->first, a.size});
  if (s.freed.size() > 4096) s.freed.pop_front();
  s.allocated -= a.size;
  s.live.erase(it);
  ++s.frees;
  return true;
}

size_t device_allocated() {
  std::lock_guard<std::mutex> lock(st().mu);
  return st().allocated;
}

bool find_allocation(const void* ptr, size_t bytes, const char** base, size_t* size) {
  State& s = st();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  if (!base && !size && t_cache_frees == s.frees.load(std::memory_order_relaxed) && p >= t_cache_lo &&
      p + bytes <= t_cache_hi && p + bytes >= p)
    return true;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.live.upper_bound(p);
  if (it == s.live.begin()) return false;
  --it;
  if (p + bytes > it->first + it->second.size || p + bytes < p) return false;
  t_cache_lo = it->first;
  t_cache_hi = it->first + it->second.size;
  t_cache_frees = s.frees;
  if (base) *base = reinterpret_cast<const char*>(it->first);
  if (size) *size = it->second.size;
  return true;
}

std::string describe_device_address(const void* ptr) {
  if (!in_device_range(ptr)) return "";
  State& s = st();
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  char buf[256];
  std::unique_lock<std::mutex> lock(s.mu, std::try_to_lock);  // (from a fault handler: never wait)
  if (!lock.owns_lock()) return "a device address";
  auto it = s.live.upper_bound(p);
  if (it != s.live.begin()) {
    const auto& [base, a] = *std::prev(it);
    if (p < base + a.size) {
      std::snprintf(buf, sizeof buf, "byte %" PRIuPTR " of the %zu-byte allocation at %p", p - base, a.size,
                    reinterpret_cast<const void*>(base));
      return buf;
    }
    if (p < a.hi + kPage) {
      std::snprintf(buf, sizeof buf, "byte %" PRIuPTR " of the %zu-byte allocation at %p, past its end",
                    p - base, a.size, reinterpret_cast<const void*>(base));
      return buf;
    }
  }
  if (it != s.live.end() && p >= it->second.lo) {
    std::snprintf(buf, sizeof buf, "%" PRIuPTR " bytes before the start of the %zu-byte allocation at %p",
                  it->first - p, it->second.size, reinterpret_cast<const void*>(it->first));
    return buf;
  }
  for (auto f = s.freed.rbegin(); f != s.freed.rend(); ++f)
    if (p >= f->base && p < f->base + f->size) {
      std::snprintf(buf, sizeof buf, "byte %" PRIuPTR " of the %zu-byte allocation at %p, which was freed",
                    p - f->base, f->size, reinterpret_cast<const void*>(f->base));
      return buf;
    }
  return "not inside any device allocation";
}

bool materialize_page(const void* fault_addr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(fault_addr);
  for (size_t i = 0; i < kMaxLazy; ++i) {
    const uintptr_t lo = g_lazy_lo[i].load(std::memory_order_acquire);
    if (!lo || a < lo || a >= g_lazy_hi[i].load(std::memory_order_acquire)) continue;
    // One fault at a time, and a page poisoned once: a second thread faulting on the same page
    // must not overwrite what the first wrote after its fault returned.
    while (g_fault_lock.test_and_set(std::memory_order_acquire)) {
    }
    const uintptr_t page = a & ~(kPage - 1);
    const size_t index = (page - lo) / kPage;
    std::atomic<uint64_t>* bits = g_lazy_bits[i].load(std::memory_order_acquire);
    bool ok = true;
    if (!(bits[index / 64].load() >> (index % 64) & 1)) {
      ok = mprotect(reinterpret_cast<void*>(page), kPage, PROT_READ | PROT_WRITE) == 0;
      if (ok) {
        std::memset(reinterpret_cast<void*>(page), 0xff, kPage);
        bits[index / 64].fetch_or(uint64_t(1) << (index % 64));
      }
    }
    g_fault_lock.clear(std::memory_order_release);
    return ok;
  }
  return false;
}

bool shadow_to_device(const void* fault_addr, const void** device_addr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(fault_addr);
  if (!g_shadow_lo || a < g_shadow_lo || a >= g_shadow_lo + g_device_span * kShadowScale) return false;
  *device_addr = reinterpret_cast<const void*>(g_device_lo + (a - g_shadow_lo) / sizeof(Cell) * 2);
  return true;
}

void note_access(const void* p, size_t bytes, Access a, uint32_t who) {
  if (!bytes) return;
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  if (!in_device_range(p) || !in_device_range(reinterpret_cast<const void*>(u + bytes - 1)))
    fatal("%s %s %zu bytes at %p: not device memory (a host pointer, or garbage)%s",
          running_op() ? describe_op(running_op()).c_str() : "the host", verb(a), bytes, p,
          code_location(g_access_pc).c_str());
  check_cells(u & ~uintptr_t(1), round_up(u + bytes, 2), p, bytes, a, who);
}

void note_strided(const void* p, size_t rows, size_t row_bytes, size_t stride, Access a) {
  if (row_bytes == stride) return note_access(p, rows * row_bytes, a, 0);  // contiguous
  for (size_t r = 0; r < rows; ++r) note_access(static_cast<const char*>(p) + r * stride, row_bytes, a, 0);
}

void seg_access_pc(const void* pc) { g_access_pc = pc; }

}  // namespace emu::detail
