#include "parallel/mpi_process_group.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <sched.h>

#include <fmt/format.h>

#include "core/error.h"

namespace primus::parallel {

namespace {

std::mutex g_mutex;
ThreadLevel g_level = ThreadLevel::Single;
bool g_initialized_by_us = false;
MpiProcessGroup* g_world = nullptr;

bool finalized();

// The progress thread (set_mpi_progress_interval): wakes while operations are in flight.
class ProgressEngine {
 public:
  ~ProgressEngine() { stop(); }
  bool start(int64_t interval_us) {
    stop();
    if (interval_us <= 0 || g_level != ThreadLevel::Multiple) return false;
    if (MPI_Comm_dup(MPI_COMM_SELF, &probe_) != MPI_SUCCESS) return false;
    interval_ = std::chrono::microseconds(interval_us);
    quit_ = false;
    thread_ = std::thread([this] { loop(); });
    return true;
  }
  void stop() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(m_);
      quit_ = true;
    }
    cv_.notify_one();
    thread_.join();
    if (!finalized()) MPI_Comm_free(&probe_);
  }
  bool running() const { return thread_.joinable(); }
  void begin() {
    if (inflight_.fetch_add(1) == 0 && running()) {
      std::lock_guard<std::mutex> lock(m_);
      cv_.notify_one();
    }
  }
  void end() { inflight_.fetch_sub(1); }
  int64_t passes() const { return passes_.load(); }

 private:
  void loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return quit_ || inflight_.load() > 0; });
        if (quit_) return;
      }
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, probe_, &flag, MPI_STATUS_IGNORE);  // runs MPI's progress
      passes_.fetch_add(1);
      std::this_thread::sleep_for(interval_);
    }
  }
  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<int> inflight_{0};
  std::atomic<int64_t> passes_{0};
  bool quit_ = false;
  std::chrono::microseconds interval_{0};
  MPI_Comm probe_ = MPI_COMM_NULL;
};

// How a rank waits for MPI (mpi_waits_by_sleeping in the header).
class Waiter {
 public:
  bool sleeps() const { return sleeps_; }
  // Once per process (later calls keep the first choice): a collective over `world`.
  void decide(MPI_Comm world) {
    if (decided_) return;
    decided_ = true;
    const char* env = std::getenv("PRIMUS_MPI_WAIT");
    const std::string mode = env && *env ? env : "auto";
    if (mode == "spin" || mode == "sleep") {
      sleeps_ = mode == "sleep";
      return;
    }
    if (mode != "auto") fail("PRIMUS_MPI_WAIT={}: not one of auto, spin, sleep", mode);
    int local = 1;
    MPI_Comm node;
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
      MPI_Comm_size(node, &local);
      MPI_Comm_free(&node);
    }
    cpu_set_t cores;
    CPU_ZERO(&cores);
    sleeps_ = local > (sched_getaffinity(0, sizeof cores, &cores) == 0 ? CPU_COUNT(&cores) : 1);
  }
  // MPI_Wait's contract: MPI's own wait, or MPI_Test with sleeps between tries (2 us doubling
  // to 100 us: the added latency is at most a pause, small beside a time slice).
  int wait(MPI_Request* req, MPI_Status* st) const {
    if (!sleeps_) return MPI_Wait(req, st);
    std::chrono::microseconds pause{2};
    for (;;) {
      int done = 0;
      const int rc = MPI_Test(req, &done, st);
      if (rc != MPI_SUCCESS || done) return rc;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(100));
    }
  }
  // A blocking collective: MPI's call when spinning, else its non-blocking twin, waited for.
  template <class Blocking, class Start>
  int collective(Blocking blocking, Start start) const {
    if (!sleeps_) return blocking();
    MPI_Request req;
    const int rc = start(&req);
    return rc != MPI_SUCCESS ? rc : wait(&req, MPI_STATUS_IGNORE);
  }

 private:
  bool sleeps_ = false;
  bool decided_ = false;
};
Waiter g_waiter;

ProgressEngine& progress() {
  static ProgressEngine* engine = new ProgressEngine();  // lives to the end; stopped by finalize_mpi
  return *engine;
}

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", rc);
  return std::string(buf, static_cast<size_t>(len));
}

bool finalized() {
  int f = 0;
  MPI_Finalized(&f);
  return f != 0;
}

ThreadLevel to_level(int provided) {
  if (provided >= MPI_THREAD_MULTIPLE) return ThreadLevel::Multiple;
  if (provided >= MPI_THREAD_SERIALIZED) return ThreadLevel::Serialized;
  if (provided >= MPI_THREAD_FUNNELED) return ThreadLevel::Funneled;
  return ThreadLevel::Single;
}

MPI_Datatype mpi_type(CommType t) {
  switch (t) {
    case CommType::F32: return MPI_FLOAT;
    case CommType::F64: return MPI_DOUBLE;
    case CommType::BF16: return MPI_UINT16_T;  // moved as raw 16-bit words
    case CommType::F16: return MPI_UINT16_T;
    case CommType::I32: return MPI_INT32_T;
    case CommType::I64: return MPI_INT64_T;
    case CommType::U8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

// bf16 reductions: MPI has no bf16 type, so bf16 words travel as 16-bit integers and these user
// operations combine them in fp32, rounding each result once to nearest even (as NCCL does).
template <ReduceOp kOp>
void bf16_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = bf16{a[i]}.to_float(), y = bf16{b[i]}.to_float();
    const float r = kOp == ReduceOp::Sum ? x + y : kOp == ReduceOp::Max ? std::max(x, y) : std::min(x, y);
    b[i] = bf16::from_float(r).bits;
  }
}

MPI_Op bf16_op(ReduceOp op) {
  static MPI_Op ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_Op_create(&bf16_reduce<ReduceOp::Sum>, 1, &ops[0]);
    MPI_Op_create(&bf16_reduce<ReduceOp::Max>, 1, &ops[1]);
    MPI_Op_create(&bf16_reduce<ReduceOp::Min>, 1, &ops[2]);
  });
  return ops[static_cast<int>(op)];
}

MPI_Op mpi_op(ReduceOp op, CommType t = CommType::F32) {
  if (t == CommType::BF16) return bf16_op(op);
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// MPI counts are int: a larger buffer must be split by the caller (DP buckets are far smaller).
int mpi_count(const ProcessGroup& g, const char* op, int64_t count) {
  if (count < 0) fail("{} on {}: negative element count {}", op, g.describe(), count);
  if (count > INT_MAX)
    fail("{} on {}: {} elements exceed the MPI limit of {} per call; split the buffer", op,
         g.describe(), count, INT_MAX);
  return static_cast<int>(count);
}

void check_reducible(const ProcessGroup& g, const char* op, CommType t, ReduceOp r) {
  if (t == CommType::F16)
    fail("{} ({}) on {}: the MPI backend cannot reduce {} (MPI has no such type); reduce in "
         "fp32 or bf16",
         op, reduce_op_name(r), g.describe(), comm_type_name(t));
}

class MpiWork final : public Work {
 public:
  // expect_count >= 0: a receive whose delivered element count must match exactly.
  MpiWork(MPI_Request req, std::string what, MPI_Datatype type, int64_t expect_count)
      : req_(req), what_(std::move(what)), type_(type), expect_count_(expect_count) {
    progress().begin();
  }

  ~MpiWork() override {
    if (done_ || finalized()) return;
    // Never leave a request that could still write into a freed buffer: a pending receive is
    // cancelled, anything else is completed.
    if (expect_count_ >= 0) MPI_Cancel(&req_);
    MPI_Wait(&req_, MPI_STATUS_IGNORE);
    progress().end();
  }

  void wait() override {
    if (done_) return;
    MPI_Status st;
    int rc = g_waiter.wait(&req_, &st);
    set_done();
    finish(rc, st);
  }

  bool test() override {
    if (done_) return true;
    MPI_Status st;
    int flag = 0;
    int rc = MPI_Test(&req_, &flag, &st);
    if (rc != MPI_SUCCESS) {
      set_done();
      finish(rc, st);
    }
    if (!flag) return false;
    set_done();
    finish(rc, st);
    return true;
  }

 private:
  void set_done() {
    done_ = true;
    progress().end();
  }
  void finish(int rc, const MPI_Status& st) {
    if (rc != MPI_SUCCESS) fail("{} failed: {}", what_, mpi_error_string(rc));
    if (expect_count_ >= 0) {
      int got = 0;
      MPI_Get_count(&st, type_, &got);
      if (got != expect_count_)
        fail("{}: received {} elements but {} were expected (sender and receiver disagree on "
             "the message size)",
             what_, got, expect_count_);
    }
  }

  MPI_Request req_;
  std::string what_;
  MPI_Datatype type_;
  int64_t expect_count_;
  bool done_ = false;
};

}  // namespace

const char* thread_level_name(ThreadLevel l) {
  switch (l) {
    case ThreadLevel::Single: return "single";
    case ThreadLevel::Funneled: return "funneled";
    case ThreadLevel::Serialized: return "serialized";
    case ThreadLevel::Multiple: return "multiple";
  }
  return "?";
}

void init_mpi() {
  std::lock_guard<std::mutex> lock(g_mutex);
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) {
    if (finalized()) fail("MPI was already finalized in this process and cannot start again");
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    g_level = to_level(provided);
    g_waiter.decide(MPI_COMM_WORLD);
    return;
  }
  int provided = MPI_THREAD_SINGLE;
  int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) fail("MPI_Init_thread failed: {}", mpi_error_string(rc));
  g_level = to_level(provided);
  g_initialized_by_us = true;
  if (g_level < ThreadLevel::Funneled)
    fail("MPI grants only thread level '{}'; Primus needs at least MPI_THREAD_FUNNELED",
         thread_level_name(g_level));
  std::atexit(finalize_mpi);
  g_waiter.decide(MPI_COMM_WORLD);
}

void finalize_mpi() {
  progress().stop();  // before MPI goes
  std::lock_guard<std::mutex> lock(g_mutex);
  delete g_world;  // frees its communicator while MPI is still up
  g_world = nullptr;
  int inited = 0;
  MPI_Initialized(&inited);
  // Finalize only what we initialised: a host program that called MPI_Init owns its finalize.
  if (inited && !finalized() && g_initialized_by_us) MPI_Finalize();
}

void abort_mpi(int code) {
  if (mpi_initialized()) MPI_Abort(MPI_COMM_WORLD, code);
}

bool mpi_initialized() {
  int inited = 0;
  MPI_Initialized(&inited);
  return inited && !finalized();
}

ThreadLevel mpi_thread_level() { return g_level; }

bool mpi_waits_by_sleeping() { return g_waiter.sleeps(); }

bool set_mpi_progress_interval(int64_t interval_us) {
  init_mpi();
  return progress().start(interval_us);
}

int64_t mpi_progress_passes() { return progress().passes(); }

MpiProcessGroup& mpi_world() {
  init_mpi();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_world) {
    MPI_Comm comm;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc != MPI_SUCCESS) fail("MPI_Comm_dup(MPI_COMM_WORLD) failed: {}", mpi_error_string(rc));
    int n = 0;
    MPI_Comm_size(comm, &n);
    std::vector<int> ranks(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ranks[static_cast<size_t>(i)] = i;
    g_world = new MpiProcessGroup(comm, "world", std::move(ranks));
  }
  return *g_world;
}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, std::string name, std::vector<int> world_ranks)
    : comm_(comm), name_(std::move(name)), world_ranks_(std::move(world_ranks)) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  PRIMUS_CHECK(static_cast<int>(world_ranks_.size()) == size_,
               "{} world ranks listed for a communicator of {}", world_ranks_.size(), size_);
}

MpiProcessGroup::~MpiProcessGroup() {
  if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL && !finalized())
    MPI_Comm_free(&comm_);
}

void MpiProcessGroup::check(int rc, const char* op) const {
  if (rc != MPI_SUCCESS) fail("{} on {} failed: {}", op, describe(), mpi_error_string(rc));
}

void MpiProcessGroup::all_reduce(void* buf, int64_t count, CommType t, ReduceOp op) {
  check_reducible(*this, "all_reduce", t, op);
  int n = mpi_count(*this, "all_reduce", count);
  check(g_waiter.collective([&] { return MPI_Allreduce(MPI_IN_PLACE, buf, n, mpi_type(t), mpi_op(op, t), comm_); },
                            [&](MPI_Request* r) {
                              return MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_type(t), mpi_op(op, t), comm_, r);
                            }),
        "all_reduce");
}

void MpiProcessGroup::reduce_scatter(const void* send, void* recv, int64_t recv_count,
                                     CommType t, ReduceOp op) {
  check_reducible(*this, "reduce_scatter", t, op);
  mpi_count(*this, "reduce_scatter", recv_count * size_);
  int n = mpi_count(*this, "reduce_scatter", recv_count);
  check(g_waiter.collective(
            [&] { return MPI_Reduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(op, t), comm_); },
            [&](MPI_Request* r) {
              return MPI_Ireduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(op, t), comm_, r);
            }),
        "reduce_scatter");
}

void MpiProcessGroup::all_gather(const void* send, void* recv, int64_t send_count, CommType t) {
  mpi_count(*this, "all_gather", send_count * size_);
  int n = mpi_count(*this, "all_gather", send_count);
  check(g_waiter.collective([&] { return MPI_Allgather(send, n, mpi_type(t), recv, n, mpi_type(t), comm_); },
                            [&](MPI_Request* r) {
                              return MPI_Iallgather(send, n, mpi_type(t), recv, n, mpi_type(t), comm_, r);
                            }),
        "all_gather");
}

void MpiProcessGroup::broadcast(void* buf, int64_t count, CommType t, int root) {
  check_rank("broadcast", "root", root);
  int n = mpi_count(*this, "broadcast", count);
  check(g_waiter.collective([&] { return MPI_Bcast(buf, n, mpi_type(t), root, comm_); },
                            [&](MPI_Request* r) { return MPI_Ibcast(buf, n, mpi_type(t), root, comm_, r); }),
        "broadcast");
}

void MpiProcessGroup::all_to_all(const void* send, void* recv, int64_t count_per_rank,
                                 CommType t) {
  mpi_count(*this, "all_to_all", count_per_rank * size_);
  int n = mpi_count(*this, "all_to_all", count_per_rank);
  check(g_waiter.collective([&] { return MPI_Alltoall(send, n, mpi_type(t), recv, n, mpi_type(t), comm_); },
                            [&](MPI_Request* r) {
                              return MPI_Ialltoall(send, n, mpi_type(t), recv, n, mpi_type(t), comm_, r);
                            }),
        "all_to_all");
}

void MpiProcessGroup::barrier() {
  check(g_waiter.collective([&] { return MPI_Barrier(comm_); }, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); }),
        "barrier");
}

WorkPtr MpiProcessGroup::iall_reduce(void* buf, int64_t count, CommType t, ReduceOp op) {
  check_reducible(*this, "iall_reduce", t, op);
  int n = mpi_count(*this, "iall_reduce", count);
  MPI_Request req;
  check(MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_type(t), mpi_op(op, t), comm_, &req),
        "iall_reduce");
  return std::make_unique<MpiWork>(req, "iall_reduce on " + describe(), mpi_type(t), -1);
}

WorkPtr MpiProcessGroup::ireduce_scatter(const void* send, void* recv, int64_t recv_count,
                                         CommType t, ReduceOp op) {
  check_reducible(*this, "ireduce_scatter", t, op);
  mpi_count(*this, "ireduce_scatter", recv_count * size_);
  int n = mpi_count(*this, "ireduce_scatter", recv_count);
  MPI_Request req;
  check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(op, t), comm_, &req),
        "ireduce_scatter");
  return std::make_unique<MpiWork>(req, "ireduce_scatter on " + describe(), mpi_type(t), -1);
}

WorkPtr MpiProcessGroup::iall_gather(const void* send, void* recv, int64_t send_count,
                                     CommType t) {
  mpi_count(*this, "iall_gather", send_count * size_);
  int n = mpi_count(*this, "iall_gather", send_count);
  MPI_Request req;
  check(MPI_Iallgather(send, n, mpi_type(t), recv, n, mpi_type(t), comm_, &req), "iall_gather");
  return std::make_unique<MpiWork>(req, "iall_gather on " + describe(), mpi_type(t), -1);
}

WorkPtr MpiProcessGroup::isend(const void* buf, int64_t count, CommType t, int dst, int tag) {
  check_rank("isend", "destination rank", dst);
  if (tag < 0) fail("isend on {}: negative tag {}", describe(), tag);
  int n = mpi_count(*this, "isend", count);
  MPI_Request req;
  check(MPI_Isend(buf, n, mpi_type(t), dst, tag, comm_, &req), "isend");
  return std::make_unique<MpiWork>(
      req, fmt::format("isend of {} {} to rank {} (tag {}) on {}", count, comm_type_name(t), dst,
                       tag, describe()),
      mpi_type(t), -1);
}

WorkPtr MpiProcessGroup::irecv(void* buf, int64_t count, CommType t, int src, int tag) {
  check_rank("irecv", "source rank", src);
  if (tag < 0) fail("irecv on {}: negative tag {}", describe(), tag);
  int n = mpi_count(*this, "irecv", count);
  MPI_Request req;
  check(MPI_Irecv(buf, n, mpi_type(t), src, tag, comm_, &req), "irecv");
  return std::make_unique<MpiWork>(
      req, fmt::format("irecv of {} {} from rank {} (tag {}) on {}", count, comm_type_name(t), src,
                       tag, describe()),
      mpi_type(t), count);
}

std::unique_ptr<ProcessGroup> MpiProcessGroup::split(int color, int key,
                                                     const std::string& name) {
  MPI_Comm sub = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "split");
  if (sub == MPI_COMM_NULL) return nullptr;
  int n = 0;
  MPI_Comm_size(sub, &n);
  std::vector<int> ranks(static_cast<size_t>(n));
  int me = world_ranks_[static_cast<size_t>(rank_)];
  int rc = MPI_Allgather(&me, 1, MPI_INT, ranks.data(), 1, MPI_INT, sub);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&sub);
    fail("split of {} into '{}' failed: {}", describe(), name, mpi_error_string(rc));
  }
  return std::make_unique<MpiProcessGroup>(sub, name, std::move(ranks));
}

}  // namespace primus::parallel
