// The NCCL functions src/parallel/nccl_process_group.cpp calls, for the emulated device: one GPU,
// so communicators of one rank (what tests/gpu/test_nccl.cpp runs). The test binary links these
// instead of libnccl.
//
// Semantics (nccl.h; NCCL's user guide): collectives of one rank copy their input to their output
// (sums, products, maxima, minima and averages of one value are that value); in-place is
// recvbuff == sendbuff (+ rank * count for reduce-scatter and all-gather). Work runs when it is
// enqueued, in stream order, as in the emulated runtime (emu/runtime_api.cpp). Point-to-point:
// within ncclGroupStart/ncclGroupEnd, the n-th ncclSend to a peer meets the peer's n-th ncclRecv
// from this rank, with the same count and type; the copies happen at the outermost ncclGroupEnd.
//
// Strict where a GPU would hang or corrupt memory: a send or receive to self outside a group, or
// one left unmatched when its group ends, is ncclInvalidUsage (NCCL would wait forever), as are a
// matched pair whose counts or types differ; a buffer outside the device allocations, an
// unknown type or reduction, a root or peer outside the communicator, overlapping send and
// receive buffers that are not the in-place layout, and a destroyed communicator are
// ncclInvalidArgument. nranks other than 1 is ncclInvalidArgument: one emulated GPU cannot run a
// second rank. Every error is explained on stderr and by ncclGetLastError.
#include <nccl.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "emu/emulator.h"

struct ncclComm {
  int rank = 0, nranks = 1;
  int device = 0;
};

namespace {

using emu::detail::find_allocation;

constexpr char kIdMagic[] = "primus-emulated-nccl-id";

struct State {
  std::mutex mu;
  std::set<ncclComm*> comms;
};
State& st() {
  static State s;
  return s;
}

thread_local std::string t_last_error;

// One operation of a group, run at its end.
struct Op {
  enum Kind { Copy, Send, Recv } kind;
  const char* what;
  ncclComm* comm;
  const void* src;
  void* dst;
  size_t count;
  ncclDataType_t type;
  int peer;
};
thread_local int t_group_depth = 0;
thread_local std::vector<Op> t_group;
thread_local ncclResult_t t_group_error = ncclSuccess;  // the first error inside the open group

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

// Runs an op now, or queues it in the open group.
ncclResult_t enqueue(const Op& op) {
  if (t_group_depth > 0) {
    t_group.push_back(op);
    return ncclSuccess;
  }
  if (op.kind != Op::Copy)
    return error(ncclInvalidUsage, op.what,
                 "a %s to rank %d (itself) outside ncclGroupStart/ncclGroupEnd: its matching %s cannot be posted "
                 "while it waits, so on a GPU it never completes",
                 op.kind == Op::Send ? "send" : "receive", op.peer, op.kind == Op::Send ? "receive" : "send");
  if (op.count) std::memmove(op.dst, op.src, op.count * type_size(op.type));
  return ncclSuccess;
}

ncclResult_t group_failed(ncclResult_t r) {
  if (t_group_depth > 0 && t_group_error == ncclSuccess) t_group_error = r;
  return r;
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
  static std::mt19937_64 rng{std::random_device{}()};
  const uint64_t r = rng();
  std::memcpy(id->internal + sizeof kIdMagic, &r, sizeof r);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  const char* fn = "ncclCommInitRank";
  if (!comm) return error(ncclInvalidArgument, fn, "null communicator pointer");
  if (std::memcmp(id.internal, kIdMagic, sizeof kIdMagic) != 0)
    return error(ncclInvalidArgument, fn, "the id was not made by ncclGetUniqueId");
  if (nranks != 1)
    return error(ncclInvalidArgument, fn,
                 "nranks %d: the emulated NCCL runs communicators of one rank only (one emulated GPU)", nranks);
  if (rank != 0) return error(ncclInvalidArgument, fn, "rank %d of a communicator of 1", rank);
  int device = 0;
  cudaGetDevice(&device);
  auto* c = new ncclComm{0, 1, device};
  std::lock_guard<std::mutex> lock(st().mu);
  st().comms.insert(c);
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  const char* fn = "ncclCommSplit";
  if (ncclResult_t r = check_comm(fn, comm); r != ncclSuccess) return r;
  if (!newcomm) return error(ncclInvalidArgument, fn, "null communicator pointer");
  if (t_group_depth > 0) return error(ncclInvalidUsage, fn, "inside a group (not emulated)");
  if (color < NCCL_SPLIT_NOCOLOR) return error(ncclInvalidArgument, fn, "color %d", color);
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  auto* c = new ncclComm{0, 1, comm->device};
  std::lock_guard<std::mutex> lock(st().mu);
  st().comms.insert(c);
  *newcomm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  const char* fn = "ncclCommDestroy";
  if (!comm) return ncclSuccess;
  for (const Op& op : t_group)
    if (op.comm == comm) return error(ncclInvalidUsage, fn, "the communicator has operations in an open group");
  std::lock_guard<std::mutex> lock(st().mu);
  if (!st().comms.erase(comm)) return error(ncclInvalidArgument, fn, "not a live communicator");
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (ncclResult_t r = check_comm("ncclCommGetAsyncError", comm); r != ncclSuccess) return r;
  if (!async_error) return error(ncclInvalidArgument, "ncclCommGetAsyncError", "null result pointer");
  *async_error = ncclSuccess;  // work runs when enqueued: nothing is ever pending
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

static ncclResult_t check_op(const char* fn, ncclRedOp_t op) {
  if (int(op) < 0 || int(op) >= int(ncclNumOps))
    return error(ncclInvalidArgument, fn, "%d is not a built-in ncclRedOp_t (custom operators are not emulated)",
                 int(op));
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  if (ncclResult_t r = check_op(fn, op); r != ncclSuccess) return group_failed(r);
  if (ncclResult_t r = check_collective(fn, comm, type, stream, send, count, recv, count, 0); r != ncclSuccess)
    return group_failed(r);
  return group_failed(enqueue({Op::Copy, fn, comm, send, recv, count, type, 0}));
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
  return group_failed(enqueue({Op::Copy, fn, comm, send, recv, recv_count, type, 0}));
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
  return group_failed(enqueue({Op::Copy, fn, comm, send, static_cast<char*>(recv) + rank * send_count * type_size(type),
                               send_count, type, 0}));
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* fn = "ncclBroadcast";
  if (ncclResult_t r = check_comm(fn, comm); r != ncclSuccess) return group_failed(r);
  if (root < 0 || root >= comm->nranks)
    return group_failed(error(ncclInvalidArgument, fn, "root %d of a communicator of %d", root, comm->nranks));
  if (ncclResult_t r = check_collective(fn, comm, type, stream, send, count, recv, count, 0); r != ncclSuccess)
    return group_failed(r);
  return group_failed(enqueue({Op::Copy, fn, comm, send, recv, count, type, 0}));
}

// ---- point-to-point ----

static ncclResult_t p2p(Op::Kind kind, const char* fn, const void* send, void* recv, size_t count,
                        ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_comm(fn, comm); r != ncclSuccess) return r;
  if (!type_size(type)) return error(ncclInvalidArgument, fn, "%d is not an ncclDataType_t", int(type));
  if (peer < 0 || peer >= comm->nranks)
    return error(ncclInvalidArgument, fn, "peer %d of a communicator of %d", peer, comm->nranks);
  if (!emu::detail::valid_stream(stream)) return error(ncclInvalidArgument, fn, "not a live stream");
  const void* buf = kind == Op::Send ? send : recv;
  if (ncclResult_t r = check_buffer(fn, kind == Op::Send ? "the send" : "the receive", buf, count * type_size(type));
      r != ncclSuccess)
    return r;
  return enqueue({kind, fn, comm, send, recv, count, type, peer});
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return group_failed(p2p(Op::Send, "ncclSend", send, nullptr, count, type, peer, comm, stream));
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  return group_failed(p2p(Op::Recv, "ncclRecv", nullptr, recv, count, type, peer, comm, stream));
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
  std::vector<Op> ops;
  ops.swap(t_group);
  if (t_group_error != ncclSuccess) {  // an op of the group was refused: nothing of it runs
    const ncclResult_t r = t_group_error;
    t_group_error = ncclSuccess;
    return error(r, fn, "the group had a refused operation; none of its operations ran");
  }
  // Match the n-th send to each peer with that peer's n-th receive from this rank (one rank: the
  // sends and receives of each communicator, in posting order).
  std::vector<std::pair<const Op*, const Op*>> pairs;
  std::vector<bool> matched(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != Op::Send) continue;
    size_t j = 0;
    for (; j < ops.size(); ++j)
      if (!matched[j] && ops[j].kind == Op::Recv && ops[j].comm == ops[i].comm && ops[j].peer == ops[i].comm->rank)
        break;
    if (j == ops.size())
      return error(ncclInvalidUsage, fn,
                   "a send of %zu elements to rank %d has no matching receive in the group: on a GPU it never "
                   "completes",
                   ops[i].count, ops[i].peer);
    if (ops[j].count != ops[i].count || ops[j].type != ops[i].type)
      return error(ncclInvalidUsage, fn,
                   "a send of %zu elements of type %d meets a receive of %zu elements of type %d: NCCL needs the "
                   "same count and type on both sides (a GPU hangs or corrupts memory)",
                   ops[i].count, int(ops[i].type), ops[j].count, int(ops[j].type));
    matched[i] = matched[j] = true;
    pairs.push_back({&ops[i], &ops[j]});
  }
  for (size_t j = 0; j < ops.size(); ++j)
    if (ops[j].kind == Op::Recv && !matched[j])
      return error(ncclInvalidUsage, fn,
                   "a receive of %zu elements from rank %d has no matching send in the group: on a GPU it never "
                   "completes",
                   ops[j].count, ops[j].peer);
  for (const Op& op : ops)
    if (op.kind == Op::Copy && op.count) std::memmove(op.dst, op.src, op.count * type_size(op.type));
  for (const auto& [s, r] : pairs)
    if (s->count) std::memmove(r->dst, s->src, s->count * type_size(s->type));
  return ncclSuccess;
}

}  // extern "C"
