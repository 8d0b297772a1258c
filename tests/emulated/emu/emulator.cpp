// The GPU emulator: launches, the per-block thread scheduler, barriers, warp collectives,
// cp.async, the shared memory window, and the PTX instructions the kernels use.
// What is modelled and what is not: docs/cuda.md, "Emulated GPU tests in CI".
//
// Threads. Each CUDA thread of the running block is a user-level thread with its own stack (a
// register of the kernel is a local of that stack). A thread runs until it reaches a point where
// CUDA threads interact (a barrier, a warp collective, a cp.async instruction) and then hands
// control back to the scheduler, which picks the next thread at random. Blocks run one at a time
// in a random order, so threads of different blocks never interleave (inter-block races other
// than through atomics are not modelled; atomics are indivisible and happen in block order).
//
// Randomness: every launch derives its own seed from PRIMUS_EMU_SEED (default 1) and its launch
// number, and every block draws a scheduling policy (uniform random choice, random warp
// priorities with random changes, or FIFO) and cp.async landing rates from it. A failure message
// prints the seed; the same seed, test filter and binary replay the same schedules.
#include "emu/emulator.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "emu/device.h"

// Context switches: a few instructions on x86-64; elsewhere (or with PRIMUS_EMU_UCONTEXT) through
// ucontext, which works anywhere but makes a system call per switch (about 20 times slower).
#if defined(__x86_64__) && !defined(PRIMUS_EMU_UCONTEXT)
#define PRIMUS_EMU_ASM_SWITCH 1
#else
#define PRIMUS_EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

#if PRIMUS_EMU_ASM_SWITCH
// primus_emu_switch(save, load): saves the callee-saved registers on the current stack, stores the
// stack pointer to *save, and resumes the context whose stack pointer is `load`. A new context
// starts in primus_emu_trampoline, which calls r13(). (MXCSR and the x87 control word are not
// switched: every context runs on the same OS thread and none changes them.)
extern "C" void primus_emu_switch(void** save, void* load);
extern "C" void primus_emu_trampoline();
asm(R"(
  .text
  .globl primus_emu_switch
  .type primus_emu_switch, @function
primus_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size primus_emu_switch, .-primus_emu_switch

  .globl primus_emu_trampoline
  .type primus_emu_trampoline, @function
primus_emu_trampoline:
  callq *%r13
  ud2
  .size primus_emu_trampoline, .-primus_emu_trampoline
)");
#endif

namespace emu::detail {

const uint3* g_thread_idx = nullptr;
uint3 g_block_idx{};
dim3 g_block_dim, g_grid_dim;

namespace {

// ------------------------------------------------------------------------------ randomness

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed = 1) : s(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return uint32_t((next() >> 32) * n >> 32); }
  bool coin(double p) { return p > 0 && double(next() >> 11) * 0x1.0p-53 < p; }
};

uint64_t mix(uint64_t a, uint64_t b) {
  Rng r(a * 0x2545f4914f6cdd1dull ^ b);
  r.next();
  return r.next();
}

// ----------------------------------------------------------------------------------- state

constexpr size_t kPage = 4096;
constexpr size_t kStackBytes = 256 * 1024;  // per emulated thread, plus a guard page below
constexpr size_t kStaticSmemMax = 48 * 1024;
constexpr size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
constexpr size_t kWindowBytes = kStaticSmemMax + round_up(kMaxSmemPerBlockOptin, kPage);

enum class St : uint8_t { kRunnable, kRunning, kBarrier, kWarp, kExited };

struct Thread {
  uint3 idx{};
  int linear = 0, warp = 0, lane = 0;
  St st = St::kRunnable;
#if PRIMUS_EMU_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
  uint64_t commits = 0;     // cp.async groups committed
  std::vector<int> copies;  // this thread's cp.async copies not yet waited for
};

enum Op : int {
  kOpShflUp = 0, kOpShflDown, kOpShflBfly, kOpShflIdx,  // = kOpShflUp + ShflMode
  kOpSyncwarp,
  kOpLdm1, kOpLdm2, kOpLdm4, kOpLdm1T, kOpLdm2T, kOpLdm4T,
  kOpMma,
};
const char* op_name(int op) {
  static const char* names[] = {"__shfl_up_sync",
                                "__shfl_down_sync",
                                "__shfl_xor_sync",
                                "__shfl_sync",
                                "__syncwarp",
                                "ldmatrix.sync.aligned.m8n8.x1.shared.b16",
                                "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                                "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                                "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
                                "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                                "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"};
  return names[op];
}

struct Rendezvous {
  bool active = false;
  bool aligned = false;  // .aligned PTX: every lane of the warp, at the same instruction
  int op = 0;
  unsigned mask = 0, arrived = 0;
  const char* file = "";
  int line = 0;
  void* args[32] = {};
};

struct Warp {
  unsigned existing = 0;  // lanes that exist (a last, partial warp has fewer)
  unsigned exited = 0;
  Rendezvous rv;
};
void complete_if_ready(Warp& w);

// Threads ready to run. Three policies, drawn per block:
//  * uniform: any runnable thread, at random (fine-grained interleavings);
//  * warp priorities (PCT-like): each warp has a random rank and the runnable lane of the
//    highest-ranked warp runs (lanes in a random order), so one warp runs ahead until it blocks
//    at a barrier, with random rank swaps at synchronisation points: this exposes missing
//    barriers between warps, which lockstep-like schedules hide;
//  * FIFO: round-robin progress, like warps in lockstep.
struct RunQueue {
  enum Mode { kUniform, kWarpPriority, kFifo } mode = kUniform;
  std::vector<int> items;  // uniform; FIFO: items[head..]
  size_t head = 0;
  // Warp-priority mode: key(thread) = rank[warp] * 32 + lane_pos[thread]; bit k of `bits` set
  // when thread owner[k] is runnable; the highest key runs.
  std::vector<uint64_t> bits;
  std::vector<int> owner, key, rank, lane_pos;
  size_t count = 0;

  void reset(Mode m, int nthreads, Rng& rng) {
    mode = m;
    items.clear();
    head = 0;
    count = 0;
    if (mode != kWarpPriority) return;
    const int nwarps = (nthreads + 31) / 32;
    bits.assign(size_t(nwarps) / 2 + 1, 0);
    owner.assign(size_t(nwarps) * 32, -1);
    key.resize(size_t(nthreads));
    lane_pos.resize(size_t(nthreads));
    rank.resize(size_t(nwarps));
    for (int w = 0; w < nwarps; ++w) rank[size_t(w)] = w;
    shuffle(rank, rng);
    for (int w = 0; w < nwarps; ++w) {
      std::vector<int> pos(32);
      for (int l = 0; l < 32; ++l) pos[size_t(l)] = l;
      shuffle(pos, rng);
      for (int l = 0; l < 32 && 32 * w + l < nthreads; ++l) lane_pos[size_t(32 * w + l)] = pos[size_t(l)];
    }
    for (int t = 0; t < nthreads; ++t) set_key(t);
  }
  static void shuffle(std::vector<int>& v, Rng& rng) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(uint32_t(i))]);
  }
  void set_key(int t) {
    key[size_t(t)] = rank[size_t(t / 32)] * 32 + lane_pos[size_t(t)];
    owner[size_t(key[size_t(t)])] = t;
  }
  bool bit(int k) const { return (bits[size_t(k) / 64] >> (k % 64)) & 1; }
  void put(int k, bool v) {
    bits[size_t(k) / 64] = (bits[size_t(k) / 64] & ~(uint64_t(1) << (k % 64))) | (uint64_t(v) << (k % 64));
  }
  void push(int t) {
    ++count;
    if (mode == kWarpPriority)
      put(key[size_t(t)], true);
    else
      items.push_back(t);
  }
  int pop(Rng& rng) {
    if (count == 0) return -1;
    --count;
    if (mode == kUniform) {
      const size_t i = rng.below(uint32_t(items.size()));
      const int t = items[i];
      items[i] = items.back();
      items.pop_back();
      return t;
    }
    if (mode == kFifo) {
      const int t = items[head++];
      if (head == items.size()) {
        items.clear();
        head = 0;
      }
      return t;
    }
    for (size_t w = bits.size(); w-- > 0;) {
      if (bits[w]) {
        const int b = 63 - __builtin_clzll(bits[w]);
        bits[w] &= ~(uint64_t(1) << b);
        return owner[w * 64 + size_t(b)];
      }
    }
    return -1;
  }
  // A PCT change point (warp-priority mode): warps a and b swap ranks, keeping which of their
  // threads are runnable.
  void swap_warps(int a, int b, int nthreads) {
    if (mode != kWarpPriority || a == b) return;
    bool runnable[64];
    for (int i = 0; i < 64; ++i) {
      const int t = (i < 32 ? a : b) * 32 + i % 32;
      runnable[i] = t < nthreads && bit(key[size_t(t)]);
      if (t < nthreads) put(key[size_t(t)], false);
    }
    std::swap(rank[size_t(a)], rank[size_t(b)]);
    for (int i = 0; i < 64; ++i) {
      const int t = (i < 32 ? a : b) * 32 + i % 32;
      if (t >= nthreads) continue;
      set_key(t);
      if (runnable[i]) put(key[size_t(t)], true);
    }
  }
};

// A cp.async copy. It lands (its bytes are read from global memory and written to shared memory)
// at a random time between its issue and the cp.async.wait_group of its thread that covers it.
// Independently of when it lands, its bytes become visible to its own thread at that wait and to
// the other threads of the block at the first __syncthreads() after the wait ("published"); a
// read through ldmatrix before that is reported as a race. Until published, the copy owns the
// 4-byte words it writes (g_word_owner).
struct Copy {
  uint32_t dst = 0;
  uint32_t cp_size = 0, src_size = 0;
  const void* src = nullptr;
  uint64_t group = 0;
  int thread = 0;
  bool landed = false, waited = false;
  int pend_pos = -1;  // in g_pending while not landed
  int mine_pos = -1;  // in its thread's `copies` while not waited for
};

struct Launch {
  LaunchSite site{};
  const void* kernel = nullptr;
  LaunchConfig cfg;
  Body body = nullptr;
  void* closure = nullptr;
  uint64_t number = 0, seed = 0;
  int nthreads = 0, nwarps = 0;
  char* dyn_base = nullptr;
  size_t dyn_bytes = 0;
  char* static_low = nullptr;  // the lowest byte of the static __shared__ objects
  std::vector<std::pair<const void*, char*>> statics;
  // per block
  bool in_block = false;
  int live = 0;
  bool any_exited = false;
  int barrier_arrived = 0;
  const char* barrier_file = "";
  int barrier_line = 0;
  double land_rate = 0, land_at_issue = 0, yield_rate = 0, prio_swap_rate = 0;
};

struct Stats {
  uint64_t launches = 0, blocks = 0, threads = 0, switches = 0, copies = 0;
  uint64_t ldmatrix_phases = 0, ldmatrix_conflicts = 0, mma = 0, shfl = 0, barriers = 0;
};

std::recursive_mutex g_mutex;
Launch* g_launch = nullptr;
Thread* g_cur = nullptr;
std::vector<Thread> g_threads;
std::vector<Warp> g_warps;
std::vector<char*> g_stacks;  // stack bottoms (above the guard page)
RunQueue g_queue;
Rng g_rng;
Stats g_stats;
uint64_t g_launch_count = 0;
char* g_window_lo = nullptr;  // the shared memory window: shared address 0
char* g_window_hi = nullptr;  // one past its end (a guard page follows)
std::vector<int32_t> g_word_owner;  // per 4 bytes of the window: the unpublished copy writing it, or -1
std::vector<Copy> g_copy_slab;
std::vector<int> g_free_copies;
std::vector<int> g_pending;  // copies that have not landed
std::vector<int> g_waited;   // copies waited for by their thread, not yet published by a barrier
bool g_trace = false;
std::atomic<bool> g_reported{false};
#if PRIMUS_EMU_ASM_SWITCH
void* g_sched_sp = nullptr;
#else
ucontext_t g_sched_uc;
#endif

uint64_t g_base_seed = [] {
  const char* e = std::getenv("PRIMUS_EMU_SEED");
  return e && *e ? std::strtoull(e, nullptr, 0) : uint64_t(1);
}();

// --------------------------------------------------------------------------- diagnostics

void print_context(FILE* f) {
  const Launch* L = g_launch;
  if (!L) {
    std::fprintf(f, "  (outside any kernel)\n");
  } else {
    std::fprintf(f, "  kernel %s launched at %s:%d (launch #%llu of this process)\n    by %s\n", L->site.kernel,
                 L->site.file, L->site.line, (unsigned long long)L->number, L->site.caller);
    std::fprintf(f, "  grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of dynamic shared memory\n", L->cfg.grid.x,
                 L->cfg.grid.y, L->cfg.grid.z, L->cfg.block.x, L->cfg.block.y, L->cfg.block.z, L->cfg.smem);
    if (L->in_block) {
      std::fprintf(f, "  in block (%u, %u, %u)", g_block_idx.x, g_block_idx.y, g_block_idx.z);
      if (g_cur)
        std::fprintf(f, ", thread (%u, %u, %u) = warp %d lane %d", g_cur->idx.x, g_cur->idx.y, g_cur->idx.z,
                     g_cur->warp, g_cur->lane);
      std::fprintf(f, "\n");
    }
  }
  std::fprintf(f,
               "  emulated GPU schedule seed %llu: PRIMUS_EMU_SEED=%llu with the same test and arguments replays "
               "this run\n",
               (unsigned long long)g_base_seed, (unsigned long long)g_base_seed);
}

std::string lanes_str(unsigned m) {
  std::string s;
  for (int i = 0; i < 32;) {
    if (!(m >> i & 1)) {
      ++i;
      continue;
    }
    int j = i;
    while (j + 1 < 32 && (m >> (j + 1) & 1)) ++j;
    if (!s.empty()) s += ",";
    s += j > i ? std::to_string(i) + "-" + std::to_string(j) : std::to_string(i);
    i = j + 1;
  }
  return s.empty() ? "none" : s;
}

// --------------------------------------------------------------------------- the window

void init_window() {
  if (g_window_lo) return;
  const size_t total = kWindowBytes + 2 * kPage;
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) fatal("cannot map the emulated shared memory window");
  char* base = static_cast<char*>(m);
  mprotect(base, kPage, PROT_NONE);
  mprotect(base + kPage + kWindowBytes, kPage, PROT_NONE);
  g_window_lo = base + kPage;
  g_window_hi = g_window_lo + kWindowBytes;
  g_word_owner.assign(kWindowBytes / 4, -1);
}

void ensure_stacks(int n) {
  while (int(g_stacks.size()) < n) {
    void* m = mmap(nullptr, kStackBytes + kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) fatal("cannot map a stack for an emulated thread");
    mprotect(m, kPage, PROT_NONE);
    g_stacks.push_back(static_cast<char*>(m) + kPage);
  }
}

// ----------------------------------------------------------------------- context switches

void thread_main();

#if PRIMUS_EMU_ASM_SWITCH
void init_context(Thread& t, char* stack_bottom) {
  // The frame primus_emu_switch pops: r15, r14, r13, r12, rbx, rbp, return address; after the
  // `ret` the stack pointer is 16-byte aligned, as the trampoline's call needs.
  char* top = stack_bottom + kStackBytes;  // 16-byte aligned
  auto* sp = reinterpret_cast<uint64_t*>(top - 72);
  sp[0] = 0;                                                   // r15
  sp[1] = 0;                                                   // r14
  sp[2] = reinterpret_cast<uint64_t>(&thread_main);            // r13: what the trampoline calls
  sp[3] = 0;                                                   // r12
  sp[4] = 0;                                                   // rbx
  sp[5] = 0;                                                   // rbp
  sp[6] = reinterpret_cast<uint64_t>(&primus_emu_trampoline);  // return address
  t.sp = sp;
}
inline void switch_in(Thread& t) { primus_emu_switch(&g_sched_sp, t.sp); }
inline void switch_to(Thread& from, Thread& to) { primus_emu_switch(&from.sp, to.sp); }
inline void switch_to_scheduler(Thread& from) { primus_emu_switch(&from.sp, g_sched_sp); }
#else
void init_context(Thread& t, char* stack_bottom) {
  getcontext(&t.uc);
  t.uc.uc_stack.ss_sp = stack_bottom;
  t.uc.uc_stack.ss_size = kStackBytes;
  t.uc.uc_link = nullptr;
  makecontext(&t.uc, &thread_main, 0);
}
inline void switch_in(Thread& t) { swapcontext(&g_sched_uc, &t.uc); }
inline void switch_to(Thread& from, Thread& to) { swapcontext(&from.uc, &to.uc); }
inline void switch_to_scheduler(Thread& from) { swapcontext(&from.uc, &g_sched_uc); }
#endif

// ---------------------------------------------------------------------------------- cp.async

void land(int id) {
  Copy& c = g_copy_slab[size_t(id)];
  char* dst = g_window_lo + c.dst;
  if (c.src_size) std::memcpy(dst, c.src, c.src_size);  // the global read happens now
  if (c.src_size < c.cp_size) std::memset(dst + c.src_size, 0, c.cp_size - c.src_size);
  c.landed = true;
  const int last = g_pending.back();  // swap-remove from g_pending
  g_pending[size_t(c.pend_pos)] = last;
  g_copy_slab[size_t(last)].pend_pos = c.pend_pos;
  g_pending.pop_back();
  c.pend_pos = -1;
}

// The copy's thread waited for it: it has landed, and its thread may read it.
void mark_waited(int id) {
  Copy& c = g_copy_slab[size_t(id)];
  if (!c.landed) land(id);
  std::vector<int>& mine = g_threads[size_t(c.thread)].copies;
  const int mlast = mine.back();  // swap-remove from the thread's list
  mine[size_t(c.mine_pos)] = mlast;
  g_copy_slab[size_t(mlast)].mine_pos = c.mine_pos;
  mine.pop_back();
  c.mine_pos = -1;
  c.waited = true;
  g_waited.push_back(id);
}

void retire(int id) {
  const Copy& c = g_copy_slab[size_t(id)];
  for (uint32_t w = c.dst / 4; w < (c.dst + c.cp_size) / 4; ++w)
    if (g_word_owner[w] == id) g_word_owner[w] = -1;
  g_free_copies.push_back(id);
}

// A barrier completed: every copy waited for before it is visible to the whole block.
void publish_waited() {
  for (const int id : g_waited) retire(id);
  g_waited.clear();
}

// The block retires: copies nobody waited for still complete first.
void finish_copies() {
  while (!g_pending.empty()) land(g_pending[g_rng.below(uint32_t(g_pending.size()))]);
  for (Thread& t : g_threads)
    while (!t.copies.empty()) mark_waited(t.copies.back());
  publish_waited();
}

// ---------------------------------------------------------------------------- scheduling

// Makes `t` the running thread (its stack is switched to by the caller).
inline void dispatch(Thread& t) {
  if (!g_pending.empty() && g_rng.coin(g_launch->land_rate))
    land(g_pending[g_rng.below(uint32_t(g_pending.size()))]);
  g_cur = &t;
  g_thread_idx = &t.idx;
  t.st = St::kRunning;
  ++g_stats.switches;
}

// The running thread stops (it blocked, yielded or exited): the next runnable thread runs
// straight away on its own stack, or, when none is left, the scheduler (run_block) resumes.
// Returns when this thread is resumed.
void switch_out() {
  Thread& self = *g_cur;
  const int ti = g_queue.pop(g_rng);
  if (ti < 0) {
    g_cur = nullptr;
    g_thread_idx = nullptr;
    switch_to_scheduler(self);
    return;
  }
  Thread& next = g_threads[size_t(ti)];
  dispatch(next);
  if (&next != &self) switch_to(self, next);
}

// The running thread gives up the processor but stays runnable.
void yield_runnable() {
  Thread& t = *g_cur;
  t.st = St::kRunnable;
  g_queue.push(t.linear);
  switch_out();
}

void release(Thread& t) {
  t.st = St::kRunnable;
  g_queue.push(t.linear);
}

[[noreturn]] void deadlock() {
  const Launch& L = *g_launch;
  std::string why;
  char buf[512];
  int at_barrier = 0;
  for (const Thread& t : g_threads)
    if (t.st == St::kBarrier) ++at_barrier;
  if (at_barrier) {
    std::snprintf(buf, sizeof buf, "  %d of %d live threads wait at __syncthreads() at %s:%d\n", at_barrier, L.live,
                  L.barrier_file, L.barrier_line);
    why += buf;
  }
  for (int w = 0; w < L.nwarps; ++w) {
    const Warp& wp = g_warps[size_t(w)];
    if (!wp.rv.active) continue;
    const unsigned missing = wp.rv.mask & wp.existing & ~wp.exited & ~wp.rv.arrived;
    std::snprintf(buf, sizeof buf, "  warp %d: lanes %s wait in %s at %s:%d for lanes %s\n", w,
                  lanes_str(wp.rv.arrived).c_str(), op_name(wp.rv.op), wp.rv.file, wp.rv.line,
                  lanes_str(missing).c_str());
    why += buf;
  }
  fatal("deadlock: every live thread of the block is blocked (a __syncthreads() or warp collective that not all "
        "threads reach)\n%s",
        why.c_str());
}

void thread_main() {
  g_launch->body(g_launch->closure);
  // Exit.
  Launch& L = *g_launch;
  Thread& t = *g_cur;
  t.st = St::kExited;
  --L.live;
  L.any_exited = true;
  if (L.barrier_arrived > 0)
    fatal("thread exits while %d other threads wait at __syncthreads() at %s:%d: a barrier that not every thread "
          "of the block reaches",
          L.barrier_arrived, L.barrier_file, L.barrier_line);
  Warp& w = g_warps[size_t(t.warp)];
  const unsigned bit = 1u << t.lane;
  w.exited |= bit;
  Rendezvous& r = w.rv;
  if (r.active && (r.mask & bit)) {
    if (r.aligned)
      fatal("lane exits while lanes %s of its warp wait in %s at %s:%d (a .aligned instruction needs every lane)",
            lanes_str(r.arrived).c_str(), op_name(r.op), r.file, r.line);
    complete_if_ready(w);
  }
  switch_out();
  __builtin_unreachable();
}

void run_block(Launch& L, uint3 bidx) {
  g_block_idx = bidx;
  L.in_block = true;
  L.live = L.nthreads;
  L.any_exited = false;
  L.barrier_arrived = 0;
  // Uninitialised shared memory: all-ones bytes read as NaN in bf16, fp32 and fp64, and as -1.
  std::memset(L.static_low, 0xff, size_t(g_window_hi - L.static_low));
  const dim3 bd = L.cfg.block;
  for (int i = 0; i < L.nthreads; ++i) {
    Thread& t = g_threads[size_t(i)];
    t.linear = i;
    t.idx = uint3{unsigned(i) % bd.x, unsigned(i) / bd.x % bd.y, unsigned(i) / (bd.x * bd.y)};
    t.warp = i / 32;
    t.lane = i % 32;
    t.st = St::kRunnable;
    t.commits = 0;
    t.copies.clear();
    init_context(t, g_stacks[size_t(i)]);
  }
  for (int w = 0; w < L.nwarps; ++w) {
    Warp& wp = g_warps[size_t(w)];
    const int lanes = std::min(32, L.nthreads - 32 * w);
    wp.existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    wp.exited = 0;
    wp.rv = Rendezvous{};
  }
  // This block's policy.
  const uint32_t m = g_rng.below(10);
  const RunQueue::Mode mode = m < 4 ? RunQueue::kUniform : m < 8 ? RunQueue::kWarpPriority : RunQueue::kFifo;
  static const double kLandRates[] = {0.0, 0.01, 0.1, 0.5, 1.0};
  static const double kIssueRates[] = {0.0, 0.0, 0.1, 0.5};
  L.land_rate = kLandRates[g_rng.below(5)];
  L.land_at_issue = kIssueRates[g_rng.below(4)];
  L.yield_rate = g_rng.coin(0.5) ? 0.0 : 0.2;
  L.prio_swap_rate = mode == RunQueue::kWarpPriority ? (g_rng.coin(0.5) ? 0.0005 : 0.01) : 0.0;
  g_queue.reset(mode, L.nthreads, g_rng);
  for (int i = 0; i < L.nthreads; ++i) g_queue.push(i);

  // Threads hand over to each other (switch_out); control comes back here when none is runnable.
  const int first = g_queue.pop(g_rng);
  dispatch(g_threads[size_t(first)]);
  switch_in(g_threads[size_t(first)]);
  if (L.live > 0) deadlock();
  finish_copies();
  L.in_block = false;
  ++g_stats.blocks;
}

// ------------------------------------------------------------------------ warp collectives

void compute_shfl(Rendezvous& r);
void compute_ldmatrix(Rendezvous& r, int num, bool trans, int warp);
void compute_mma(Rendezvous& r);

void complete_if_ready(Warp& w) {
  Rendezvous& r = w.rv;
  const unsigned required = r.mask & w.existing & ~w.exited;
  if ((r.arrived & required) != required) return;
  const int warp = int(&w - g_warps.data());
  switch (r.op) {
    case kOpShflUp:
    case kOpShflDown:
    case kOpShflBfly:
    case kOpShflIdx: compute_shfl(r); break;
    case kOpSyncwarp: break;
    case kOpLdm1: compute_ldmatrix(r, 1, false, warp); break;
    case kOpLdm2: compute_ldmatrix(r, 2, false, warp); break;
    case kOpLdm4: compute_ldmatrix(r, 4, false, warp); break;
    case kOpLdm1T: compute_ldmatrix(r, 1, true, warp); break;
    case kOpLdm2T: compute_ldmatrix(r, 2, true, warp); break;
    case kOpLdm4T: compute_ldmatrix(r, 4, true, warp); break;
    case kOpMma: compute_mma(r); break;
  }
  r.active = false;
  const int base = warp * 32;
  const Launch& L = *g_launch;
  if (L.prio_swap_rate > 0 && g_rng.coin(L.prio_swap_rate))
    g_queue.swap_warps(base / 32, int(g_rng.below(uint32_t(L.nwarps))), L.nthreads);
  for (int l = 0; l < 32; ++l)
    if (r.arrived >> l & 1) release(g_threads[size_t(base + l)]);
}

void check_in_kernel(const char* what, const char* file, int line) {
  if (!g_cur) fatal("%s at %s:%d called outside a kernel (host code)", what, file, line);
}

// The running lane joins its warp's collective `op` over `mask`; returns once every lane of the
// mask that has not exited has joined and the operation is done.
void warp_collective(int op, unsigned mask, bool aligned, void* args, const char* file, int line) {
  Thread& t = *g_cur;
  Warp& w = g_warps[size_t(t.warp)];
  const unsigned bit = 1u << t.lane;
  Rendezvous& r = w.rv;
  if (!(mask & bit))
    fatal("%s at %s:%d: the calling lane %d is not in the member mask 0x%08x", op_name(op), file, line, t.lane, mask);
  if (aligned && (w.exited || w.existing != 0xffffffffu))
    fatal("%s at %s:%d: a .aligned warp instruction needs all 32 lanes; lanes %s have exited or do not exist",
          op_name(op), file, line, lanes_str(~w.existing | w.exited).c_str());
  if (r.active) {
    const bool same_site = r.line == line && (r.file == file || std::strcmp(r.file, file) == 0);
    if (r.op != op || r.mask != mask || (aligned && !same_site))
      fatal("divergent warp collectives: lane %d calls %s (mask 0x%08x) at %s:%d while lanes %s wait in %s (mask "
            "0x%08x) at %s:%d",
            t.lane, op_name(op), mask, file, line, lanes_str(r.arrived).c_str(), op_name(r.op), r.mask, r.file,
            r.line);
  } else {
    r.active = true;
    r.aligned = aligned;
    r.op = op;
    r.mask = mask;
    r.arrived = 0;
    r.file = file;
    r.line = line;
  }
  r.arrived |= bit;
  r.args[t.lane] = args;
  t.st = St::kWarp;
  complete_if_ready(w);
  switch_out();
}

struct ShflArgs {
  uint64_t value, result;
  unsigned size;
  int b, c;
};

void compute_shfl(Rendezvous& r) {
  const int mode = r.op - kOpShflUp;
  const ShflArgs* first = nullptr;
  for (int lane = 0; lane < 32; ++lane) {
    if (!(r.arrived >> lane & 1)) continue;
    auto& a = *static_cast<ShflArgs*>(r.args[lane]);
    if (!first) first = &a;
    if (a.size != first->size || a.c != first->c)
      fatal("%s at %s:%d: the lanes of one shuffle disagree on the value size (%u, %u bytes) or width (c = 0x%x, 0x%x)",
            op_name(r.op), r.file, r.line, first->size, a.size, unsigned(first->c), unsigned(a.c));
    const int bval = a.b & 31, cval = a.c & 31, segmask = (a.c >> 8) & 31;
    const int max_lane = (lane & segmask) | (cval & ~segmask), min_lane = lane & segmask;
    int j = lane;
    bool ok = false;
    switch (mode) {
      case kShflUp: j = lane - bval; ok = j >= max_lane; break;
      case kShflDown: j = lane + bval; ok = j <= max_lane; break;
      case kShflBfly: j = lane ^ bval; ok = j <= max_lane; break;
      case kShflIdx: j = min_lane | (bval & ~segmask); ok = j <= max_lane; break;
    }
    if (!ok) j = lane;
    if (!(r.arrived >> j & 1))
      fatal("%s at %s:%d: lane %d reads lane %d, which does not take part (an undefined value on a GPU)",
            op_name(r.op), r.file, r.line, lane, j);
    a.result = static_cast<ShflArgs*>(r.args[j])->value;
  }
  ++g_stats.shfl;
}

struct LdmArgs {
  uint32_t addr;
  uint32_t* r[4];
};

uint16_t smem_u16(uint32_t addr) {
  uint16_t v;
  std::memcpy(&v, g_window_lo + addr, 2);
  return v;
}

// A read of shared memory by `reader` (a thread of the block) through an emulated instruction.
void check_smem_read(uint32_t addr, uint32_t bytes, const char* what, const char* file, int line, int reader) {
  const uint32_t lo = uint32_t(g_launch->static_low - g_window_lo);
  if (addr < lo || uint64_t(addr) + bytes > kWindowBytes)
    fatal("%s at %s:%d: thread %d reads shared address 0x%x (+%u bytes), outside the block's shared memory "
          "[0x%x, 0x%zx)",
          what, file, line, reader, addr, bytes, lo, kWindowBytes);
  for (uint32_t w = addr / 4; w < (addr + bytes + 3) / 4; ++w) {
    const int owner = g_word_owner[w];
    if (owner < 0) continue;
    const Copy& c = g_copy_slab[size_t(owner)];
    if (c.waited && c.thread == reader) continue;  // a thread sees its own copies after its wait
    if (!c.waited)
      fatal("%s at %s:%d: thread %d reads shared address 0x%x, which a cp.async of thread %d is writing and that "
            "thread has not waited for (missing cp.async.wait_group)",
            what, file, line, reader, w * 4, c.thread);
    fatal("%s at %s:%d: thread %d reads shared address 0x%x, written by a cp.async that thread %d waited for but "
          "no __syncthreads() has published since (missing barrier)",
          what, file, line, reader, w * 4, c.thread);
  }
}

void compute_ldmatrix(Rendezvous& r, int num, bool trans, int warp) {
  uint32_t addr[32];
  for (int l = 0; l < 32; ++l) addr[l] = static_cast<LdmArgs*>(r.args[l])->addr;
  for (int i = 0; i < num; ++i) {
    int hits[8] = {};
    for (int k = 0; k < 8; ++k) {
      const int l = 8 * i + k;
      if (addr[l] % 16)
        fatal("%s at %s:%d: lane %d gives row address 0x%x, not 16-byte aligned", op_name(r.op), r.file, r.line, l,
              addr[l]);
      check_smem_read(addr[l], 16, op_name(r.op), r.file, r.line, 32 * warp + l);
      ++hits[(addr[l] / 16) % 8];
    }
    ++g_stats.ldmatrix_phases;
    g_stats.ldmatrix_conflicts += uint64_t(*std::max_element(hits, hits + 8) - 1);
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    auto& a = *static_cast<LdmArgs*>(r.args[l]);
    for (int i = 0; i < num; ++i) {
      uint16_t lo, hi;
      if (!trans) {  // row g, columns 2t and 2t+1 of matrix i
        lo = smem_u16(addr[8 * i + g] + 4 * t);
        hi = smem_u16(addr[8 * i + g] + 4 * t + 2);
      } else {  // column g, rows 2t and 2t+1 of matrix i
        lo = smem_u16(addr[8 * i + 2 * t] + 2 * g);
        hi = smem_u16(addr[8 * i + 2 * t + 1] + 2 * g);
      }
      *a.r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
}

struct MmaArgs {
  uint32_t a[4], b[2];
  float c[4];
  float* d[4];
};

inline float bf16_bits_to_float(uint32_t h) {
  const uint32_t u = h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void compute_mma(Rendezvous& r) {
  // PTX ISA, mma.m16n8k16 with .bf16 A/B and .f32 C/D (lane = 4g + t):
  //   A element a_i (i = 0..7, two per register): row g + 8*((i >> 1) & 1), column 2t + (i & 1) + 8*(i >> 2)
  //   B element b_i (i = 0..3): row (k) 2t + (i & 1) + 8*(i >> 1), column (n) g
  //   C/D element c_i (i = 0..3): row g + 8*(i >> 1), column 2t + (i & 1)
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const auto& m = *static_cast<const MmaArgs*>(r.args[l]);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 8; ++i) {
      const uint32_t reg = m.a[i >> 1];
      A[g + 8 * ((i >> 1) & 1)][2 * t + (i & 1) + 8 * (i >> 2)] = bf16_bits_to_float(i & 1 ? reg >> 16 : reg & 0xffff);
    }
    for (int i = 0; i < 4; ++i) {
      const uint32_t reg = m.b[i >> 1];
      B[2 * t + (i & 1) + 8 * (i >> 1)][g] = bf16_bits_to_float(i & 1 ? reg >> 16 : reg & 0xffff);
    }
    for (int i = 0; i < 4; ++i) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = m.c[i];
  }
  // bf16 x bf16 products are exact in fp32; they are summed in k order in fp32 onto C (the
  // tensor core's own summation order and internal precision are not modelled).
  float D[16][8];
  for (int i = 0; i < 16; ++i) {
    float acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = C[i][j];
    for (int k = 0; k < 16; ++k)
      for (int j = 0; j < 8; ++j) acc[j] = std::fma(A[i][k], B[k][j], acc[j]);
    for (int j = 0; j < 8; ++j) D[i][j] = acc[j];
  }
  for (int l = 0; l < 32; ++l) {
    const auto& m = *static_cast<const MmaArgs*>(r.args[l]);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) *m.d[i] = D[g + 8 * (i >> 1)][2 * t + (i & 1)];
  }
  ++g_stats.mma;
}

void ldmatrix(int op, int num, uint32_t** out, uint32_t addr, const char* file, int line) {
  check_in_kernel(op_name(op), file, line);
  LdmArgs a{addr, {out[0], num > 1 ? out[1] : nullptr, num > 2 ? out[2] : nullptr, num > 3 ? out[3] : nullptr}};
  warp_collective(op, 0xffffffffu, true, &a, file, line);
}

void cp_async(const char* name, uint32_t dst, const void* src, int cp_size, int src_size, bool cg, const char* file,
              int line) {
  check_in_kernel(name, file, line);
  Launch& L = *g_launch;
  if (cg ? cp_size != 16 : (cp_size != 4 && cp_size != 8 && cp_size != 16))
    fatal("%s: cp-size %d is not allowed", name, cp_size);
  if (src_size < 0 || src_size > cp_size)
    fatal("%s: src-size %d outside [0, cp-size %d]", name, src_size, cp_size);
  const uint32_t lo = uint32_t(L.static_low - g_window_lo);
  if (dst % uint32_t(cp_size) || dst < lo || uint64_t(dst) + uint32_t(cp_size) > kWindowBytes)
    fatal("%s: shared destination 0x%x is misaligned or outside the block's shared memory [0x%x, 0x%zx)", name, dst,
          lo, kWindowBytes);
  if (reinterpret_cast<uintptr_t>(src) % uintptr_t(cp_size))
    fatal("%s: global source %p is not %d-byte aligned", name, src, cp_size);
  if (src_size > 0 && !find_allocation(src, size_t(src_size)))
    fatal("%s: global source [%p, +%d) is not inside any device allocation", name, src, src_size);
  Thread& t = *g_cur;
  for (uint32_t w = dst / 4; w < (dst + uint32_t(cp_size)) / 4; ++w) {
    const int owner = g_word_owner[w];
    if (owner < 0) continue;
    const Copy& o = g_copy_slab[size_t(owner)];
    if (!(o.waited && o.thread == t.linear))  // (a thread's own, waited-for copy is complete)
      fatal("%s at %s:%d: shared address 0x%x is still being written by an earlier cp.async of thread %d that is "
            "%s (a write-write race)",
            name, file, line, w * 4, o.thread, o.waited ? "not yet published by a barrier" : "not waited for");
  }
  int id;
  if (!g_free_copies.empty()) {
    id = g_free_copies.back();
    g_free_copies.pop_back();
  } else {
    id = int(g_copy_slab.size());
    g_copy_slab.emplace_back();
  }
  Copy& c = g_copy_slab[size_t(id)];
  for (uint32_t w = dst / 4; w < (dst + uint32_t(cp_size)) / 4; ++w) g_word_owner[w] = id;
  c.dst = dst;
  c.cp_size = uint32_t(cp_size);
  c.src_size = uint32_t(src_size);
  c.src = src;
  c.group = t.commits;  // the group the next commit closes
  c.thread = t.linear;
  c.landed = c.waited = false;
  c.pend_pos = int(g_pending.size());
  g_pending.push_back(id);
  c.mine_pos = int(t.copies.size());
  t.copies.push_back(id);
  ++g_stats.copies;
  if (g_rng.coin(L.land_at_issue)) land(id);
  if (g_rng.coin(L.yield_rate)) yield_runnable();
}

}  // namespace

// ================================================================================ the API

void fatal(const char* fmt, ...) {
  g_reported = true;
  std::fflush(stdout);
  std::fprintf(stderr, "\nemulated GPU: error: ");
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n");
  print_context(stderr);
  std::fflush(stderr);
  std::abort();
}

void launch(const LaunchSite& site, const void* kernel, const LaunchConfig& cfg, Body body, void* closure) {
  std::lock_guard<std::recursive_mutex> lock(g_mutex);
  if (g_launch) fatal("kernel %s launched from inside a kernel (dynamic parallelism is not emulated)", site.kernel);
  const dim3 g = cfg.grid, b = cfg.block;
  const uint64_t threads = uint64_t(b.x) * b.y * b.z;
  cudaError_t err = cudaSuccess;
  if (g.x < 1 || g.x > 0x7fffffffu || g.y < 1 || g.y > 65535 || g.z < 1 || g.z > 65535 || b.x < 1 || b.x > 1024 ||
      b.y < 1 || b.y > 1024 || b.z < 1 || b.z > 64 || threads > 1024)
    err = cudaErrorInvalidConfiguration;
  else if (cfg.smem > max_dynamic_smem(kernel))
    err = cudaErrorInvalidValue;  // more dynamic shared memory than cudaFuncSetAttribute allowed
  else if (!valid_stream(cfg.stream))
    err = cudaErrorInvalidResourceHandle;
  if (err != cudaSuccess) {
    if (g_trace)
      std::fprintf(stderr, "emu: launch of %s at %s:%d refused: %s\n", site.kernel, site.file, site.line,
                   cudaGetErrorName(err));
    set_last_error(err);
    return;
  }
  const uint64_t nblocks = uint64_t(g.x) * g.y * g.z;
  if (nblocks > (uint64_t(1) << 26)) fatal("kernel %s: %llu blocks are too many to emulate", site.kernel,
                                           (unsigned long long)nblocks);
  if (g_launch_count == 0)
    std::printf("[ emulated ] GPU emulation (tests/emulated), schedule seed %llu (PRIMUS_EMU_SEED)\n",
                (unsigned long long)g_base_seed);
  init_window();
  Launch L;
  L.site = site;
  L.kernel = kernel;
  L.cfg = cfg;
  L.body = body;
  L.closure = closure;
  L.number = ++g_launch_count;
  L.seed = mix(g_base_seed, L.number);
  L.nthreads = int(threads);
  L.nwarps = int((threads + 31) / 32);
  L.dyn_bytes = cfg.smem;
  L.dyn_base = g_window_hi - round_up(cfg.smem, 128);
  L.static_low = L.dyn_base;
  g_rng = Rng(L.seed);
  ensure_stacks(L.nthreads);
  if (g_threads.size() < size_t(L.nthreads)) g_threads.resize(size_t(L.nthreads));
  if (g_warps.size() < size_t(L.nwarps)) g_warps.resize(size_t(L.nwarps));
  g_block_dim = b;
  g_grid_dim = g;
  g_launch = &L;
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t sw0 = g_stats.switches;
  // Blocks in a random order.
  std::vector<uint32_t> order(nblocks);
  for (uint32_t i = 0; i < nblocks; ++i) order[i] = i;
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[g_rng.below(uint32_t(i))]);
  for (const uint32_t lin : order) run_block(L, uint3{lin % g.x, lin / g.x % g.y, lin / (g.x * g.y)});
  g_launch = nullptr;
  ++g_stats.launches;
  g_stats.threads += nblocks * threads;
  if (g_trace) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "emu: #%llu %s at %s:%d grid (%u,%u,%u) block (%u,%u,%u) smem %zu: %.1f ms, %llu switches\n",
                 (unsigned long long)L.number, site.kernel, site.file, site.line, g.x, g.y, g.z, b.x, b.y, b.z,
                 cfg.smem, ms, (unsigned long long)(g_stats.switches - sw0));
  }
}

void* dynamic_shared(size_t align) {
  if (!g_launch || !g_cur) fatal("extern __shared__ memory used outside a kernel");
  if (reinterpret_cast<uintptr_t>(g_launch->dyn_base) % align)
    fatal("extern __shared__ with alignment %zu: the emulation aligns dynamic shared memory to 128 bytes", align);
  return g_launch->dyn_base;
}

void* static_shared(const void* key, size_t bytes, size_t align) {
  if (!g_launch || !g_cur) fatal("__shared__ variable used outside a kernel");
  Launch& L = *g_launch;
  for (const auto& [k, p] : L.statics)
    if (k == key) return p;
  char* p = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(L.static_low) - bytes) / align * align);
  const size_t static_bytes = size_t(L.dyn_base - p);
  if (static_bytes > kStaticSmemMax)
    fatal("%zu bytes of static __shared__ memory: more than the 48 KB a block may declare", static_bytes);
  if (static_bytes + L.dyn_bytes > kMaxSmemPerBlockOptin)
    fatal("%zu bytes of static and %zu of dynamic shared memory: more than the %zu bytes a block may use",
          static_bytes, L.dyn_bytes, kMaxSmemPerBlockOptin);
  std::memset(p, 0xff, size_t(L.static_low - p));
  L.static_low = p;
  L.statics.emplace_back(key, p);
  return p;
}

void syncthreads(const char* file, int line) {
  check_in_kernel("__syncthreads()", file, line);
  Launch& L = *g_launch;
  Thread& t = *g_cur;
  if (L.any_exited) {
    int exited = 0;
    for (int i = 0; i < L.nthreads; ++i) exited += g_threads[size_t(i)].st == St::kExited;
    fatal("__syncthreads() at %s:%d after %d threads of the block have exited: a barrier that not every thread "
          "reaches",
          file, line, exited);
  }
  if (L.barrier_arrived == 0) {
    L.barrier_file = file;
    L.barrier_line = line;
  } else if (L.barrier_line != line || (L.barrier_file != file && std::strcmp(L.barrier_file, file) != 0)) {
    fatal("threads of one block wait at different __syncthreads(): this one at %s:%d, %d others at %s:%d", file,
          line, L.barrier_arrived, L.barrier_file, L.barrier_line);
  }
  ++L.barrier_arrived;
  t.st = St::kBarrier;
  if (L.barrier_arrived == L.live) {
    L.barrier_arrived = 0;
    publish_waited();
    for (int i = 0; i < L.nthreads; ++i)
      if (g_threads[size_t(i)].st == St::kBarrier) release(g_threads[size_t(i)]);
    ++g_stats.barriers;
  }
  if (L.prio_swap_rate > 0 && g_rng.coin(L.prio_swap_rate * 10))
    g_queue.swap_warps(t.warp, int(g_rng.below(uint32_t(L.nwarps))), L.nthreads);
  switch_out();
}

void syncwarp(unsigned mask, const char* file, int line) {
  check_in_kernel("__syncwarp()", file, line);
  warp_collective(kOpSyncwarp, mask, false, nullptr, file, line);
}

int shfl_width_c(int width, bool clamp_all, const char* file, int line) {
  if (width < 1 || width > 32 || (width & (width - 1)))
    fatal("shuffle at %s:%d: width %d is not a power of two in [1, 32]", file, line, width);
  return ((32 - width) << 8) | (clamp_all ? 0x1f : 0);
}

uint64_t shfl(ShflMode mode, unsigned mask, uint64_t value, unsigned size, int b, int c, const char* file, int line) {
  check_in_kernel("a warp shuffle", file, line);
  ShflArgs a{value, 0, size, b, c};
  warp_collective(kOpShflUp + int(mode), mask, false, &a, file, line);
  return a.result;
}

void check_global(const void* p, size_t bytes, size_t align, const char* what, const char* file, int line) {
  if (reinterpret_cast<uintptr_t>(p) % align)
    fatal("%s at %s:%d: address %p is not %zu-byte aligned (a misaligned access faults on a GPU)", what, file, line,
          p, align);
  if (!find_allocation(p, bytes))
    fatal("%s at %s:%d: [%p, +%zu bytes) is not inside any device allocation", what, file, line, p, bytes);
}

void check_atomic(const void* p, size_t bytes, const char* file, int line) {
  if (reinterpret_cast<uintptr_t>(p) % bytes)
    fatal("atomic at %s:%d: address %p is not %zu-byte aligned", file, line, p, bytes);
  const char* c = static_cast<const char*>(p);
  if (g_launch && c >= g_launch->static_low && c + bytes <= g_window_hi) return;  // shared memory
  if (!find_allocation(p, bytes))
    fatal("atomic at %s:%d: [%p, +%zu bytes) is neither shared memory nor inside a device allocation", file, line, p,
          bytes);
}

}  // namespace emu::detail

// ======================================================================== CUDA intrinsics

size_t __cvta_generic_to_shared(const void* p) {
  using namespace emu::detail;
  const char* c = static_cast<const char*>(p);
  if (!g_launch || c < g_window_lo || c > g_window_hi)
    fatal("__cvta_generic_to_shared(%p): not a shared memory address", p);
  return size_t(c - g_window_lo);
}

namespace emu::ptx {
using namespace emu::detail;

void cp_async_cg_shared_global(uint32_t dst, const void* src, int cp_size, int src_size, const char* file, int line) {
  cp_async("cp.async.cg.shared.global", dst, src, cp_size, src_size, true, file, line);
}
void cp_async_ca_shared_global(uint32_t dst, const void* src, int cp_size, int src_size, const char* file, int line) {
  cp_async("cp.async.ca.shared.global", dst, src, cp_size, src_size, false, file, line);
}
void cp_async_commit_group(const char* file, int line) {
  check_in_kernel("cp.async.commit_group", file, line);
  ++g_cur->commits;
  if (g_rng.coin(g_launch->yield_rate)) yield_runnable();
}
void cp_async_wait_group(int n, const char* file, int line) {
  check_in_kernel("cp.async.wait_group", file, line);
  if (n < 0) fatal("cp.async.wait_group %d", n);
  Thread& t = *g_cur;
  // Every committed group but the n most recent ones must have landed.
  const uint64_t limit = t.commits > uint64_t(n) ? t.commits - uint64_t(n) : 0;
  for (size_t i = t.copies.size(); i-- > 0;) {
    if (i >= t.copies.size()) continue;
    const int id = t.copies[i];
    if (g_copy_slab[size_t(id)].group < limit) mark_waited(id);
  }
  if (g_rng.coin(0.5)) yield_runnable();
}
void cp_async_wait_all(const char* file, int line) {
  check_in_kernel("cp.async.wait_all", file, line);
  Thread& t = *g_cur;
  while (!t.copies.empty()) mark_waited(t.copies.back());
  if (g_rng.coin(0.5)) yield_runnable();
}

void ldmatrix_sync_aligned_m8n8_x1_shared_b16(uint32_t& r0, uint32_t addr, const char* file, int line) {
  uint32_t* out[4] = {&r0};
  ldmatrix(kOpLdm1, 1, out, addr, file, line);
}
void ldmatrix_sync_aligned_m8n8_x2_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t addr, const char* file, int line) {
  uint32_t* out[4] = {&r0, &r1};
  ldmatrix(kOpLdm2, 2, out, addr, file, line);
}
void ldmatrix_sync_aligned_m8n8_x4_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr,
                                              const char* file, int line) {
  uint32_t* out[4] = {&r0, &r1, &r2, &r3};
  ldmatrix(kOpLdm4, 4, out, addr, file, line);
}
void ldmatrix_sync_aligned_m8n8_x1_trans_shared_b16(uint32_t& r0, uint32_t addr, const char* file, int line) {
  uint32_t* out[4] = {&r0};
  ldmatrix(kOpLdm1T, 1, out, addr, file, line);
}
void ldmatrix_sync_aligned_m8n8_x2_trans_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t addr, const char* file,
                                                    int line) {
  uint32_t* out[4] = {&r0, &r1};
  ldmatrix(kOpLdm2T, 2, out, addr, file, line);
}
void ldmatrix_sync_aligned_m8n8_x4_trans_shared_b16(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                                    uint32_t addr, const char* file, int line) {
  uint32_t* out[4] = {&r0, &r1, &r2, &r3};
  ldmatrix(kOpLdm4T, 4, out, addr, file, line);
}

void mma_sync_aligned_m16n8k16_row_col_f32_bf16_bf16_f32(float& d0, float& d1, float& d2, float& d3, uint32_t a0,
                                                         uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                         uint32_t b1, float c0, float c1, float c2, float c3,
                                                         const char* file, int line) {
  check_in_kernel("mma.sync", file, line);
  MmaArgs m{{a0, a1, a2, a3}, {b0, b1}, {c0, c1, c2, c3}, {&d0, &d1, &d2, &d3}};
  warp_collective(kOpMma, 0xffffffffu, true, &m, file, line);
}

// ex2.approx.f32: 2^a with at most 2 ulp of error on a GPU (here: the correctly rounded value);
// 2^-inf = +0, 2^+inf = +inf, NaN stays NaN. .ftz flushes subnormal inputs and results to +-0.
void ex2_approx_f32(float& d, float a, const char* file, int line) { d = std::exp2(a); }
void ex2_approx_ftz_f32(float& d, float a, const char* file, int line) {
  if (std::fpclassify(a) == FP_SUBNORMAL) a = std::copysign(0.0f, a);
  float y = std::exp2(a);
  if (std::fpclassify(y) == FP_SUBNORMAL) y = std::copysign(0.0f, y);
  d = y;
}

}  // namespace emu::ptx

// ========================================================= crash reports and statistics

namespace {

char g_altstack[64 * 1024];

void on_fault(int sig, siginfo_t* info, void*) {
  using namespace emu::detail;
  const char* addr = static_cast<const char*>(info->si_addr);
  if (!g_reported.exchange(true)) {
    std::fprintf(stderr, "\nemulated GPU: %s at address %p", sig == SIGSEGV ? "segmentation fault" : "bus error",
                 static_cast<const void*>(addr));
    const char* base = nullptr;
    size_t size = 0;
    if (g_window_hi && addr >= g_window_hi && addr < g_window_hi + kPage) {
      std::fprintf(stderr, ": past the end of the block's shared memory (%zu bytes of dynamic shared memory)",
                   g_launch ? g_launch->dyn_bytes : size_t(0));
    } else if (g_window_lo && addr >= g_window_lo - kPage && addr < g_window_lo) {
      std::fprintf(stderr, ": before the start of the shared memory window");
    } else if (in_allocation_guard(addr, &base, &size)) {
      std::fprintf(stderr, ": past the end of the device allocation [%p, +%zu bytes)", static_cast<const void*>(base),
                   size);
    } else {
      for (char* s : g_stacks)
        if (addr >= s - kPage && addr < s) std::fprintf(stderr, ": stack overflow of an emulated thread");
    }
    std::fprintf(stderr, "\n");
    if (g_launch) print_context(stderr);
    std::fflush(stderr);
  }
  signal(sig, SIG_DFL);  // returning re-executes the access, which now kills the process
}

void on_abort(int) {
  using namespace emu::detail;
  if (g_launch && !g_reported.exchange(true)) {  // e.g. a sanitizer's report from kernel code
    std::fprintf(stderr, "\nemulated GPU: aborted inside a kernel\n");
    print_context(stderr);
    std::fflush(stderr);
  }
  signal(SIGABRT, SIG_DFL);
  raise(SIGABRT);
}

void print_stats() {
  using namespace emu::detail;
  const Stats& s = g_stats;
  std::fprintf(stderr,
               "emu: %llu launches, %llu blocks, %llu threads, %llu switches, %llu barriers, %llu shuffles, %llu "
               "mma, %llu cp.async; ldmatrix: %llu phases, %llu bank conflicts\n",
               (unsigned long long)s.launches, (unsigned long long)s.blocks, (unsigned long long)s.threads,
               (unsigned long long)s.switches, (unsigned long long)s.barriers, (unsigned long long)s.shfl,
               (unsigned long long)s.mma, (unsigned long long)s.copies, (unsigned long long)s.ldmatrix_phases,
               (unsigned long long)s.ldmatrix_conflicts);
}

struct Init {
  Init() {
    using namespace emu::detail;
    stack_t ss{};
    ss.ss_sp = g_altstack;
    ss.ss_size = sizeof g_altstack;
    sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
    signal(SIGABRT, on_abort);
    const char* t = std::getenv("PRIMUS_EMU_TRACE");
    g_trace = t && *t && *t != '0';
    const char* st = std::getenv("PRIMUS_EMU_STATS");
    if (g_trace || (st && *st && *st != '0')) std::atexit(print_stats);
  }
} g_init;

}  // namespace

// UBSan's reports from kernel code (misaligned or out-of-bounds accesses) end in abort(), so that
// the handler above adds the kernel, block, thread and seed.
extern "C" const char* __ubsan_default_options() { return "abort_on_error=1:print_stacktrace=1"; }
