#include "parallel/nccl_process_group.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/cuda/runtime.h"

namespace primus::parallel {

namespace {

// Serialises the ops of every NCCL group of the process (an NCCL communicator must not be used
// by two threads at once) and guards the queued point-to-point batches.
std::mutex& nccl_mutex() {
  static std::mutex m;
  return m;
}

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::F32: return ncclFloat32;
    case CommType::F64: return ncclFloat64;
    case CommType::BF16: return ncclBfloat16;
    case CommType::F16: return ncclFloat16;
    case CommType::I32: return ncclInt32;
    case CommType::I64: return ncclInt64;
    case CommType::U8: return ncclUint8;
  }
  fail("no NCCL type for wire type {}", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  fail("no NCCL reduction for op {}", static_cast<int>(op));
}

std::string nccl_message(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  if (last && *last) return fmt::format("{} ({})", ncclGetErrorString(r), last);
  return ncclGetErrorString(r);
}

// The completion of one posted op (or of one batch of point-to-point ops).
struct OpState {
  cudaEvent_t done = nullptr;  // recorded on the group's stream after the op; null: nothing to wait for
  bool issued = false;         // false while the op waits in a point-to-point batch
  ~OpState() {
    if (done) cudaEventDestroy(done);  // fine while pending: released once it completes
  }
};

std::shared_ptr<OpState> new_op_state() {
  auto s = std::make_shared<OpState>();
  PRIMUS_CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
  return s;
}

enum class Memory { Device, OtherDevice, Host };

Memory classify(const void* p, int* owner) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {  // older runtimes: an unregistered host pointer is an error
    cudaGetLastError();
    return Memory::Host;
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return Memory::Host;
  int current = 0;
  PRIMUS_CUDA_CHECK(cudaGetDevice(&current));
  *owner = a.device;
  return a.device == current ? Memory::Device : Memory::OtherDevice;
}

}  // namespace

// ---- Core: what outlives the group object while Works still refer to it ----

struct NcclProcessGroup::Core {
  struct P2p {
    bool send;
    void* buf;
    size_t count;
    ncclDataType_t type;
    int peer;
  };

  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the compute stream when an op is posted
  std::string desc;             // the group's describe(), for messages
  std::vector<P2p> queued;      // point-to-point ops not yet issued
  std::shared_ptr<OpState> queued_state;  // their common completion

  static std::vector<Core*>& registry() {  // every live core (under nccl_mutex)
    static std::vector<Core*> r;
    return r;
  }

  explicit Core(ncclComm_t c) : comm(c) {
    std::lock_guard<std::mutex> lock(nccl_mutex());
    registry().push_back(this);
  }

  ~Core() {
    std::lock_guard<std::mutex> lock(nccl_mutex());
    try {
      issue_queued();
    } catch (...) {
    }
    auto& r = registry();
    r.erase(std::remove(r.begin(), r.end(), this), r.end());
    if (stream) cudaStreamSynchronize(stream);
    if (comm) ncclCommDestroy(comm);
    if (ready) cudaEventDestroy(ready);
    if (stream) cudaStreamDestroy(stream);
    cudaGetLastError();  // leave no sticky error behind for the next CUDA call
  }

  void init_stream() {
    PRIMUS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    PRIMUS_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  }

  void check(ncclResult_t r, const char* op) const {
    if (r != ncclSuccess && r != ncclInProgress) fail("{} on {} failed: {}", op, desc, nccl_message(r, comm));
  }

  // The communication stream waits for what the compute stream holds now.
  void order_after_compute() {
    PRIMUS_CUDA_CHECK(cudaEventRecord(ready, cuda::stream()));
    PRIMUS_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
  }

  std::shared_ptr<OpState> record_done() {
    auto s = new_op_state();
    PRIMUS_CUDA_CHECK(cudaEventRecord(s->done, stream));
    s->issued = true;
    return s;
  }

  // Issues the queued point-to-point ops as one NCCL group (under nccl_mutex).
  void issue_queued() {
    if (queued.empty()) return;
    std::vector<P2p> ops;
    ops.swap(queued);
    std::shared_ptr<OpState> st = std::move(queued_state);
    queued_state.reset();
    cudaError_t ce = cudaStreamWaitEvent(stream, ready, 0);  // ready: recorded by the last queued post
    ncclResult_t first = ncclGroupStart();
    if (first == ncclSuccess) {
      for (const P2p& op : ops) {
        const ncclResult_t r = op.send ? ncclSend(op.buf, op.count, op.type, op.peer, comm, stream)
                                       : ncclRecv(op.buf, op.count, op.type, op.peer, comm, stream);
        if (r != ncclSuccess && first == ncclSuccess) first = r;
      }
      const ncclResult_t r = ncclGroupEnd();  // always close the group
      if (r != ncclSuccess && first == ncclSuccess) first = r;
    }
    // Record even after a failure, so that waiting on the batch's Works cannot hang on it.
    const cudaError_t ce2 = cudaEventRecord(st->done, stream);
    st->issued = true;
    if (first != ncclSuccess && first != ncclInProgress)
      fail("isend/irecv batch of {} op{} on {} failed: {}", ops.size(), ops.size() == 1 ? "" : "s", desc,
           nccl_message(first, comm));
    PRIMUS_CUDA_CHECK(ce);
    PRIMUS_CUDA_CHECK(ce2);
  }

  // Before anything else on any group: queued sends and receives go out first, in post order.
  static void issue_all_queued() {
    for (Core* c : registry()) c->issue_queued();
  }
};

namespace {

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclProcessGroup::Core> core, std::shared_ptr<OpState> state, std::string what)
      : core_(std::move(core)), state_(std::move(state)), what_(std::move(what)) {}

  ~NcclWork() override {
    if (waited_) return;
    // Completed in stream order: later compute work (and whoever gets memory freed with this
    // Work) waits for the transfer.
    try {
      ensure_issued();
      if (state_->done) cudaStreamWaitEvent(cuda::stream(), state_->done, 0);
    } catch (...) {
    }
  }

  void wait() override {
    if (waited_) return;
    ensure_issued();
    if (state_->done) PRIMUS_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), state_->done, 0));
    waited_ = true;
  }

  bool test() override {
    ensure_issued();
    if (!state_->done) return true;
    const cudaError_t e = cudaEventQuery(state_->done);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      cudaGetLastError();
      fail("{} failed: CUDA error {} ({})", what_, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(core_->comm, &async);
    if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
      fail("{} failed: {}", what_, nccl_message(async, core_->comm));
    return false;
  }

 private:
  void ensure_issued() {
    std::lock_guard<std::mutex> lock(nccl_mutex());
    if (!state_->issued) NcclProcessGroup::Core::issue_all_queued();
  }

  std::shared_ptr<NcclProcessGroup::Core> core_;
  std::shared_ptr<OpState> state_;
  std::string what_;
  bool waited_ = false;
};

WorkPtr done_work(const std::shared_ptr<NcclProcessGroup::Core>& core, std::string what) {
  auto s = std::make_shared<OpState>();
  s->issued = true;  // nothing was posted (zero elements)
  return std::make_unique<NcclWork>(core, std::move(s), std::move(what));
}

}  // namespace

// ---- the group ----

NcclProcessGroup::NcclProcessGroup(std::shared_ptr<Core> core, std::string name, std::vector<int> world_ranks)
    : core_(std::move(core)), name_(std::move(name)), world_ranks_(std::move(world_ranks)) {
  PRIMUS_CHECK(ncclCommCount(core_->comm, &size_) == ncclSuccess, "ncclCommCount failed");
  PRIMUS_CHECK(ncclCommUserRank(core_->comm, &rank_) == ncclSuccess, "ncclCommUserRank failed");
  PRIMUS_CHECK(static_cast<int>(world_ranks_.size()) == size_, "{} world ranks listed for a communicator of {}",
               world_ranks_.size(), size_);
  core_->desc = describe();
}

NcclProcessGroup::~NcclProcessGroup() = default;  // the Core goes when its last Work does

ncclComm_t NcclProcessGroup::comm() const { return core_->comm; }
cudaStream_t NcclProcessGroup::comm_stream() const { return core_->stream; }

std::unique_ptr<NcclProcessGroup> NcclProcessGroup::create(ProcessGroup& bootstrap, const std::string& name) {
  if (!cuda::initialized())
    fail("NcclProcessGroup::create('{}'): call cuda::init(device) first (one GPU per process)", name);
  if (bootstrap.device() != Device::CPU)
    fail("NcclProcessGroup::create('{}'): the bootstrap group must be a CPU group (MPI or self), not {}", name,
         bootstrap.describe());
  // Rank 0 makes the id; a failure there is broadcast too, so that no rank is left waiting.
  struct {
    int32_t ok;
    ncclUniqueId id;
  } msg;
  std::memset(&msg, 0, sizeof(msg));
  std::string why;
  if (bootstrap.rank() == 0) {
    const ncclResult_t r = ncclGetUniqueId(&msg.id);
    msg.ok = r == ncclSuccess;
    if (r != ncclSuccess) why = nccl_message(r, nullptr);
  }
  bootstrap.broadcast(&msg, static_cast<int64_t>(sizeof(msg)), CommType::U8, 0);
  if (!msg.ok)
    fail("NcclProcessGroup::create('{}') over {}: ncclGetUniqueId failed on rank 0{}", name, bootstrap.describe(),
         why.empty() ? "" : ": " + why);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, bootstrap.size(), msg.id, bootstrap.rank());
  if (r != ncclSuccess)
    fail("NcclProcessGroup::create('{}'): ncclCommInitRank (rank {} of {}) over {} failed: {}", name,
         bootstrap.rank(), bootstrap.size(), bootstrap.describe(), nccl_message(r, comm));
  auto core = std::make_shared<Core>(comm);
  core->desc = fmt::format("{} group", name);
  core->init_stream();
  return std::unique_ptr<NcclProcessGroup>(new NcclProcessGroup(std::move(core), name, bootstrap.world_ranks()));
}

void NcclProcessGroup::check_device_buffer(const char* op, const char* what, const void* p) const {
  int owner = -1;
  switch (classify(p, &owner)) {
    case Memory::Device: return;
    case Memory::OtherDevice: {
      int current = 0;
      cudaGetDevice(&current);
      fail("{} on {}: {} buffer {} lives on GPU {} but this process drives GPU {}", op, describe(), what, p, owner,
           current);
    }
    case Memory::Host:
      fail("{} on {}: {} buffer {} is host memory; the nccl backend needs device (CUDA) buffers", op, describe(),
           what, p);
  }
}

// ---- collectives ----

WorkPtr NcclProcessGroup::iall_reduce(void* buf, int64_t count, CommType t, ReduceOp op) {
  check_count("iall_reduce", count);
  const std::string what = "iall_reduce on " + describe();
  if (count == 0) return done_work(core_, what);
  check_device_buffer("iall_reduce", "the", buf);
  std::lock_guard<std::mutex> lock(nccl_mutex());
  Core::issue_all_queued();
  core_->order_after_compute();
  core_->check(ncclAllReduce(buf, buf, size_t(count), nccl_type(t), nccl_op(op), core_->comm, core_->stream),
               "all_reduce");
  return std::make_unique<NcclWork>(core_, core_->record_done(), what);
}

WorkPtr NcclProcessGroup::ireduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t,
                                          ReduceOp op) {
  check_count("ireduce_scatter", recv_count);
  const std::string what = "ireduce_scatter on " + describe();
  if (recv_count == 0) return done_work(core_, what);
  check_device_buffer("ireduce_scatter", "the send", send);
  check_device_buffer("ireduce_scatter", "the receive", recv);
  std::lock_guard<std::mutex> lock(nccl_mutex());
  Core::issue_all_queued();
  core_->order_after_compute();
  core_->check(ncclReduceScatter(send, recv, size_t(recv_count), nccl_type(t), nccl_op(op), core_->comm,
                                 core_->stream),
               "reduce_scatter");
  return std::make_unique<NcclWork>(core_, core_->record_done(), what);
}

WorkPtr NcclProcessGroup::iall_gather(const void* send, void* recv, int64_t send_count, CommType t) {
  check_count("iall_gather", send_count);
  const std::string what = "iall_gather on " + describe();
  if (send_count == 0) return done_work(core_, what);
  check_device_buffer("iall_gather", "the send", send);
  check_device_buffer("iall_gather", "the receive", recv);
  std::lock_guard<std::mutex> lock(nccl_mutex());
  Core::issue_all_queued();
  core_->order_after_compute();
  core_->check(ncclAllGather(send, recv, size_t(send_count), nccl_type(t), core_->comm, core_->stream),
               "all_gather");
  return std::make_unique<NcclWork>(core_, core_->record_done(), what);
}

void NcclProcessGroup::all_reduce(void* buf, int64_t count, CommType t, ReduceOp op) {
  check_count("all_reduce", count);
  if (count == 0) return;
  int owner = -1;
  if (classify(buf, &owner) != Memory::Host) {
    iall_reduce(buf, count, t, op)->wait();  // a buffer on another GPU is refused there
    return;
  }
  // A small host buffer (the typed host helpers): through device memory, synchronously.
  const size_t bytes = size_t(count) * comm_type_size(t);
  if (bytes > kMaxHostStagingBytes)
    fail("all_reduce on {}: the buffer {} is host memory ({} bytes); the nccl backend stages host buffers of at "
         "most {} bytes (small values: loss sums, counts); pass device (CUDA) buffers",
         describe(), buf, bytes, kMaxHostStagingBytes);
  cuda::Scratch tmp(bytes);
  cuda::copy_to_device(tmp.get(), buf, bytes);
  iall_reduce(tmp.get(), count, t, op)->wait();
  cuda::copy_to_host(buf, tmp.get(), bytes);  // on the compute stream, after the wait: synchronous
}

void NcclProcessGroup::reduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp op) {
  ireduce_scatter(send, recv, recv_count, t, op)->wait();
}

void NcclProcessGroup::all_gather(const void* send, void* recv, int64_t send_count, CommType t) {
  iall_gather(send, recv, send_count, t)->wait();
}

void NcclProcessGroup::broadcast(void* buf, int64_t count, CommType t, int root) {
  check_rank("broadcast", "root", root);
  check_count("broadcast", count);
  if (count == 0) return;
  check_device_buffer("broadcast", "the", buf);
  std::shared_ptr<OpState> st;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex());
    Core::issue_all_queued();
    core_->order_after_compute();
    core_->check(ncclBroadcast(buf, buf, size_t(count), nccl_type(t), root, core_->comm, core_->stream),
                 "broadcast");
    st = core_->record_done();
  }
  NcclWork(core_, std::move(st), "broadcast on " + describe()).wait();
}

void NcclProcessGroup::all_to_all(const void* send, void* recv, int64_t count_per_rank, CommType t) {
  check_count("all_to_all", count_per_rank);
  if (count_per_rank == 0) return;
  check_device_buffer("all_to_all", "the send", send);
  check_device_buffer("all_to_all", "the receive", recv);
  const size_t chunk = size_t(count_per_rank) * comm_type_size(t);
  const ncclDataType_t type = nccl_type(t);
  std::shared_ptr<OpState> st;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex());
    Core::issue_all_queued();
    core_->order_after_compute();
    ncclResult_t first = ncclGroupStart();
    if (first == ncclSuccess) {
      for (int r = 0; r < size_; ++r) {
        const ncclResult_t a = ncclSend(static_cast<const char*>(send) + size_t(r) * chunk, size_t(count_per_rank),
                                        type, r, core_->comm, core_->stream);
        const ncclResult_t b = ncclRecv(static_cast<char*>(recv) + size_t(r) * chunk, size_t(count_per_rank), type,
                                        r, core_->comm, core_->stream);
        if (first == ncclSuccess) first = a != ncclSuccess ? a : b;
      }
      const ncclResult_t e = ncclGroupEnd();
      if (first == ncclSuccess) first = e;
    }
    st = core_->record_done();
    core_->check(first, "all_to_all");
  }
  NcclWork(core_, std::move(st), "all_to_all on " + describe()).wait();
}

void NcclProcessGroup::barrier() {
  cuda::Scratch flag(1);
  PRIMUS_CUDA_CHECK(cudaMemsetAsync(flag.get(), 0, 1, cuda::stream()));
  {
    std::lock_guard<std::mutex> lock(nccl_mutex());
    Core::issue_all_queued();
    core_->order_after_compute();
    core_->check(ncclAllReduce(flag.get(), flag.get(), 1, ncclUint8, ncclMax, core_->comm, core_->stream), "barrier");
  }
  const cudaError_t e = cudaStreamSynchronize(core_->stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("barrier on {} failed: CUDA error {} ({})", describe(), cudaGetErrorName(e), cudaGetErrorString(e));
  }
}

// ---- point-to-point: queued, issued as one NCCL group (see the header) ----

WorkPtr NcclProcessGroup::isend(const void* buf, int64_t count, CommType t, int dst, int tag) {
  check_rank("isend", "destination rank", dst);
  if (tag < 0) fail("isend on {}: negative tag {}", describe(), tag);
  check_count("isend", count);
  std::string what =
      fmt::format("isend of {} {} to rank {} (tag {}) on {}", count, comm_type_name(t), dst, tag, describe());
  if (count == 0) return done_work(core_, std::move(what));
  check_device_buffer("isend", "the", buf);
  std::lock_guard<std::mutex> lock(nccl_mutex());
  if (core_->queued.empty()) core_->queued_state = new_op_state();
  PRIMUS_CUDA_CHECK(cudaEventRecord(core_->ready, cuda::stream()));
  core_->queued.push_back({true, const_cast<void*>(buf), size_t(count), nccl_type(t), dst});
  return std::make_unique<NcclWork>(core_, core_->queued_state, std::move(what));
}

WorkPtr NcclProcessGroup::irecv(void* buf, int64_t count, CommType t, int src, int tag) {
  check_rank("irecv", "source rank", src);
  if (tag < 0) fail("irecv on {}: negative tag {}", describe(), tag);
  check_count("irecv", count);
  std::string what =
      fmt::format("irecv of {} {} from rank {} (tag {}) on {}", count, comm_type_name(t), src, tag, describe());
  if (count == 0) return done_work(core_, std::move(what));
  check_device_buffer("irecv", "the", buf);
  std::lock_guard<std::mutex> lock(nccl_mutex());
  if (core_->queued.empty()) core_->queued_state = new_op_state();
  PRIMUS_CUDA_CHECK(cudaEventRecord(core_->ready, cuda::stream()));
  core_->queued.push_back({false, buf, size_t(count), nccl_type(t), src});
  return std::make_unique<NcclWork>(core_, core_->queued_state, std::move(what));
}

// ---- sub-groups ----

std::unique_ptr<ProcessGroup> NcclProcessGroup::split(int color, int key, const std::string& name) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  ncclComm_t sub = nullptr;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex());
    Core::issue_all_queued();
    // ncclCommSplit is not stream-ordered: let this group's communication drain first.
    PRIMUS_CUDA_CHECK(cudaStreamSynchronize(core_->stream));
    const ncclResult_t r = ncclCommSplit(core_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr);
    if (r != ncclSuccess)
      fail("split of {} into '{}' (color {}, key {}) failed: {}", describe(), name, color, key,
           nccl_message(r, core_->comm));
  }
  if (color < 0 || sub == nullptr) {
    if (sub) ncclCommDestroy(sub);
    return nullptr;
  }
  auto core = std::make_shared<Core>(sub);
  core->desc = fmt::format("{} group", name);
  core->init_stream();
  int n = 0;
  if (ncclCommCount(sub, &n) != ncclSuccess || n <= 0) fail("split of {} into '{}': ncclCommCount failed", describe(), name);
  std::unique_ptr<NcclProcessGroup> g(new NcclProcessGroup(core, name, std::vector<int>(size_t(n), -1)));
  // The members' world ranks, gathered over the new communicator itself (in its rank order).
  const int32_t me = world_ranks_[size_t(rank_)];
  cuda::Scratch dev(size_t(n) * sizeof(int32_t));
  int32_t* slots = dev.as<int32_t>();
  cuda::copy_to_device(slots + g->rank_, &me, sizeof(me));
  g->all_gather(slots + g->rank_, slots, 1, CommType::I32);  // in place (NCCL allows send = recv + rank)
  std::vector<int32_t> ranks(static_cast<size_t>(n));
  cuda::copy_to_host(ranks.data(), slots, ranks.size() * sizeof(int32_t));
  g->world_ranks_.assign(ranks.begin(), ranks.end());
  core->desc = g->describe();
  return g;
#else
  fail("split of {} into '{}': the nccl backend needs NCCL >= 2.18 (ncclCommSplit); this build has {}.{}.{}",
       describe(), name, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#endif
}

}  // namespace primus::parallel
