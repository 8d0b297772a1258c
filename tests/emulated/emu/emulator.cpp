// The GPU emulator: launches, the thread scheduler of the resident blocks, barriers, warp
// collectives, cp.async, the shared memory windows, the PTX instructions the kernels use, and the
// hooks through which kernel code's memory accesses reach the checks of memory.cpp.
// What is modelled and what is not: docs/cuda.md, "Emulated GPU tests in CI".
//
// Launches. A launch is checked as a GPU checks it (errors reach cudaGetLastError at once) and
// queued on its stream (streams.cpp); it runs when the executor reaches it.
//
// Threads. Each CUDA thread of a resident block is a user-level thread with its own stack (a
// register of the kernel is a local of that stack). A thread runs until it reaches a point where
// CUDA threads interact (a barrier, a warp collective, a cp.async instruction) or, in the
// interleaved mode below, a memory access, and then hands control to the next thread the
// scheduler picks at random.
//
// Blocks. A launch keeps 1 to 4 blocks resident at once (drawn per launch, or PRIMUS_EMU_CTAS),
// each in its own shared memory window; when one retires the next, in a random order, takes its
// place, as CTAs fill a GPU's SMs. With several resident blocks, threads also switch at a random
// share of their global and shared memory accesses, so the warps of different blocks interleave
// at memory operations and a read-modify-write without an atomic can lose an update. Whatever the
// schedule, every global access is recorded in memory.cpp's shadow: two blocks of one launch
// touching the same bytes, one of them writing and not both atomically, is reported as a race.
//
// Randomness: every launch derives its own seed from PRIMUS_EMU_SEED (default 1) and its launch
// number, and draws its resident blocks, its switch rate at memory accesses and per block a
// scheduling policy (uniform random choice, random warp priorities with random changes, or FIFO)
// and cp.async landing rates from it. A failure message prints the seed; the same seed, test
// filter and binary replay the same schedules.
//
// Kernel code is compiled with GCC's -fsanitize=thread: every load and store calls the __tsan_*
// functions at the end of this file, which pass global and shared memory accesses to the checks
// (nothing of ThreadSanitizer's runtime is used).
#include "emu/emulator.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "emu/counters.h"
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

// ----------------------------------------------------------------------------------- state

constexpr size_t kPage = 4096;
constexpr size_t kStackBytes = 256 * 1024;  // per emulated thread, plus a guard page below
constexpr size_t kStaticSmemMax = 48 * 1024;
constexpr size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
constexpr size_t kWindowBytes = kStaticSmemMax + round_up(kMaxSmemPerBlockOptin, kPage);
constexpr int kMaxSlots = 4;  // blocks resident at once

enum class St : uint8_t { kRunnable, kRunning, kBarrier, kWarp, kExited };

struct Thread {
  uint3 idx{};
  int linear = 0;     // index over all resident blocks' threads: slot * slot_threads + thread
  int warp = 0;       // likewise over their warps
  int lane = 0, slot = 0;
  St st = St::kRunnable;
#if PRIMUS_EMU_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
  uint64_t commits = 0;     // cp.async groups committed
  std::vector<int> copies;  // this thread's cp.async copies not yet waited for
};

enum WarpOp : int {
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

// Threads ready to run. Three policies:
//  * uniform: any runnable thread, at random (fine-grained interleavings);
//  * warp priorities (PCT-like): each warp has a random rank and the runnable lane of the
//    highest-ranked warp runs (lanes in a random order), so one warp runs ahead until it blocks
//    at a barrier, with random rank swaps at synchronisation points: this exposes missing
//    barriers between warps, which lockstep-like schedules hide;
//  * FIFO: round-robin progress, like warps in lockstep.
// Thread t belongs to warp t / 32 (every resident block's threads start at a multiple of 32).
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
// 4-byte words it writes (its block's word_owner).
struct Copy {
  uint32_t dst = 0;
  uint32_t cp_size = 0, src_size = 0;
  const void* src = nullptr;
  uint64_t group = 0;
  int thread = 0, slot = 0;
  bool landed = false, waited = false;
  int pend_pos = -1;  // in g_pending while not landed
  int mine_pos = -1;  // in its thread's `copies` while not waited for
};

// A resident block: one slot of the launch, with its own shared memory window.
struct Block {
  char* window_lo = nullptr;  // shared address 0
  char* window_hi = nullptr;  // one past its end (a guard page follows)
  std::vector<int32_t> word_owner;  // per 4 bytes of the window: the unpublished copy writing it, or -1
  std::vector<int> waited;          // copies waited for by their thread, not yet published by a barrier
  bool active = false;
  uint3 idx{};
  uint32_t linear = 0;
  int live = 0;
  bool any_exited = false;
  int barrier_arrived = 0;
  const char* barrier_file = "";
  int barrier_line = 0;
  double land_rate = 0, land_at_issue = 0, yield_rate = 0, prio_swap_rate = 0;
};

struct Launch {
  LaunchSite site{};
  const void* kernel = nullptr;
  LaunchConfig cfg;
  Body body = nullptr;
  void* closure = nullptr;
  void (*destroy)(void*) = nullptr;
  uint64_t number = 0, seed = 0;
  int nthreads = 0, nwarps = 0, slot_threads = 0, slots = 1;
  double mem_switch = 0;  // chance of a thread switch at a memory access
  size_t dyn_bytes = 0;
  size_t dyn_off = 0;         // window offset of the dynamic shared memory
  size_t static_low_off = 0;  // window offset of the lowest static __shared__ object
  std::vector<std::pair<const void*, size_t>> statics;  // their offsets
};

struct Stats {
  uint64_t launches = 0, blocks = 0, threads = 0, switches = 0, copies = 0;
  uint64_t ldmatrix_phases = 0, ldmatrix_conflicts = 0, mma = 0, shfl = 0, barriers = 0;
  uint64_t max_resident = 0, memory_switches = 0;
};

// The launch being run and its resident blocks. Kernels run one at a time (the executor holds
// the streams' lock), on whichever OS thread the executor uses.
Launch* g_launch = nullptr;
Thread* g_cur = nullptr;
Block* g_blk = nullptr;     // the running thread's block
char* g_window_lo = nullptr;  // its window
char* g_window_hi = nullptr;
Block g_blocks[kMaxSlots];
std::vector<Thread> g_threads;
std::vector<Warp> g_warps;
std::vector<char*> g_stacks;  // stack bottoms (above the guard page)
RunQueue g_queue;
Rng g_rng;
Stats g_stats;
std::atomic<uint64_t> g_launch_count{0};
uint64_t g_switch_countdown = 0;
std::vector<Copy> g_copy_slab;
std::vector<int> g_free_copies;
std::vector<int> g_pending;  // copies that have not landed
bool g_trace = false;
std::atomic<bool> g_reported{false};
// True on the OS thread that runs a launch's blocks, while it does: the instrumentation ignores
// accesses elsewhere (host code in the kernel sources, which the same flags compile).
thread_local bool t_in_kernel = false;
#if PRIMUS_EMU_ASM_SWITCH
void* g_sched_sp = nullptr;
#else
ucontext_t g_sched_uc;
#endif

uint64_t g_base_seed = [] {
  const char* e = std::getenv("PRIMUS_EMU_SEED");
  return e && *e ? std::strtoull(e, nullptr, 0) : uint64_t(1);
}();
int g_max_slots = [] {
  const char* e = std::getenv("PRIMUS_EMU_CTAS");
  const int v = e && *e ? std::atoi(e) : 0;
  return v < 0 ? 0 : std::min(v, kMaxSlots);  // 0: drawn per launch
}();

// --------------------------------------------------------------------------- diagnostics

void print_context(FILE* f) {
  const Launch* L = g_launch;
  if (!L) {
    if (running_op()) std::fprintf(f, "  in %s\n", describe_op(running_op()).c_str());
  } else {
    std::fprintf(f, "  kernel %s launched at %s:%d (launch #%llu of this process)\n    by %s\n", L->site.kernel,
                 L->site.file, L->site.line, (unsigned long long)L->number, L->site.caller);
    std::fprintf(f, "  grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of dynamic shared memory, %d resident blocks\n",
                 L->cfg.grid.x, L->cfg.grid.y, L->cfg.grid.z, L->cfg.block.x, L->cfg.block.y, L->cfg.block.z,
                 L->cfg.smem, L->slots);
    if (g_blk) {
      std::fprintf(f, "  in block (%u, %u, %u)", g_blk->idx.x, g_blk->idx.y, g_blk->idx.z);
      if (g_cur) {
        const int local = g_cur->linear - g_cur->slot * L->slot_threads;
        std::fprintf(f, ", thread (%u, %u, %u) = warp %d lane %d", g_cur->idx.x, g_cur->idx.y, g_cur->idx.z,
                     local / 32, g_cur->lane);
      }
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

// ------------------------------------------------------------------ windows and stacks

void init_windows() {
  if (g_blocks[0].window_lo) return;
  for (Block& b : g_blocks) {
    const size_t total = kWindowBytes + 2 * kPage;
    void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) fatal("cannot map an emulated shared memory window");
    char* base = static_cast<char*>(m);
    mprotect(base, kPage, PROT_NONE);
    mprotect(base + kPage + kWindowBytes, kPage, PROT_NONE);
    b.window_lo = base + kPage;
    b.window_hi = b.window_lo + kWindowBytes;
    b.word_owner.assign(kWindowBytes / 4, -1);
  }
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
  char* dst = g_blocks[c.slot].window_lo + c.dst;
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
  g_blocks[c.slot].waited.push_back(id);
}

void retire(int id) {
  const Copy& c = g_copy_slab[size_t(id)];
  std::vector<int32_t>& owner = g_blocks[c.slot].word_owner;
  for (uint32_t w = c.dst / 4; w < (c.dst + c.cp_size) / 4; ++w)
    if (owner[w] == id) owner[w] = -1;
  g_free_copies.push_back(id);
}

// A barrier of block `b` completed: every copy waited for before it is visible to the whole block.
void publish_waited(Block& b) {
  for (const int id : b.waited) retire(id);
  b.waited.clear();
}

// The block in `slot` retires: copies nobody waited for still complete first.
void finish_copies(int slot) {
  for (size_t i = g_pending.size(); i-- > 0;)
    if (i < g_pending.size() && g_copy_slab[size_t(g_pending[i])].slot == slot) land(g_pending[i]);
  const Launch& L = *g_launch;
  for (int i = 0; i < L.nthreads; ++i) {
    Thread& t = g_threads[size_t(slot * L.slot_threads + i)];
    while (!t.copies.empty()) mark_waited(t.copies.back());
  }
  publish_waited(g_blocks[slot]);
}

// ---------------------------------------------------------------------------- scheduling

// Makes `t` the running thread (its stack is switched to by the caller).
inline void dispatch(Thread& t) {
  Block& b = g_blocks[t.slot];
  if (!g_pending.empty() && g_rng.coin(b.land_rate)) land(g_pending[g_rng.below(uint32_t(g_pending.size()))]);
  g_cur = &t;
  g_thread_idx = &t.idx;
  g_blk = &b;
  g_block_idx = b.idx;
  g_window_lo = b.window_lo;
  g_window_hi = b.window_hi;
  t.st = St::kRunning;
  ++g_stats.switches;
}

// The running thread stops (it blocked, yielded or exited): the next runnable thread runs
// straight away on its own stack, or, when none is left, the scheduler (run_launch) resumes.
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

// A thread switch at a memory access, at the launch's rate (interleaved mode).
inline void maybe_switch_at_access() {
  if (g_launch->mem_switch <= 0 || --g_switch_countdown > 0) return;
  g_switch_countdown = 1 + g_rng.below(uint32_t(2.0 / g_launch->mem_switch));
  ++g_stats.memory_switches;
  yield_runnable();
}

[[noreturn]] void deadlock(Block& b) {
  const Launch& L = *g_launch;
  g_blk = &b;
  g_block_idx = b.idx;
  g_cur = nullptr;
  std::string why;
  char buf[512];
  const int first = int(&b - g_blocks) * L.slot_threads;
  int at_barrier = 0;
  for (int i = 0; i < L.nthreads; ++i)
    if (g_threads[size_t(first + i)].st == St::kBarrier) ++at_barrier;
  if (at_barrier) {
    std::snprintf(buf, sizeof buf, "  %d of %d live threads wait at __syncthreads() at %s:%d\n", at_barrier, b.live,
                  b.barrier_file, b.barrier_line);
    why += buf;
  }
  for (int w = 0; w < L.nwarps; ++w) {
    const Warp& wp = g_warps[size_t(first / 32 + w)];
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
  Thread& t = *g_cur;
  Block& b = *g_blk;
  t.st = St::kExited;
  --b.live;
  b.any_exited = true;
  if (b.barrier_arrived > 0)
    fatal("thread exits while %d other threads wait at __syncthreads() at %s:%d: a barrier that not every thread "
          "of the block reaches",
          b.barrier_arrived, b.barrier_file, b.barrier_line);
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
  if (b.live == 0) {  // the block is done: the scheduler retires it and starts the next one
    g_cur = nullptr;
    g_thread_idx = nullptr;
    switch_to_scheduler(t);
  }
  switch_out();
  __builtin_unreachable();
}

RunQueue::Mode draw_mode() {
  const uint32_t m = g_rng.below(10);
  return m < 4 ? RunQueue::kUniform : m < 8 ? RunQueue::kWarpPriority : RunQueue::kFifo;
}

void start_block(Launch& L, int slot, uint32_t lin) {
  const dim3 g = L.cfg.grid, bd = L.cfg.block;
  Block& b = g_blocks[slot];
  b.active = true;
  b.linear = lin;
  b.idx = uint3{lin % g.x, lin / g.x % g.y, lin / (g.x * g.y)};
  b.live = L.nthreads;
  b.any_exited = false;
  b.barrier_arrived = 0;
  // Uninitialised shared memory: all-ones bytes read as NaN in bf16, fp32 and fp64, and as -1.
  std::memset(b.window_lo + L.static_low_off, 0xff, kWindowBytes - L.static_low_off);
  for (int i = 0; i < L.nthreads; ++i) {
    Thread& t = g_threads[size_t(slot * L.slot_threads + i)];
    t.linear = slot * L.slot_threads + i;
    t.idx = uint3{unsigned(i) % bd.x, unsigned(i) / bd.x % bd.y, unsigned(i) / (bd.x * bd.y)};
    t.warp = slot * L.nwarps + i / 32;
    t.lane = i % 32;
    t.slot = slot;
    t.st = St::kRunnable;
    t.commits = 0;
    t.copies.clear();
    init_context(t, g_stacks[size_t(t.linear)]);
  }
  for (int w = 0; w < L.nwarps; ++w) {
    Warp& wp = g_warps[size_t(slot * L.nwarps + w)];
    const int lanes = std::min(32, L.nthreads - 32 * w);
    wp.existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    wp.exited = 0;
    wp.rv = Rendezvous{};
  }
  // This block's policy (with one resident block, its own queue policy too).
  const RunQueue::Mode mode = L.slots == 1 ? draw_mode() : g_queue.mode;
  static const double kLandRates[] = {0.0, 0.01, 0.1, 0.5, 1.0};
  static const double kIssueRates[] = {0.0, 0.0, 0.1, 0.5};
  b.land_rate = kLandRates[g_rng.below(5)];
  b.land_at_issue = kIssueRates[g_rng.below(4)];
  b.yield_rate = g_rng.coin(0.5) ? 0.0 : 0.2;
  b.prio_swap_rate = mode == RunQueue::kWarpPriority ? (g_rng.coin(0.5) ? 0.0005 : 0.01) : 0.0;
  if (L.slots == 1) g_queue.reset(mode, L.slot_threads, g_rng);
  for (int i = 0; i < L.nthreads; ++i) g_queue.push(slot * L.slot_threads + i);
}

void retire_block(int slot) {
  finish_copies(slot);
  g_blocks[slot].active = false;
  ++g_stats.blocks;
}

// Runs every block of the launch, keeping L.slots of them resident.
void run_launch(Launch& L) {
  const dim3 g = L.cfg.grid;
  const uint32_t nblocks = g.x * g.y * g.z;
  std::vector<uint32_t> order(nblocks);
  for (uint32_t i = 0; i < nblocks; ++i) order[i] = i;
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[g_rng.below(uint32_t(i))]);
  if (L.slots > 1) g_queue.reset(draw_mode(), L.slots * L.slot_threads, g_rng);
  size_t next = 0;
  for (int s = 0; s < L.slots && next < nblocks; ++s) start_block(L, s, order[next++]);
  for (;;) {
    // Threads hand over to each other (switch_out); control comes back here when none is
    // runnable, or when a block has finished.
    bool any = false;
    for (int s = 0; s < L.slots; ++s) {
      Block& b = g_blocks[s];
      if (b.active && b.live == 0) {
        retire_block(s);
        if (next < nblocks) start_block(L, s, order[next++]);
      }
      any = any || b.active;
    }
    if (!any) break;
    const int ti = g_queue.pop(g_rng);
    if (ti < 0) {
      for (int s = 0; s < L.slots; ++s)
        if (g_blocks[s].active && g_blocks[s].live > 0) deadlock(g_blocks[s]);
      fatal("emulated GPU: scheduler found no runnable thread (internal error)");
    }
    dispatch(g_threads[size_t(ti)]);
    switch_in(g_threads[size_t(ti)]);
  }
  g_blk = nullptr;
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
  if (g_blk->prio_swap_rate > 0 && g_rng.coin(g_blk->prio_swap_rate))
    g_queue.swap_warps(base / 32, int(g_rng.below(uint32_t(L.slots * L.nwarps))), L.slots * L.slot_threads);
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
  const uint32_t lo = uint32_t(g_launch->static_low_off);
  if (addr < lo || uint64_t(addr) + bytes > kWindowBytes)
    fatal("%s at %s:%d: thread %d reads shared address 0x%x (+%u bytes), outside the block's shared memory "
          "[0x%x, 0x%zx)",
          what, file, line, reader % g_launch->slot_threads, addr, bytes, lo, kWindowBytes);
  for (uint32_t w = addr / 4; w < (addr + bytes + 3) / 4; ++w) {
    const int owner = g_blk->word_owner[w];
    if (owner < 0) continue;
    const Copy& c = g_copy_slab[size_t(owner)];
    if (c.waited && c.thread == reader) continue;  // a thread sees its own copies after its wait
    if (!c.waited)
      fatal("%s at %s:%d: thread %d reads shared address 0x%x, which a cp.async of thread %d is writing and that "
            "thread has not waited for (missing cp.async.wait_group)",
            what, file, line, reader % g_launch->slot_threads, w * 4, c.thread % g_launch->slot_threads);
    fatal("%s at %s:%d: thread %d reads shared address 0x%x, written by a cp.async that thread %d waited for but "
          "no __syncthreads() has published since (missing barrier)",
          what, file, line, reader % g_launch->slot_threads, w * 4, c.thread % g_launch->slot_threads);
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
      A[g + 8 * ((i >> 1) & 1)][2 * t + (i & 1) + 8 * (i >> 2)] =
          bf16_to_float(uint16_t(i & 1 ? reg >> 16 : reg & 0xffff));
    }
    for (int i = 0; i < 4; ++i) {
      const uint32_t reg = m.b[i >> 1];
      B[2 * t + (i & 1) + 8 * (i >> 1)][g] = bf16_to_float(uint16_t(i & 1 ? reg >> 16 : reg & 0xffff));
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
  const uint32_t lo = uint32_t(L.static_low_off);
  if (dst % uint32_t(cp_size) || dst < lo || uint64_t(dst) + uint32_t(cp_size) > kWindowBytes)
    fatal("%s: shared destination 0x%x is misaligned or outside the block's shared memory [0x%x, 0x%zx)", name, dst,
          lo, kWindowBytes);
  if (reinterpret_cast<uintptr_t>(src) % uintptr_t(cp_size))
    fatal("%s: global source %p is not %d-byte aligned", name, src, cp_size);
  Thread& t = *g_cur;
  Block& b = *g_blk;
  // The global read: inside an allocation, exactly, and recorded for the race and hazard checks.
  if (src_size > 0) note_access(src, size_t(src_size), Access::kRead, b.linear + 1);
  for (uint32_t w = dst / 4; w < (dst + uint32_t(cp_size)) / 4; ++w) {
    const int owner = b.word_owner[w];
    if (owner < 0) continue;
    const Copy& o = g_copy_slab[size_t(owner)];
    if (!(o.waited && o.thread == t.linear))  // (a thread's own, waited-for copy is complete)
      fatal("%s at %s:%d: shared address 0x%x is still being written by an earlier cp.async of thread %d that is "
            "%s (a write-write race)",
            name, file, line, w * 4, o.thread % L.slot_threads,
            o.waited ? "not yet published by a barrier" : "not waited for");
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
  for (uint32_t w = dst / 4; w < (dst + uint32_t(cp_size)) / 4; ++w) b.word_owner[w] = id;
  c.dst = dst;
  c.cp_size = uint32_t(cp_size);
  c.src_size = uint32_t(src_size);
  c.src = src;
  c.group = t.commits;  // the group the next commit closes
  c.thread = t.linear;
  c.slot = t.slot;
  c.landed = c.waited = false;
  c.pend_pos = int(g_pending.size());
  g_pending.push_back(id);
  c.mine_pos = int(t.copies.size());
  t.copies.push_back(id);
  ++g_stats.copies;
  if (g_rng.coin(b.land_at_issue)) land(id);
  if (g_rng.coin(b.yield_rate)) yield_runnable();
}


// ------------------------------------------------------------------- kernel memory accesses

// Every load and store of kernel code (see the instrumentation at the end of this file): global
// memory goes to the race and bounds checks of memory.cpp, shared memory is checked against the
// block's declared shared memory; both may switch threads (interleaved mode). Anything else (the
// thread's own stack, the emulation's own data) passes.
void on_access(uintptr_t a, size_t n, Access kind, const void* pc) {
  if (a - g_device_lo < g_device_span) {
    g_access_pc = pc;
    note_access(reinterpret_cast<const void*>(a), n, kind, g_blk->linear + 1);
    g_access_pc = nullptr;
    maybe_switch_at_access();
  } else if (a >= reinterpret_cast<uintptr_t>(g_window_lo) && a < reinterpret_cast<uintptr_t>(g_window_hi)) {
    const Launch& L = *g_launch;
    const size_t off = a - reinterpret_cast<uintptr_t>(g_window_lo);
    if (off < L.static_low_off)
      fatal("shared memory access of %zu bytes at shared address 0x%zx, below the block's shared memory (which "
            "starts at 0x%zx)",
            n, off, L.static_low_off);
    if (off + n > L.dyn_off + L.dyn_bytes)
      fatal("shared memory access of %zu bytes at shared address 0x%zx: %zu bytes past the end of the %zu bytes of "
            "dynamic shared memory",
            n, off, off + n - (L.dyn_off + L.dyn_bytes), L.dyn_bytes);
    maybe_switch_at_access();
  }
}

class KernelOp final : public Op {
 public:
  explicit KernelOp(const Launch& l) : L_(l) {}
  ~KernelOp() override { L_.destroy(L_.closure); }
  Status run() override;

 private:
  Launch L_;
};

Op::Status KernelOp::run() {
  Launch& L = L_;
  init_windows();
  g_rng = Rng(L.seed);
  // Resident blocks and the switch rate at memory accesses: one block and none in a third of the
  // launches (the schedules of the single-block mode), several and a rate drawn from 1/256 .. 1/8
  // otherwise.
  const uint64_t nblocks = uint64_t(L.cfg.grid.x) * L.cfg.grid.y * L.cfg.grid.z;
  const int want = g_max_slots ? g_max_slots : int(1 + g_rng.below(3) * 3 / 2);  // 1, 2 or 4
  L.slots = int(std::min<uint64_t>(uint64_t(want), nblocks));
  static const double kSwitch[] = {1.0 / 256, 1.0 / 32, 1.0 / 8};
  L.mem_switch = L.slots > 1 ? kSwitch[g_rng.below(3)] : 0.0;
  g_switch_countdown = L.mem_switch > 0 ? 1 + g_rng.below(uint32_t(2.0 / L.mem_switch)) : 0;
  L.slot_threads = L.nwarps * 32;
  ensure_stacks(L.slots * L.slot_threads);
  if (g_threads.size() < size_t(L.slots * L.slot_threads)) g_threads.resize(size_t(L.slots * L.slot_threads));
  if (g_warps.size() < size_t(L.slots * L.nwarps)) g_warps.resize(size_t(L.slots * L.nwarps));
  g_block_dim = L.cfg.block;
  g_grid_dim = L.cfg.grid;
  g_launch = &L;
  g_stats.max_resident = std::max<uint64_t>(g_stats.max_resident, uint64_t(L.slots));
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t sw0 = g_stats.switches;
  t_in_kernel = true;
  run_launch(L);
  t_in_kernel = false;
  g_launch = nullptr;
  ++g_stats.launches;
  g_stats.threads += nblocks * uint64_t(L.nthreads);
  if (g_trace) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const dim3 g = L.cfg.grid, b = L.cfg.block;
    std::fprintf(stderr,
                 "emu: #%llu %s at %s:%d grid (%u,%u,%u) block (%u,%u,%u) smem %zu, %d resident: %.1f ms, %llu "
                 "switches\n",
                 (unsigned long long)L.number, L.site.kernel, L.site.file, L.site.line, g.x, g.y, g.z, b.x, b.y, b.z,
                 L.cfg.smem, L.slots, ms, (unsigned long long)(g_stats.switches - sw0));
  }
  return kDone;
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

std::string block_name(uint32_t who) {
  if (!g_launch || who == 0) return "(host)";
  const uint32_t lin = who - 1;
  const dim3 g = g_launch->cfg.grid;
  return "(" + std::to_string(lin % g.x) + ", " + std::to_string(lin / g.x % g.y) + ", " +
         std::to_string(lin / (g.x * g.y)) + ")";
}

uint64_t base_seed() { return g_base_seed; }

void launch(const LaunchSite& site, const void* kernel, const LaunchConfig& cfg, Body body, void* closure,
            void (*destroy)(void*)) {
  if (t_in_kernel) fatal("kernel %s launched from inside a kernel (dynamic parallelism is not emulated)", site.kernel);
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
    destroy(closure);
    set_last_error(err);
    return;
  }
  const uint64_t nblocks = uint64_t(g.x) * g.y * g.z;
  if (nblocks > (uint64_t(1) << 26)) fatal("kernel %s: %llu blocks are too many to emulate", site.kernel,
                                           (unsigned long long)nblocks);
  Launch L;
  L.site = site;
  L.kernel = kernel;
  L.cfg = cfg;
  L.body = body;
  L.closure = closure;
  L.destroy = destroy;
  L.number = ++g_launch_count;
  if (L.number == 1)
    std::printf("[ emulated ] GPU emulation (tests/emulated), schedule seed %llu (PRIMUS_EMU_SEED)\n",
                (unsigned long long)g_base_seed);
  L.seed = mix_seed(g_base_seed, L.number);
  L.nthreads = int(threads);
  L.nwarps = int((threads + 31) / 32);
  L.dyn_bytes = cfg.smem;
  L.dyn_off = kWindowBytes - round_up(cfg.smem, 128);
  L.static_low_off = L.dyn_off;
  enqueue(cfg.stream, std::make_unique<KernelOp>(L), OpLabel{site.kernel, site.file, site.line, site.caller});
}

void* dynamic_shared(size_t align) {
  if (!g_launch || !g_cur) fatal("extern __shared__ memory used outside a kernel");
  char* p = g_window_lo + g_launch->dyn_off;
  if (reinterpret_cast<uintptr_t>(p) % align)
    fatal("extern __shared__ with alignment %zu: the emulation aligns dynamic shared memory to 128 bytes", align);
  return p;
}

void* static_shared(const void* key, size_t bytes, size_t align) {
  if (!g_launch || !g_cur) fatal("__shared__ variable used outside a kernel");
  Launch& L = *g_launch;
  for (const auto& [k, off] : L.statics)
    if (k == key) return g_window_lo + off;
  // Below the objects declared so far (windows are page-aligned: offsets align as addresses).
  const size_t off = (L.static_low_off - bytes) / align * align;
  const size_t static_bytes = L.dyn_off - off;
  if (static_bytes > kStaticSmemMax)
    fatal("%zu bytes of static __shared__ memory: more than the 48 KB a block may declare", static_bytes);
  if (static_bytes + L.dyn_bytes > kMaxSmemPerBlockOptin)
    fatal("%zu bytes of static and %zu of dynamic shared memory: more than the %zu bytes a block may use",
          static_bytes, L.dyn_bytes, kMaxSmemPerBlockOptin);
  for (Block& b : g_blocks) std::memset(b.window_lo + off, 0xff, L.static_low_off - off);  // uninitialised
  L.static_low_off = off;
  L.statics.emplace_back(key, off);
  return g_window_lo + off;
}

void syncthreads(const char* file, int line) {
  check_in_kernel("__syncthreads()", file, line);
  const Launch& L = *g_launch;
  Thread& t = *g_cur;
  Block& b = *g_blk;
  if (b.any_exited) {
    const int first = t.slot * L.slot_threads;
    int exited = 0;
    for (int i = 0; i < L.nthreads; ++i) exited += g_threads[size_t(first + i)].st == St::kExited;
    fatal("__syncthreads() at %s:%d after %d threads of the block have exited: a barrier that not every thread "
          "reaches",
          file, line, exited);
  }
  if (b.barrier_arrived == 0) {
    b.barrier_file = file;
    b.barrier_line = line;
  } else if (b.barrier_line != line || (b.barrier_file != file && std::strcmp(b.barrier_file, file) != 0)) {
    fatal("threads of one block wait at different __syncthreads(): this one at %s:%d, %d others at %s:%d", file,
          line, b.barrier_arrived, b.barrier_file, b.barrier_line);
  }
  ++b.barrier_arrived;
  t.st = St::kBarrier;
  if (b.barrier_arrived == b.live) {
    b.barrier_arrived = 0;
    publish_waited(b);
    const int first = t.slot * L.slot_threads;
    for (int i = 0; i < L.nthreads; ++i)
      if (g_threads[size_t(first + i)].st == St::kBarrier) release(g_threads[size_t(first + i)]);
    ++g_stats.barriers;
  }
  if (b.prio_swap_rate > 0 && g_rng.coin(b.prio_swap_rate * 10))
    g_queue.swap_warps(t.warp, int(g_rng.below(uint32_t(L.slots * L.nwarps))), L.slots * L.slot_threads);
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

// (The access itself is then checked exactly by the instrumentation, or by check_atomic.)
void check_global(const void* p, size_t bytes, size_t align, const char* what, const char* file, int line) {
  if (reinterpret_cast<uintptr_t>(p) % align)
    fatal("%s at %s:%d: address %p is not %zu-byte aligned (a misaligned access faults on a GPU)", what, file, line,
          p, align);
  if (!in_device_range(p))
    fatal("%s at %s:%d: [%p, +%zu bytes) is not device memory (a host pointer, or garbage)", what, file, line, p,
          bytes);
}

void check_atomic(const void* p, size_t bytes, const char* file, int line) {
  if (reinterpret_cast<uintptr_t>(p) % bytes)
    fatal("atomic at %s:%d: address %p is not %zu-byte aligned", file, line, p, bytes);
  const char* c = static_cast<const char*>(p);
  if (g_launch && g_cur && c >= g_window_lo + g_launch->static_low_off && c + bytes <= g_window_hi) return;  // shared
  if (!in_device_range(p))
    fatal("atomic at %s:%d: [%p, +%zu bytes) is neither shared memory nor device memory", file, line, p, bytes);
  note_access(p, bytes, Access::kAtomic, g_cur && g_blk ? g_blk->linear + 1 : 0);
}

}  // namespace emu::detail

// ======================================================================== CUDA intrinsics

size_t __cvta_generic_to_shared(const void* p) {
  using namespace emu::detail;
  const char* c = static_cast<const char*>(p);
  if (!g_launch || !g_cur || c < g_window_lo || c > g_window_hi)
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
  if (g_rng.coin(g_blk->yield_rate)) yield_runnable();
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


void on_fault(int sig, siginfo_t* info, void*) {
  using namespace emu::detail;
  const char* addr = static_cast<const char*>(info->si_addr);
  if (sig == SIGSEGV && materialize_page(addr)) return;  // a sparse allocation's page, first touched
  if (!g_reported.exchange(true)) {
    std::fprintf(stderr, "\nemulated GPU: %s at address %p", sig == SIGSEGV ? "segmentation fault" : "bus error",
                 static_cast<const void*>(addr));
    const void* dev = nullptr;
    if (shadow_to_device(addr, &dev)) {  // the access checks read the shadow first
      std::fprintf(stderr, ": an access to device memory at %p: %s", dev, describe_device_address(dev).c_str());
    } else if (in_device_range(addr)) {
      std::fprintf(stderr, ": %s", describe_device_address(addr).c_str());
    } else {
      for (const Block& b : g_blocks) {
        if (b.window_hi && addr >= b.window_hi && addr < b.window_hi + kPage)
          std::fprintf(stderr, ": past the end of the block's shared memory (%zu bytes of dynamic shared memory)",
                       g_launch ? g_launch->dyn_bytes : size_t(0));
        else if (b.window_lo && addr >= b.window_lo - kPage && addr < b.window_lo)
          std::fprintf(stderr, ": before the start of the shared memory window");
      }
      for (char* s : g_stacks)
        if (addr >= s - kPage && addr < s) std::fprintf(stderr, ": stack overflow of an emulated thread");
    }
    std::fprintf(stderr, "\n");
    if (g_launch || running_op()) print_context(stderr);
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
  const emu::Counters s = emu::counters();
  std::fprintf(stderr,
               "emu: %llu launches, %llu blocks, %llu threads, %llu switches (%llu at memory accesses), %llu "
               "barriers, %llu shuffles, %llu mma, %llu cp.async; ldmatrix: %llu phases, %llu bank conflicts; "
               "%llu host waits\n",
               (unsigned long long)s.launches, (unsigned long long)s.blocks, (unsigned long long)s.threads,
               (unsigned long long)s.switches, (unsigned long long)s.memory_switches, (unsigned long long)s.barriers,
               (unsigned long long)s.shuffles, (unsigned long long)s.mma, (unsigned long long)s.cp_async,
               (unsigned long long)s.ldmatrix_phases, (unsigned long long)s.ldmatrix_conflicts,
               (unsigned long long)s.host_waits);
}

struct Init {
  Init() {
    using namespace emu::detail;
    install_fault_stack();
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

namespace emu {

void detail::install_fault_stack() {
  static thread_local char* stack = nullptr;
  if (stack) return;
  stack = static_cast<char*>(std::malloc(64 * 1024));
  stack_t ss{};
  ss.ss_sp = stack;
  ss.ss_size = 64 * 1024;
  sigaltstack(&ss, nullptr);
}

Counters counters() {
  using namespace emu::detail;
  const Stats& s = g_stats;
  Counters c;
  c.launches = s.launches;
  c.blocks = s.blocks;
  c.threads = s.threads;
  c.switches = s.switches;
  c.memory_switches = s.memory_switches;
  c.barriers = s.barriers;
  c.shuffles = s.shfl;
  c.mma = s.mma;
  c.cp_async = s.copies;
  c.ldmatrix_phases = s.ldmatrix_phases;
  c.ldmatrix_conflicts = s.ldmatrix_conflicts;
  c.max_resident_blocks = s.max_resident;
  c.host_waits = host_wait_count();
  return c;
}

}  // namespace emu

// UBSan's reports from kernel code (misaligned or out-of-bounds accesses) end in abort(), so that
// the handler above adds the kernel, block, thread and seed.
extern "C" const char* __ubsan_default_options() { return "abort_on_error=1:print_stacktrace=1"; }

// ============================================================ the kernel code's accesses
//
// Kernel sources are compiled with -fsanitize=thread (without function entry and exit hooks): GCC
// calls these functions before every load and store it could not prove to be of a local. Nothing
// of ThreadSanitizer's runtime is linked (a build that is itself under -fsanitize=thread keeps the
// real ones and does not emulate).
#if !defined(__SANITIZE_THREAD__)
#define PRIMUS_EMU_HOOK(name, kind, n)                                                                  \
  extern "C" void name(void* a) {                                                                       \
    if (emu::detail::t_in_kernel)                                                                       \
      emu::detail::on_access(reinterpret_cast<uintptr_t>(a), n, emu::detail::Access::kind,              \
                             __builtin_return_address(0));                                              \
  }
#define PRIMUS_EMU_HOOKS(n)                              \
  PRIMUS_EMU_HOOK(__tsan_read##n, kRead, n)              \
  PRIMUS_EMU_HOOK(__tsan_write##n, kWrite, n)            \
  PRIMUS_EMU_HOOK(__tsan_unaligned_read##n, kRead, n)    \
  PRIMUS_EMU_HOOK(__tsan_unaligned_write##n, kWrite, n)  \
  PRIMUS_EMU_HOOK(__tsan_volatile_read##n, kRead, n)     \
  PRIMUS_EMU_HOOK(__tsan_volatile_write##n, kWrite, n)
PRIMUS_EMU_HOOK(__tsan_read1, kRead, 1)
PRIMUS_EMU_HOOK(__tsan_write1, kWrite, 1)
PRIMUS_EMU_HOOK(__tsan_volatile_read1, kRead, 1)
PRIMUS_EMU_HOOK(__tsan_volatile_write1, kWrite, 1)
PRIMUS_EMU_HOOKS(2)
PRIMUS_EMU_HOOKS(4)
PRIMUS_EMU_HOOKS(8)
PRIMUS_EMU_HOOKS(16)
#undef PRIMUS_EMU_HOOKS
#undef PRIMUS_EMU_HOOK
#define PRIMUS_EMU_HOOK_N(name, kind)                                                                 \
  extern "C" void name(void* a, unsigned long n) {                                                    \
    if (emu::detail::t_in_kernel)                                                                     \
      emu::detail::on_access(reinterpret_cast<uintptr_t>(a), n, emu::detail::Access::kind,            \
                             __builtin_return_address(0));                                            \
  }
PRIMUS_EMU_HOOK_N(__tsan_read_range, kRead)
PRIMUS_EMU_HOOK_N(__tsan_write_range, kWrite)
#undef PRIMUS_EMU_HOOK_N
// The guard of a function-local static (host code in the kernel sources): a plain atomic load.
extern "C" unsigned char __tsan_atomic8_load(const volatile unsigned char* a, int) {
  return __atomic_load_n(a, __ATOMIC_ACQUIRE);
}
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_vptr_update(void**, void*) {}
extern "C" void __tsan_vptr_read(void**) {}
#endif
