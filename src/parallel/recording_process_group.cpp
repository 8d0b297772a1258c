#include "parallel/recording_process_group.h"

#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/meta_device.h"

namespace primus::parallel {
namespace {

bool on_host(const void* p) { return p && !is_meta_address(p); }

// buf[i] *= n for a sum over n ranks that all hold the same.
void scale(void* buf, int64_t count, CommType t, int n) {
  auto mul = [&](auto* p) {
    for (int64_t i = 0; i < count; ++i) p[i] = decltype(+p[0])(p[i] * n);
  };
  switch (t) {
    case CommType::F32: mul(static_cast<float*>(buf)); break;
    case CommType::F64: mul(static_cast<double*>(buf)); break;
    case CommType::I32: mul(static_cast<int32_t*>(buf)); break;
    case CommType::I64: mul(static_cast<int64_t*>(buf)); break;
    default: break;  // bf16, fp16 and flags: left as they are
  }
}

class RecordedWork final : public Work {
 public:
  RecordedWork(CommLog& log, size_t index) : log_(log), index_(index) {}
  ~RecordedWork() override { wait(); }
  void wait() override {
    if (done_) return;
    log_.calls()[index_].waited = log_.now();
    done_ = true;
  }
  // Done (nothing moves), so no caller spins on it; it counts as in flight until waited for or
  // dropped: the ops in between overlap it.
  bool test() override { return true; }

 private:
  CommLog& log_;
  size_t index_;
  bool done_ = false;
};

}  // namespace

std::vector<CommCall> CommLog::take() {
  std::vector<CommCall> out;
  out.swap(calls_);
  return out;
}

RecordingProcessGroup::RecordingProcessGroup(std::string name, int size, int rank, CommLog& log, Device device)
    : name_(std::move(name)), size_(size), rank_(rank), log_(log), device_(device), world_(size_t(size)) {
  PRIMUS_CHECK(size >= 1 && rank >= 0 && rank < size, "recording group {}: rank {} of {}", name_, rank, size);
  std::iota(world_.begin(), world_.end(), 0);
}

size_t RecordingProcessGroup::record(const char* op, int64_t count, CommType t) {
  check_count(op, count);
  CommCall c;
  c.op = op;
  c.bytes = double(count) * double(comm_type_size(t));
  c.type = t;
  c.group = name_;
  c.ranks = size_;
  c.issued = c.waited = log_.now();
  log_.calls().push_back(c);
  return log_.calls().size() - 1;
}

WorkPtr RecordingProcessGroup::pending(size_t index) { return std::make_unique<RecordedWork>(log_, index); }

void RecordingProcessGroup::all_reduce(void* buf, int64_t count, CommType t, ReduceOp op) {
  record("all_reduce", count, t);
  if (on_host(buf) && op == ReduceOp::Sum) scale(buf, count, t, size_);
}

void RecordingProcessGroup::reduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp op) {
  record("reduce_scatter", recv_count * size_, t);
  if (!on_host(send) || !on_host(recv)) return;
  const size_t b = size_t(recv_count) * comm_type_size(t);
  std::memmove(recv, static_cast<const char*>(send) + size_t(rank_) * b, b);
  if (op == ReduceOp::Sum) scale(recv, recv_count, t, size_);
}

void RecordingProcessGroup::all_gather(const void* send, void* recv, int64_t send_count, CommType t) {
  record("all_gather", send_count * size_, t);
  if (!on_host(send) || !on_host(recv)) return;
  const size_t b = size_t(send_count) * comm_type_size(t);
  for (int r = 0; r < size_; ++r)
    if (static_cast<char*>(recv) + size_t(r) * b != send)
      std::memmove(static_cast<char*>(recv) + size_t(r) * b, send, b);
}

void RecordingProcessGroup::broadcast(void*, int64_t count, CommType t, int root) {
  check_rank("broadcast", "root", root);
  record("broadcast", count, t);
}

void RecordingProcessGroup::all_to_all(const void* send, void* recv, int64_t count_per_rank, CommType t) {
  record("all_to_all", count_per_rank * size_, t);
  if (on_host(send) && on_host(recv) && send != recv)
    std::memmove(recv, send, size_t(count_per_rank * size_) * comm_type_size(t));
}

void RecordingProcessGroup::barrier() { record("barrier", 0, CommType::U8); }

WorkPtr RecordingProcessGroup::iall_reduce(void* buf, int64_t count, CommType t, ReduceOp op) {
  const size_t i = record("all_reduce", count, t);
  if (on_host(buf) && op == ReduceOp::Sum) scale(buf, count, t, size_);
  return pending(i);
}

WorkPtr RecordingProcessGroup::ireduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t,
                                               ReduceOp op) {
  reduce_scatter(send, recv, recv_count, t, op);
  return pending(log_.calls().size() - 1);
}

WorkPtr RecordingProcessGroup::iall_gather(const void* send, void* recv, int64_t send_count, CommType t) {
  all_gather(send, recv, send_count, t);
  return pending(log_.calls().size() - 1);
}

WorkPtr RecordingProcessGroup::isend(const void*, int64_t count, CommType t, int dst, int) {
  check_rank("isend", "destination", dst);
  return pending(record("send", count, t));
}

WorkPtr RecordingProcessGroup::irecv(void*, int64_t count, CommType t, int src, int) {
  check_rank("irecv", "source", src);
  return pending(record("recv", count, t));
}

std::unique_ptr<ProcessGroup> RecordingProcessGroup::split(int, int, const std::string& name) {
  fail("{}: a recording group makes no sub-groups (asked for '{}')", describe(), name);
}

}  // namespace primus::parallel
