// The NCCL functions src/parallel/nccl_process_group.cpp calls, for the emulated devices: one
// emulated GPU per process, and communicators of any number of ranks across the processes of one
// machine (what mpirun starts), with NCCL's semantics (nccl.h; NCCL's user guide). The test
// binaries link these instead of libnccl.
//
// Transport. The ncclUniqueId names a shared memory segment (POSIX shm) that every rank of the
// communicator maps in ncclCommInitRank, which returns once all ranks have joined (a communicator
// of one rank uses private memory). ncclCommSplit is collective over the parent: the ranks post
// their color and key in the parent's segment, and each color's members derive their child's id
// from the parent's, so they meet in a new segment. The segment holds, per rank, a staging slot
// (1 MiB) and a control block, and a byte channel (256 KiB ring) per ordered pair of ranks.
//
// Operations are queued on their stream like kernels (emu/streams.cpp) and run when the executor
// reaches them; one waiting for its peers steps aside (the executor runs other streams' work
// meanwhile), as an NCCL kernel waits on the GPU. The ops of a communicator run in the order they
// were issued. A collective runs in rounds: each rank copies the next piece of its send buffer
// into its slot, then reads all slots once every rank has posted that round and computes its own
// output; the reduction is a fold in rank order (bf16 and fp16 round after every step, as a ring
// reduction does), Avg divides the sum by the number of ranks. Every round also carries each
// rank's description of the operation (kind, count, type, reduction, root): ranks that disagree
// abort with both descriptions (a GPU would hang or corrupt memory). Point-to-point: within
// ncclGroupStart/ncclGroupEnd (or alone, to another rank), the n-th send to a peer meets the
// peer's n-th receive from this rank, through their channel; a count or type that differs aborts.
// Sends, receives and collectives of one group progress together. What an op reads and writes is
// recorded for the hazard checks of emu/memory.cpp.
//
// Strict where a GPU would hang or corrupt memory, with an error status at once where NCCL can
// know: a buffer outside the device allocations, an unknown type or reduction, a root or peer
// outside the communicator, overlapping send and receive buffers that are not the in-place
// layout, and a destroyed communicator are ncclInvalidArgument; a send or receive to self outside
// a group is ncclInvalidUsage (it never completes); with one rank, a group whose sends and
// receives do not match is ncclInvalidUsage at ncclGroupEnd. Between ranks, a mismatch aborts
// when the op runs and a missing peer is reported as a hang (PRIMUS_EMU_HANG_SECONDS). Every error
// is explained on stderr and by ncclGetLastError.
#include <fcntl.h>
#include <nccl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu/emulator.h"

namespace {

using emu::detail::Access;
using emu::detail::find_allocation;
using emu::detail::note_access;

constexpr char kIdMagic[] = "primus-emulated-nccl-id";
constexpr size_t kIdRandom = 16;  // random bytes after the magic
constexpr size_t kSlotBytes = size_t(1) << 20;
constexpr size_t kChanBytes = size_t(256) << 10;
constexpr uint64_t kSegMagic = 0x7072696d75736e63ull;

// ---------------------------------------------------------------------------- the segment

enum Kind : int32_t { kAllReduce = 1, kReduceScatter, kAllGather, kBroadcast };

struct OpDesc {
  int32_t kind, type, redop, root;
  uint64_t count;
};

struct alignas(64) RankCtl {
  std::atomic<uint64_t> posted;    // collective rounds this rank has posted into its slot
  std::atomic<uint64_t> consumed;  // collective rounds this rank has read
  OpDesc desc;                     // the op of its latest posted round
  std::atomic<uint64_t> split_posted, split_consumed;
  int32_t split_color, split_key;
  std::atomic<uint32_t> joined;
};

struct alignas(64) Channel {  // bytes of the ring from one rank to another
  std::atomic<uint64_t> head;  // written
  std::atomic<uint64_t> tail;  // read
};

struct Header {
  uint64_t magic;
  std::atomic<int32_t> nranks;
  std::atomic<int32_t> joined;
};

struct MsgHeader {  // precedes every point-to-point message in a channel
  uint64_t count;
  int32_t type;
  uint32_t magic;
};
constexpr uint32_t kMsgMagic = 0x50325021u;

size_t segment_bytes(int n) {
  return sizeof(Header) + size_t(n) * sizeof(RankCtl) + size_t(n) * n * sizeof(Channel) + size_t(n) * kSlotBytes +
         size_t(n) * n * kChanBytes;
}

}  // namespace

struct ncclComm {
  int rank = 0, nranks = 1;
  int device = 0;
  ncclUniqueId id{};
  void* map = nullptr;
  size_t map_bytes = 0;
  Header* header = nullptr;
  RankCtl* ctl = nullptr;
  Channel* chans = nullptr;
  char* slots = nullptr;
  char* ring = nullptr;
  // This process's side (touched by the host when issuing, by the executor when running; the
  // executor's lock orders the two).
  uint64_t coll_issued = 0, coll_done = 0;  // collectives, in issue order
  uint64_t round = 0;                       // collective rounds completed
  uint64_t splits = 0;
  std::vector<uint64_t> send_issued, send_done, recv_issued, recv_done;  // per peer, messages
  std::atomic<int> inflight{0};  // queued ops that use this communicator

  RankCtl& me() { return ctl[rank]; }
  char* slot(int r) { return slots + size_t(r) * kSlotBytes; }
  Channel& chan(int from, int to) { return chans[size_t(from) * nranks + to]; }
  char* ring_of(int from, int to) { return ring + (size_t(from) * nranks + to) * kChanBytes; }
};

namespace {

struct State {
  std::mutex mu;
  std::set<ncclComm*> comms;
};
State& st() {
  static State s;
  return s;
}

thread_local std::string t_last_error;

ncclResult_t error(ncclResult_t r, const char* fn, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
ncclResult_t error(ncclResult_t r, const char* fn, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  t_last_error = std::string(fn) + ": " + msg;
  std::fprintf(stderr, "emulated NCCL: %s\n", t_last_error.c_str());
  return r;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

const char* type_name(int t) {
  switch (t) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "float16";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclBfloat16: return "bfloat16";
    default: return "(type?)";
  }
}

const char* op_name(int op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return "(op?)";
  }
}

const char* kind_name(int k) {
  switch (k) {
    case kAllReduce: return "ncclAllReduce";
    case kReduceScatter: return "ncclReduceScatter";
    case kAllGather: return "ncclAllGather";
    case kBroadcast: return "ncclBroadcast";
    default: return "(collective?)";
  }
}

std::string desc_str(const OpDesc& d) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s of %llu %s (reduction %s, root %d)", kind_name(d.kind),
                (unsigned long long)d.count, type_name(d.type), op_name(d.redop), d.root);
  return buf;
}

bool live(ncclComm* c) {
  std::lock_guard<std::mutex> lock(st().mu);
  return st().comms.count(c) > 0;
}

ncclResult_t check_comm(const char* fn, ncclComm* comm) {
  if (!comm || !live(comm)) return error(ncclInvalidArgument, fn, "not a live communicator");
  return ncclSuccess;
}

ncclResult_t check_buffer(const char* fn, const char* which, const void* p, size_t bytes) {
  if (!p) return error(ncclInvalidArgument, fn, "%s buffer is null", which);
  if (!find_allocation(p, bytes))
    return error(ncclInvalidArgument, fn,
                 "%s buffer [%p, +%zu bytes) is not inside one device allocation (host memory, or past the end)",
                 which, p, bytes);
  return ncclSuccess;
}

// The common checks of a collective: the communicator, type, stream and both buffers; send and
// receive either the same bytes (in place: recv + in_place_offset == send) or disjoint.
ncclResult_t check_collective(const char* fn, ncclComm* comm, ncclDataType_t type, cudaStream_t stream,
                              const void* send, size_t send_count, const void* recv, size_t recv_count,
                              ptrdiff_t in_place_offset) {
  if (ncclResult_t r = check_comm(fn, comm); r != ncclSuccess) return r;
  const size_t e = type_size(type);
  if (!e) return error(ncclInvalidArgument, fn, "%d is not an ncclDataType_t", int(type));
  if (!emu::detail::valid_stream(stream)) return error(ncclInvalidArgument, fn, "not a live stream");
  if (ncclResult_t r = check_buffer(fn, "the send", send, send_count * e); r != ncclSuccess) return r;
  if (ncclResult_t r = check_buffer(fn, "the receive", recv, recv_count * e); r != ncclSuccess) return r;
  const char* s = static_cast<const char*>(send);
  const char* d = static_cast<const char*>(recv);
  const uintptr_t in_place = reinterpret_cast<uintptr_t>(d) + uintptr_t(in_place_offset * ptrdiff_t(e));
  if (reinterpret_cast<uintptr_t>(s) != in_place && s < d + recv_count * e && d < s + send_count * e)
    return error(ncclInvalidArgument, fn, "the send and receive buffers overlap without being in place");
  return ncclSuccess;
}

ncclResult_t check_op(const char* fn, ncclRedOp_t op) {
  if (int(op) < 0 || int(op) >= int(ncclNumOps))
    return error(ncclInvalidArgument, fn, "%d is not a built-in ncclRedOp_t (custom operators are not emulated)",
                 int(op));
  return ncclSuccess;
}

// ---------------------------------------------------------------------------- reductions

using emu::detail::bf16_to_float;
using emu::detail::float_to_bf16;

template <typename T>
T apply(int op, T a, T b) {
  switch (op) {
    case ncclSum: case ncclAvg: return T(a + b);
    case ncclProd: return T(a * b);
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
  }
  return a;
}

template <typename T>
void fold(void* out, const char* const* in, int n, size_t count, int op) {
  T* o = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, in[0] + i * sizeof(T), sizeof(T));
    for (int q = 1; q < n; ++q) {
      T w;
      std::memcpy(&w, in[q] + i * sizeof(T), sizeof(T));
      v = apply(op, v, w);
    }
    if (op == ncclAvg) v = T(v / T(n));
    std::memcpy(o + i, &v, sizeof(T));
  }
}

// 16-bit floats: each step in fp32, rounded back, as every hop of a ring reduction rounds.
template <typename H, typename ToF, typename FromF>
void fold16(void* out, const char* const* in, int n, size_t count, int op, ToF to_f, FromF from_f) {
  H* o = static_cast<H*>(out);
  for (size_t i = 0; i < count; ++i) {
    H v;
    std::memcpy(&v, in[0] + i * 2, 2);
    for (int q = 1; q < n; ++q) {
      H w;
      std::memcpy(&w, in[q] + i * 2, 2);
      v = from_f(apply(op, to_f(v), to_f(w)));
    }
    if (op == ncclAvg) v = from_f(to_f(v) / float(n));
    std::memcpy(o + i, &v, 2);
  }
}

// out[i] = in[0][i] op in[1][i] op ... (in rank order); `out` may be any one of `in`.
void reduce(void* out, const char* const* in, int n, size_t count, int type, int op) {
  switch (type) {
    case ncclInt8: fold<int8_t>(out, in, n, count, op); break;
    case ncclUint8: fold<uint8_t>(out, in, n, count, op); break;
    case ncclInt32: fold<int32_t>(out, in, n, count, op); break;
    case ncclUint32: fold<uint32_t>(out, in, n, count, op); break;
    case ncclInt64: fold<int64_t>(out, in, n, count, op); break;
    case ncclUint64: fold<uint64_t>(out, in, n, count, op); break;
    case ncclFloat32: fold<float>(out, in, n, count, op); break;
    case ncclFloat64: fold<double>(out, in, n, count, op); break;
    case ncclBfloat16: fold16<uint16_t>(out, in, n, count, op, bf16_to_float, float_to_bf16); break;
    case ncclFloat16:
      fold16<_Float16>(out, in, n, count, op, [](_Float16 h) { return float(h); },
                       [](float f) { return _Float16(f); });
      break;
    default: emu::detail::fatal("emulated NCCL: reductions of type %s are not emulated", type_name(type));
  }
}

// ---------------------------------------------------------------------------- waiting

double hang_seconds() {
  const char* e = std::getenv("PRIMUS_EMU_HANG_SECONDS");
  return e && *e ? std::atof(e) : 100.0;
}

// Host-blocking waits for the other ranks (init, split): the device keeps working meanwhile.
template <typename Pred>
bool host_wait(Pred ready) {
  const auto t0 = std::chrono::steady_clock::now();
  int us = 1;
  while (!ready()) {
    emu::detail::progress_some();
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > hang_seconds()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(us));
    us = std::min(us * 2, 2000);
  }
  return true;
}

std::string id_name(const ncclUniqueId& id) {
  static const char* hex = "0123456789abcdef";
  std::string n = "/primus-emu-nccl-";
  for (size_t i = 0; i < kIdRandom; ++i) {
    const auto b = static_cast<unsigned char>(id.internal[sizeof kIdMagic + i]);
    n += hex[b >> 4];
    n += hex[b & 15];
  }
  return n;
}

// Maps the communicator's segment and waits for every rank to join.
ncclResult_t join(const char* fn, ncclComm* c) {
  const size_t bytes = segment_bytes(c->nranks);
  c->map_bytes = bytes;
  const bool shared = c->nranks > 1;
  if (!shared) {
    c->map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (c->map == MAP_FAILED) return error(ncclSystemError, fn, "cannot map %zu bytes", bytes);
  } else {
    emu::detail::start_device_thread();
    const std::string name = id_name(c->id);
    const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0) return error(ncclSystemError, fn, "shm_open(%s) failed: %s", name.c_str(), strerror(errno));
    if (ftruncate(fd, off_t(bytes)) != 0) {
      close(fd);
      return error(ncclSystemError, fn, "ftruncate(%s, %zu) failed: %s", name.c_str(), bytes, strerror(errno));
    }
    c->map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (c->map == MAP_FAILED) return error(ncclSystemError, fn, "mmap of %s failed: %s", name.c_str(), strerror(errno));
  }
  char* p = static_cast<char*>(c->map);
  c->header = reinterpret_cast<Header*>(p);
  c->ctl = reinterpret_cast<RankCtl*>(p + sizeof(Header));
  c->chans = reinterpret_cast<Channel*>(p + sizeof(Header) + size_t(c->nranks) * sizeof(RankCtl));
  c->slots = reinterpret_cast<char*>(c->chans + size_t(c->nranks) * c->nranks);
  c->ring = c->slots + size_t(c->nranks) * kSlotBytes;
  const size_t n = size_t(c->nranks);
  c->send_issued.assign(n, 0);
  c->send_done.assign(n, 0);
  c->recv_issued.assign(n, 0);
  c->recv_done.assign(n, 0);
  // A fresh segment is all zero bytes: counters at 0.
  int32_t expect = 0;
  if (!c->header->nranks.compare_exchange_strong(expect, c->nranks) && expect != c->nranks)
    return error(ncclInvalidUsage, fn, "rank %d joins with nranks %d, but another rank said %d", c->rank, c->nranks,
                 expect);
  if (c->me().joined.exchange(1) != 0)
    return error(ncclInvalidUsage, fn, "rank %d of %d joined twice", c->rank, c->nranks);
  const int before = c->header->joined.fetch_add(1);
  if (!shared) return ncclSuccess;
  if (before + 1 == c->nranks) shm_unlink(id_name(c->id).c_str());  // every rank has it mapped
  if (!host_wait([&] { return c->header->joined.load() == c->nranks; })) {
    std::string missing;
    for (int r = 0; r < c->nranks; ++r)
      if (!c->ctl[r].joined.load()) missing += " " + std::to_string(r);
    shm_unlink(id_name(c->id).c_str());
    return error(ncclSystemError, fn, "rank %d of %d: ranks%s did not join within %.0f s", c->rank, c->nranks,
                 missing.c_str(), hang_seconds());
  }
  return ncclSuccess;
}

ncclResult_t new_comm(const char* fn, const ncclUniqueId& id, int nranks, int rank, int device, ncclComm** out) {
  auto* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->id = id;
  if (ncclResult_t r = join(fn, c); r != ncclSuccess) {
    if (c->map && c->map != MAP_FAILED) munmap(c->map, c->map_bytes);
    delete c;
    return r;
  }
  std::lock_guard<std::mutex> lock(st().mu);
  st().comms.insert(c);
  *out = c;
  return ncclSuccess;
}

// ---------------------------------------------------------------------------- operations

// One part of a queued NCCL op: a collective, a send or a receive. progress() moves it on as far
// as the other ranks allow.
class Part {
 public:
  virtual ~Part() = default;
  virtual emu::detail::Op::Status progress() = 0;  // kDone, kProgress, kStalled
  virtual void record() = 0;                       // what it reads and writes
  virtual std::string waits_for() const = 0;
};

class Collective final : public Part {
 public:
  Collective(ncclComm* c, OpDesc d, const void* send, void* recv)
      : c_(c), d_(d), send_(static_cast<const char*>(send)), recv_(static_cast<char*>(recv)) {
    seq_ = c->coll_issued++;
    esz_ = type_size(ncclDataType_t(d.type));
    // The bytes each rank posts, over all rounds: its whole send buffer.
    total_ = d.count * esz_ * (d.kind == kReduceScatter ? size_t(c->nranks) : 1);
    chunk_ = kSlotBytes / esz_ * esz_;
  }

  void record() override {
    const size_t n = d_.count * esz_, all = n * size_t(c_->nranks);
    switch (d_.kind) {
      case kAllReduce:
        note_access(send_, n, Access::kRead, 0);
        note_access(recv_, n, Access::kWrite, 0);
        break;
      case kReduceScatter:
        note_access(send_, all, Access::kRead, 0);
        note_access(recv_, n, Access::kWrite, 0);
        break;
      case kAllGather:
        note_access(send_, n, Access::kRead, 0);
        note_access(recv_, all, Access::kWrite, 0);
        break;
      case kBroadcast:
        if (c_->rank == d_.root) note_access(send_, n, Access::kRead, 0);
        note_access(recv_, n, Access::kWrite, 0);
        break;
    }
  }

  emu::detail::Op::Status progress() override {
    using S = emu::detail::Op::Status;
    if (c_->coll_done != seq_) return S::kStalled;  // an earlier collective of the communicator first
    bool moved = false;
    while (off_ < total_) {
      const uint64_t round = c_->round + 1;
      const size_t len = std::min(chunk_, total_ - off_);
      if (!posted_) {
        for (int q = 0; q < c_->nranks; ++q)  // everyone has read the previous round's slots
          if (c_->ctl[q].consumed.load(std::memory_order_acquire) < round - 1)
            return moved ? S::kProgress : S::kStalled;
        if (d_.kind != kBroadcast || c_->rank == d_.root) std::memcpy(c_->slot(c_->rank), send_ + off_, len);
        c_->me().desc = d_;
        c_->me().posted.store(round, std::memory_order_release);
        posted_ = true;
        moved = true;
      }
      for (int q = 0; q < c_->nranks; ++q)
        if (c_->ctl[q].posted.load(std::memory_order_acquire) < round) return moved ? S::kProgress : S::kStalled;
      for (int q = 0; q < c_->nranks; ++q) {
        const OpDesc& o = c_->ctl[q].desc;
        if (o.kind != d_.kind || o.type != d_.type || o.count != d_.count || o.redop != d_.redop ||
            o.root != d_.root)
          emu::detail::fatal("emulated NCCL: the ranks of a communicator of %d disagree on collective #%llu: rank %d "
                             "runs %s, rank %d runs %s (on a GPU: a hang or corrupted memory)",
                             c_->nranks, (unsigned long long)seq_ + 1, c_->rank, desc_str(d_).c_str(), q,
                             desc_str(o).c_str());
      }
      consume(off_, len);
      c_->me().consumed.store(round, std::memory_order_release);
      c_->round = round;
      off_ += len;
      posted_ = false;
      moved = true;
    }
    ++c_->coll_done;
    return S::kDone;
  }

  std::string waits_for() const override {
    std::string who;
    for (int q = 0; q < c_->nranks; ++q)
      if (c_->ctl[q].posted.load() < c_->round + 1) who += " " + std::to_string(q);
    return "rank " + std::to_string(c_->rank) + " of " + std::to_string(c_->nranks) + " in " + desc_str(d_) +
           (c_->coll_done != seq_ ? ", behind an earlier collective of its communicator"
                                  : ", waiting for ranks" + who + " to reach it");
  }

 private:
  // Computes this rank's output from every rank's bytes [off, off + len) of its send buffer.
  void consume(size_t off, size_t len) {
    const int n = c_->nranks;
    std::vector<const char*> in(static_cast<size_t>(c_->nranks));
    for (int q = 0; q < n; ++q) in[size_t(q)] = c_->slot(q);
    switch (d_.kind) {
      case kAllReduce: reduce(recv_ + off, in.data(), n, len / esz_, d_.type, d_.redop); break;
      case kReduceScatter: {  // this rank's part: send bytes [rank * count, (rank + 1) * count) * esz
        const size_t lo = std::max(off, size_t(c_->rank) * d_.count * esz_);
        const size_t hi = std::min(off + len, size_t(c_->rank + 1) * d_.count * esz_);
        if (lo >= hi) break;
        for (auto& p : in) p += lo - off;
        reduce(recv_ + (lo - size_t(c_->rank) * d_.count * esz_), in.data(), n, (hi - lo) / esz_, d_.type,
               d_.redop);
        break;
      }
      case kAllGather:
        for (int q = 0; q < n; ++q) std::memcpy(recv_ + size_t(q) * d_.count * esz_ + off, in[size_t(q)], len);
        break;
      case kBroadcast: std::memmove(recv_ + off, in[size_t(d_.root)], len); break;
    }
  }

  ncclComm* c_;
  OpDesc d_;
  const char* send_;
  char* recv_;
  uint64_t seq_;
  size_t esz_, total_, chunk_, off_ = 0;
  bool posted_ = false;
};

// Byte rings: position `pos` of the stream is byte pos % kChanBytes.
void ring_in(char* ring, uint64_t pos, const char* src, size_t n) {
  const size_t at = size_t(pos % kChanBytes), first = std::min(n, kChanBytes - at);
  std::memcpy(ring + at, src, first);
  std::memcpy(ring, src + first, n - first);
}
void ring_out(const char* ring, uint64_t pos, char* dst, size_t n) {
  const size_t at = size_t(pos % kChanBytes), first = std::min(n, kChanBytes - at);
  std::memcpy(dst, ring + at, first);
  std::memcpy(dst + first, ring, n - first);
}

class PointToPoint final : public Part {
 public:
  PointToPoint(bool send, ncclComm* c, int peer, const void* buf, size_t count, ncclDataType_t type)
      : send_(send), c_(c), peer_(peer), buf_(static_cast<char*>(const_cast<void*>(buf))), count_(count),
        type_(type), bytes_(count * type_size(type)) {
    index_ = send ? c->send_issued[size_t(peer)]++ : c->recv_issued[size_t(peer)]++;
  }

  void record() override { note_access(buf_, bytes_, send_ ? Access::kRead : Access::kWrite, 0); }

  emu::detail::Op::Status progress() override {
    using S = emu::detail::Op::Status;
    // Messages to (from) one peer go out (come in) in the order they were issued.
    if ((send_ ? c_->send_done : c_->recv_done)[size_t(peer_)] != index_) return S::kStalled;
    Channel& ch = send_ ? c_->chan(c_->rank, peer_) : c_->chan(peer_, c_->rank);
    char* ring = send_ ? c_->ring_of(c_->rank, peer_) : c_->ring_of(peer_, c_->rank);
    const size_t total = sizeof(MsgHeader) + bytes_;
    const MsgHeader mine{count_, int32_t(type_), kMsgMagic};
    bool moved = false;
    while (done_ < total) {
      const uint64_t head = ch.head.load(std::memory_order_acquire), tail = ch.tail.load(std::memory_order_acquire);
      const size_t len = std::min(send_ ? kChanBytes - size_t(head - tail) : size_t(head - tail), total - done_);
      if (len == 0) break;
      // The message is one byte stream: its header, then the payload.
      for (size_t copied = 0; copied < len;) {
        const size_t at = done_ + copied;
        const bool in_header = at < sizeof(MsgHeader);
        const size_t n = in_header ? std::min(sizeof(MsgHeader) - at, len - copied) : len - copied;
        const uint64_t pos = (send_ ? head : tail) + copied;
        if (send_)
          ring_in(ring, pos, in_header ? reinterpret_cast<const char*>(&mine) + at : buf_ + (at - sizeof(MsgHeader)),
                  n);
        else
          ring_out(ring, pos, in_header ? reinterpret_cast<char*>(&got_) + at : buf_ + (at - sizeof(MsgHeader)), n);
        copied += n;
        if (!send_ && in_header && at + n == sizeof(MsgHeader)) check_header();
      }
      (send_ ? ch.head : ch.tail).store((send_ ? head : tail) + len, std::memory_order_release);
      done_ += len;
      moved = true;
    }
    if (done_ < total) return moved ? S::kProgress : S::kStalled;
    ++(send_ ? c_->send_done : c_->recv_done)[size_t(peer_)];
    return S::kDone;
  }

  std::string waits_for() const override {
    char buf[200];
    std::snprintf(buf, sizeof buf, "rank %d: %s of %zu %s %s rank %d (message %llu between them) %s", c_->rank,
                  send_ ? "ncclSend" : "ncclRecv", count_, type_name(type_), send_ ? "to" : "from", peer_,
                  (unsigned long long)index_ + 1,
                  send_ ? "waits for the peer to receive" : "waits for the peer's send");
    return buf;
  }

 private:
  void check_header() const {
    if (got_.magic != kMsgMagic)
      emu::detail::fatal("emulated NCCL: rank %d received a corrupt message from rank %d", c_->rank, peer_);
    if (got_.count != count_ || got_.type != int32_t(type_))
      emu::detail::fatal("emulated NCCL: rank %d posted a receive of %zu %s from rank %d, which sent %llu %s as its "
                         "message %llu to this rank: NCCL needs the same count and type on both sides (a GPU hangs "
                         "or corrupts memory)",
                         c_->rank, count_, type_name(type_), peer_, (unsigned long long)got_.count,
                         type_name(got_.type), (unsigned long long)index_ + 1);
  }

  bool send_;
  ncclComm* c_;
  int peer_;
  char* buf_;
  size_t count_;
  ncclDataType_t type_;
  size_t bytes_, done_ = 0;
  uint64_t index_;
  MsgHeader got_{};
};

// A queued NCCL op: one collective, or a group's parts, run together.
class NcclOp final : public emu::detail::Op {
 public:
  explicit NcclOp(std::vector<std::unique_ptr<Part>> parts, std::vector<ncclComm*> comms)
      : parts_(std::move(parts)), comms_(std::move(comms)) {
    for (ncclComm* c : comms_) ++c->inflight;
  }
  ~NcclOp() override {
    for (ncclComm* c : comms_) --c->inflight;
  }

  Status run() override {
    if (!recorded_) {
      for (const auto& p : parts_) p->record();
      recorded_ = true;
      done_.assign(parts_.size(), false);
    }
    bool moved = false, all = true;
    for (size_t i = 0; i < parts_.size(); ++i) {
      if (done_[i]) continue;
      const Status s = parts_[i]->progress();
      moved = moved || s != kStalled;
      done_[i] = s == kDone;
      all = all && done_[i];
    }
    return all ? kDone : moved ? kProgress : kStalled;
  }

  std::string waits_for() const override {
    std::string w;
    for (size_t i = 0; i < parts_.size(); ++i)
      if (i >= done_.size() || !done_[i]) w += (w.empty() ? "" : "; ") + parts_[i]->waits_for();
    return w;
  }

 private:
  std::vector<std::unique_ptr<Part>> parts_;
  std::vector<ncclComm*> comms_;
  std::vector<bool> done_;
  bool recorded_ = false;
};

// An issued operation: queued at once, or held until the outermost ncclGroupEnd.
struct Issued {
  std::unique_ptr<Part> part;
  ncclComm* comm;
  cudaStream_t stream;
  const char* what;
  bool p2p, send;
  int peer;
  size_t count;
  ncclDataType_t type;
};
thread_local int t_group_depth = 0;
thread_local std::vector<Issued> t_group;
thread_local ncclResult_t t_group_error = ncclSuccess;  // the first error inside the open group

bool trace() {
  static const bool on = [] {
    const char* t = std::getenv("PRIMUS_EMU_TRACE");
    return t && *t && *t != '0';
  }();
  return on;
}

void queue(std::vector<Issued> ops) {
  if (ops.empty()) return;
  if (trace()) {  // PRIMUS_EMU_TRACE: what each rank queues, in issue order
    std::string what;
    for (const Issued& o : ops) {
      char buf[160];
      if (o.p2p)
        std::snprintf(buf, sizeof buf, " %s %zu %s %s rank %d;", o.send ? "send" : "recv", o.count, type_name(o.type),
                      o.send ? "to" : "from", o.peer);
      else
        std::snprintf(buf, sizeof buf, " %s %zu %s;", o.what, o.count, type_name(o.type));
      what += buf;
    }
    std::fprintf(stderr, "emu: NCCL rank %d of %d (pid %d) queues%s\n", ops[0].comm->rank, ops[0].comm->nranks,
                 int(getpid()), what.c_str());
  }
  std::vector<std::unique_ptr<Part>> parts;
  std::vector<ncclComm*> comms;
  for (Issued& o : ops) {
    parts.push_back(std::move(o.part));
    if (std::find(comms.begin(), comms.end(), o.comm) == comms.end()) comms.push_back(o.comm);
  }
  emu::detail::enqueue(
      ops[0].stream, std::make_unique<NcclOp>(std::move(parts), std::move(comms)),
      emu::detail::OpLabel{ops.size() == 1 ? ops[0].what : "ncclGroupEnd (a group of NCCL operations)"});
}

ncclResult_t issue(Issued op) {
  if (t_group_depth > 0) {
    t_group.push_back(std::move(op));
    return ncclSuccess;
  }
  std::vector<Issued> one;
  one.push_back(std::move(op));
  queue(std::move(one));
  return ncclSuccess;
}

ncclResult_t group_failed(ncclResult_t r) {
  if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = r;
  return r;
}

ncclResult_t collective(const char* fn, ncclComm* comm, cudaStream_t stream, OpDesc d, const void* send, void* recv) {
  if (d.count == 0) return ncclSuccess;
  Issued op{std::make_unique<Collective>(comm, d, send, recv), comm, stream, fn, false, false, 0, d.count,
            ncclDataType_t(d.type)};
  return issue(std::move(op));
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return error(ncclInvalidArgument, "ncclGetVersion", "null version pointer");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return error(ncclInvalidArgument, "ncclGetUniqueId", "null id pointer");
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, kIdMagic, sizeof kIdMagic);
  static std::mt19937_64 rng{std::random_device{}() ^ uint64_t(getpid()) << 32};
  for (size_t i = 0; i < kIdRandom; i += 8) {
    const uint64_t r = rng();
    std::memcpy(id->internal + sizeof kIdMagic + i, &r, 8);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  const char* fn = "ncclCommInitRank";
  if (!comm) return error(ncclInvalidArgument, fn, "null communicator pointer");
  if (std::memcmp(id.internal, kIdMagic, sizeof kIdMagic) != 0)
    return error(ncclInvalidArgument, fn, "the id was not made by ncclGetUniqueId");
  if (nranks < 1) return error(ncclInvalidArgument, fn, "nranks %d", nranks);
  if (rank < 0 || rank >= nranks)
    return error(ncclInvalidArgument, fn, "rank %d of a communicator of %d", rank, nranks);
  int device = 0;
  cudaGetDevice(&device);
  return new_comm(fn, id, nranks, rank, device, comm);
}

// Collective over `comm` (every rank calls it, in the same order as its other splits).
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  const char* fn = "ncclCommSplit";
  if (ncclResult_t r = check_comm(fn, comm); r != ncclSuccess) return r;
  if (!newcomm) return error(ncclInvalidArgument, fn, "null communicator pointer");
  if (t_group_depth > 0) return error(ncclInvalidUsage, fn, "inside a group (not emulated)");
  if (color < NCCL_SPLIT_NOCOLOR) return error(ncclInvalidArgument, fn, "color %d", color);
  const uint64_t s = ++comm->splits;
  RankCtl& me = comm->me();
  // Everyone has read the previous split's posts before this rank overwrites its own.
  if (!host_wait([&] {
        for (int q = 0; q < comm->nranks; ++q)
          if (comm->ctl[q].split_consumed.load(std::memory_order_acquire) < s - 1) return false;
        return true;
      }))
    return error(ncclSystemError, fn, "rank %d: the other ranks did not finish the previous split", comm->rank);
  me.split_color = color;
  me.split_key = key;
  me.split_posted.store(s, std::memory_order_release);
  if (!host_wait([&] {
        for (int q = 0; q < comm->nranks; ++q)
          if (comm->ctl[q].split_posted.load(std::memory_order_acquire) < s) return false;
        return true;
      })) {
    std::string missing;
    for (int q = 0; q < comm->nranks; ++q)
      if (comm->ctl[q].split_posted.load() < s) missing += " " + std::to_string(q);
    return error(ncclSystemError, fn, "rank %d of %d: ranks%s did not call ncclCommSplit within %.0f s", comm->rank,
                 comm->nranks, missing.c_str(), hang_seconds());
  }
  // The members of this color, ordered by (key, rank in the parent).
  std::vector<std::pair<int, int>> members;
  for (int q = 0; q < comm->nranks; ++q)
    if (comm->ctl[q].split_color == color && color != NCCL_SPLIT_NOCOLOR)
      members.push_back({comm->ctl[q].split_key, q});
  me.split_consumed.store(s, std::memory_order_release);
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  while (members[size_t(new_rank)].second != comm->rank) ++new_rank;
  // The child's id: the parent's, mixed with the split number and the color.
  ncclUniqueId child = comm->id;
  for (size_t i = 0; i < kIdRandom; i += 8) {
    uint64_t v;
    std::memcpy(&v, child.internal + sizeof kIdMagic + i, 8);
    v = emu::detail::mix_seed(v ^ (s * 0x9e3779b97f4a7c15ull), uint64_t(uint32_t(color)) + i);
    std::memcpy(child.internal + sizeof kIdMagic + i, &v, 8);
  }
  return new_comm(fn, child, int(members.size()), new_rank, comm->device, newcomm);
}

// Waits until the communicator's queued operations have run (a GPU's would complete too).
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  const char* fn = "ncclCommDestroy";
  if (!comm) return ncclSuccess;
  for (const Issued& op : t_group)
    if (op.comm == comm) return error(ncclInvalidUsage, fn, "the communicator has operations in an open group");
  {
    std::lock_guard<std::mutex> lock(st().mu);
    if (!st().comms.erase(comm)) return error(ncclInvalidArgument, fn, "not a live communicator");
  }
  if (comm->inflight.load() > 0) emu::detail::wait_until([&] { return comm->inflight.load() == 0; });
  munmap(comm->map, comm->map_bytes);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (ncclResult_t r = check_comm("ncclCommGetAsyncError", comm); r != ncclSuccess) return r;
  if (!async_error) return error(ncclInvalidArgument, "ncclCommGetAsyncError", "null result pointer");
  *async_error = ncclSuccess;  // errors of running ops abort the process with their report
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (ncclResult_t r = check_comm("ncclCommCount", comm); r != ncclSuccess) return r;
  if (!count) return error(ncclInvalidArgument, "ncclCommCount", "null count pointer");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (ncclResult_t r = check_comm("ncclCommUserRank", comm); r != ncclSuccess) return r;
  if (!rank) return error(ncclInvalidArgument, "ncclCommUserRank", "null rank pointer");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (ncclResult_t r = check_comm("ncclCommCuDevice", comm); r != ncclSuccess) return r;
  if (!device) return error(ncclInvalidArgument, "ncclCommCuDevice", "null device pointer");
  *device = comm->device;
  return ncclSuccess;
}

// ---- collectives ----

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  if (ncclResult_t r = check_op(fn, op); r != ncclSuccess) return group_failed(r);
  if (ncclResult_t r = check_collective(fn, comm, type, stream, send, count, recv, count, 0); r != ncclSuccess)
    return group_failed(r);
  return group_failed(collective(fn, comm, stream, {kAllReduce, int32_t(type), int32_t(op), 0, count}, send, recv));
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclReduceScatter";
  if (ncclResult_t r = check_op(fn, op); r != ncclSuccess) return group_failed(r);
  const size_t nr = comm && live(comm) ? size_t(comm->nranks) : 1;
  const size_t rank = comm && live(comm) ? size_t(comm->rank) : 0;
  if (ncclResult_t r = check_collective(fn, comm, type, stream, send, nr * recv_count, recv, recv_count,
                                        -ptrdiff_t(rank * recv_count));  // in place: recv == send + rank * count
      r != ncclSuccess)
    return group_failed(r);
  return group_failed(
      collective(fn, comm, stream, {kReduceScatter, int32_t(type), int32_t(op), 0, recv_count}, send, recv));
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* fn = "ncclAllGather";
  const size_t nr = comm && live(comm) ? size_t(comm->nranks) : 1;
  const size_t rank = comm && live(comm) ? size_t(comm->rank) : 0;
  if (ncclResult_t r = check_collective(fn, comm, type, stream, send, send_count, recv, nr * send_count,
                                        ptrdiff_t(rank * send_count));  // in place: send == recv + rank * count
      r != ncclSuccess)
    return group_failed(r);
  return group_failed(collective(fn, comm, stream, {kAllGather, int32_t(type), 0, 0, send_count}, send, recv));
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* fn = "ncclBroadcast";
  if (ncclResult_t r = check_comm(fn, comm); r != ncclSuccess) return group_failed(r);
  if (root < 0 || root >= comm->nranks)
    return group_failed(error(ncclInvalidArgument, fn, "root %d of a communicator of %d", root, comm->nranks));
  // The send buffer is read on the root only.
  const bool is_root = comm->rank == root;
  if (ncclResult_t r = check_collective(fn, comm, type, stream, is_root ? send : recv, count, recv, count, 0);
      r != ncclSuccess)
    return group_failed(r);
  return group_failed(collective(fn, comm, stream, {kBroadcast, int32_t(type), 0, root, count}, send, recv));
}

// ---- point-to-point ----

static ncclResult_t p2p(bool send, const char* fn, const void* buf, size_t count, ncclDataType_t type, int peer,
                        ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(fn, comm); r != ncclSuccess) return r;
  if (!type_size(type)) return error(ncclInvalidArgument, fn, "%d is not an ncclDataType_t", int(type));
  if (peer < 0 || peer >= comm->nranks)
    return error(ncclInvalidArgument, fn, "peer %d of a communicator of %d", peer, comm->nranks);
  if (!emu::detail::valid_stream(stream)) return error(ncclInvalidArgument, fn, "not a live stream");
  if (ncclResult_t r = check_buffer(fn, send ? "the send" : "the receive", buf, count * type_size(type));
      r != ncclSuccess)
    return r;
  if (t_group_depth == 0 && peer == comm->rank)  // (checked before the op takes its place in the order)
    return error(ncclInvalidUsage, fn,
                 "a %s to rank %d (itself) outside ncclGroupStart/ncclGroupEnd: its matching %s cannot be posted "
                 "while it waits, so on a GPU it never completes",
                 send ? "send" : "receive", peer, send ? "receive" : "send");
  Issued op{std::make_unique<PointToPoint>(send, comm, peer, buf, count, type), comm, stream, fn, true, send, peer,
            count, type};
  return issue(std::move(op));
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return group_failed(p2p(true, "ncclSend", send, count, type, peer, comm, stream));
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  return group_failed(p2p(false, "ncclRecv", recv, count, type, peer, comm, stream));
}

// ---- groups ----

ncclResult_t ncclGroupStart() {
  if (t_group_depth++ == 0) {
    t_group.clear();
    t_group_error = ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  const char* fn = "ncclGroupEnd";
  if (t_group_depth == 0) return error(ncclInvalidUsage, fn, "without ncclGroupStart");
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Issued> ops;
  ops.swap(t_group);
  // Parts are built when issued (their place in each order is taken then): an op of a refused
  // group gives its place back.
  const auto unissue = [&] {
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      ncclComm* c = it->comm;
      if (!it->p2p)
        --c->coll_issued;
      else
        --(it->send ? c->send_issued : c->recv_issued)[size_t(it->peer)];
    }
  };
  if (t_group_error != ncclSuccess) {  // an op of the group was refused: nothing of it runs
    const ncclResult_t r = t_group_error;
    t_group_error = ncclSuccess;
    unissue();
    return error(r, fn, "the group had a refused operation; none of its operations ran");
  }
  if (ops.empty()) return ncclSuccess;
  for (const Issued& op : ops)
    if (op.stream != ops[0].stream) {
      unissue();
      return error(ncclInvalidUsage, fn, "a group with operations on several streams is not emulated");
    }
  // One rank: the n-th send to self meets the n-th receive from self, or the group never ends.
  std::vector<bool> matched(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].p2p || !ops[i].send || ops[i].comm->nranks != 1) continue;
    size_t j = 0;
    for (; j < ops.size(); ++j)
      if (!matched[j] && ops[j].p2p && !ops[j].send && ops[j].comm == ops[i].comm) break;
    if (j == ops.size()) {
      unissue();
      return error(ncclInvalidUsage, fn,
                   "a send of %zu elements to rank %d has no matching receive in the group: on a GPU it never "
                   "completes",
                   ops[i].count, ops[i].peer);
    }
    if (ops[j].count != ops[i].count || ops[j].type != ops[i].type) {
      unissue();
      return error(ncclInvalidUsage, fn,
                   "a send of %zu elements of type %d meets a receive of %zu elements of type %d: NCCL needs the "
                   "same count and type on both sides (a GPU hangs or corrupts memory)",
                   ops[i].count, int(ops[i].type), ops[j].count, int(ops[j].type));
    }
    matched[i] = matched[j] = true;
  }
  for (size_t j = 0; j < ops.size(); ++j)
    if (ops[j].p2p && !ops[j].send && ops[j].comm->nranks == 1 && !matched[j]) {
      unissue();
      return error(ncclInvalidUsage, fn,
                   "a receive of %zu elements from rank %d has no matching send in the group: on a GPU it never "
                   "completes",
                   ops[j].count, ops[j].peer);
    }
  queue(std::move(ops));
  return ncclSuccess;
}

}  // extern "C"
