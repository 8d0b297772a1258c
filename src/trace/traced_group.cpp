#include "trace/traced_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace primus::trace {
namespace {

using parallel::CommType;
using parallel::WorkPtr;

DType dtype_of(CommType t) {
  switch (t) {
    case CommType::F64: return DType::F64;
    case CommType::BF16: return DType::BF16;
    case CommType::F16: return DType::F16;
    case CommType::I32: return DType::I32;
    default: return DType::F32;
  }
}

double bytes_of(int64_t count, CommType t) { return double(count) * double(parallel::comm_type_size(t)); }

// Completes the op's event when the op is seen done.
class TracedWork final : public parallel::Work {
 public:
  TracedWork(WorkPtr inner, std::unique_ptr<Event> e, Profiler& p, void* stream)
      : inner_(std::move(inner)), e_(std::move(e)), p_(p), stream_(stream) {}
  ~TracedWork() override {
    inner_.reset();  // completes the op
    if (e_) p_.comm_complete(std::move(e_), stream_);
  }
  void wait() override {
    if (!e_) return inner_->wait();
    p_.interrupt_region();
    const double t0 = host_now_us();
    inner_->wait();
    e_->wait_us += host_now_us() - t0;
    p_.comm_complete(std::move(e_), stream_);
    p_.resume_region();
  }
  bool test() override {
    const bool done = inner_->test();
    if (done && e_) p_.comm_complete(std::move(e_), stream_);
    return done;
  }

 private:
  WorkPtr inner_;
  std::unique_ptr<Event> e_;
  Profiler& p_;
  void* stream_;
};

}  // namespace

TracedProcessGroup::TracedProcessGroup(std::unique_ptr<parallel::ProcessGroup> inner, Profiler& profiler)
    : inner_(std::move(inner)), p_(profiler) {
  stream_ = comm_stream_of(*inner_);
  name_ = p_.intern(inner_->name());
  ranks_ = fmt::format("{}", fmt::join(inner_->world_ranks(), ","));
}

std::unique_ptr<Event> TracedProcessGroup::issue(const char* op, double bytes, CommType t, int peer, bool collective) {
  const int64_t seq = collective ? collectives_++ : -1;
  if (!p_.active()) return nullptr;
  std::unique_ptr<Event> e = p_.comm_issue(op, stream_);
  e->group = name_;
  e->group_ranks = ranks_;
  e->group_size = inner_->size();
  e->bytes = bytes;
  e->dtype = dtype_of(t);
  e->seq = seq;
  e->peer = peer;
  return e;
}

template <typename Fn>
void TracedProcessGroup::blocking(const char* op, double bytes, CommType t, Fn&& run) {
  std::unique_ptr<Event> e = issue(op, bytes, t, -1, true);
  if (!e) return run();
  const double t0 = host_now_us();
  run();
  e->wait_us = host_now_us() - t0;
  p_.comm_complete(std::move(e), stream_);
  p_.comm_issued();
}

template <typename Fn>
WorkPtr TracedProcessGroup::background(const char* op, double bytes, CommType t, int peer, bool collective, Fn&& post) {
  std::unique_ptr<Event> e = issue(op, bytes, t, peer, collective);
  if (!e) return post();
  WorkPtr w = post();
  p_.comm_issued();
  return std::make_unique<TracedWork>(std::move(w), std::move(e), p_, stream_);
}

void TracedProcessGroup::all_reduce(void* buf, int64_t count, CommType t, parallel::ReduceOp op) {
  blocking("all_reduce", bytes_of(count, t), t, [&] { inner_->all_reduce(buf, count, t, op); });
}
void TracedProcessGroup::reduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t,
                                        parallel::ReduceOp op) {
  blocking("reduce_scatter", bytes_of(recv_count * size(), t), t,
           [&] { inner_->reduce_scatter(send, recv, recv_count, t, op); });
}
void TracedProcessGroup::all_gather(const void* send, void* recv, int64_t send_count, CommType t) {
  blocking("all_gather", bytes_of(send_count * size(), t), t, [&] { inner_->all_gather(send, recv, send_count, t); });
}
void TracedProcessGroup::broadcast(void* buf, int64_t count, CommType t, int root) {
  blocking("broadcast", bytes_of(count, t), t, [&] { inner_->broadcast(buf, count, t, root); });
}
void TracedProcessGroup::all_to_all(const void* send, void* recv, int64_t count_per_rank, CommType t) {
  blocking("all_to_all", bytes_of(count_per_rank * size(), t), t,
           [&] { inner_->all_to_all(send, recv, count_per_rank, t); });
}
void TracedProcessGroup::barrier() {
  blocking("barrier", 0, CommType::U8, [&] { inner_->barrier(); });
}

// Background ops: the event rides on the Work until it is seen done.
WorkPtr TracedProcessGroup::iall_reduce(void* buf, int64_t count, CommType t, parallel::ReduceOp op) {
  return background("all_reduce", bytes_of(count, t), t, -1, true, [&] { return inner_->iall_reduce(buf, count, t, op); });
}
WorkPtr TracedProcessGroup::ireduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t,
                                            parallel::ReduceOp op) {
  return background("reduce_scatter", bytes_of(recv_count * size(), t), t, -1, true,
                    [&] { return inner_->ireduce_scatter(send, recv, recv_count, t, op); });
}
WorkPtr TracedProcessGroup::iall_gather(const void* send, void* recv, int64_t send_count, CommType t) {
  return background("all_gather", bytes_of(send_count * size(), t), t, -1, true,
                    [&] { return inner_->iall_gather(send, recv, send_count, t); });
}
WorkPtr TracedProcessGroup::isend(const void* buf, int64_t count, CommType t, int dst, int tag) {
  return background("send", bytes_of(count, t), t, dst, false, [&] { return inner_->isend(buf, count, t, dst, tag); });
}
WorkPtr TracedProcessGroup::irecv(void* buf, int64_t count, CommType t, int src, int tag) {
  return background("recv", bytes_of(count, t), t, src, false, [&] { return inner_->irecv(buf, count, t, src, tag); });
}

std::unique_ptr<parallel::ProcessGroup> TracedProcessGroup::new_group(const std::vector<int>& ranks,
                                                                      const std::string& name) {
  auto g = inner_->new_group(ranks, name);
  return g ? std::make_unique<TracedProcessGroup>(std::move(g), p_) : nullptr;
}

std::unique_ptr<parallel::ProcessGroup> TracedProcessGroup::split(int color, int key, const std::string& name) {
  auto g = inner_->split(color, key, name);
  return g ? std::make_unique<TracedProcessGroup>(std::move(g), p_) : nullptr;
}

void trace_groups(parallel::MeshGroups& groups, Profiler& profiler) {
  for (auto* g : {&groups.tp, &groups.cp, &groups.dp, &groups.pp, &groups.ep, &groups.edp, &groups.dp_cp, &groups.edp_cp, &groups.mp})
    if (*g) *g = std::make_unique<TracedProcessGroup>(std::move(*g), profiler);
}

}  // namespace primus::trace
