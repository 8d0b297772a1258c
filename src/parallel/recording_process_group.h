// A process group that communicates nothing, for the shape-only walk (plan/model_walk.h): it
// stands for one rank of a group of `size` ranks on the meta device (core/meta_device.h). Every
// collective and transfer is recorded in a CommLog (op, bytes as the trace counts them, group, and
// when it was issued and waited for on the log's clock, e.g. the count of ops recorded so far, so
// that a transfer that overlaps compute shows which ops hide it) and completes at once.
//
// Buffers on the meta device are left alone. Host buffers (the model's small host values: loss
// sums, token counts, a routing hash) get what they would get if every rank of the group held the
// same as this one: a sum is size times the value, a max or min the value, a gather size copies.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallel/process_group.h"

namespace primus::parallel {

struct CommCall {
  const char* op = "";  // all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, send, recv, barrier
  double bytes = 0;     // the whole buffer (a gather's output, a scatter's input), as trace/traced_group counts
  CommType type = CommType::F32;
  std::string group;              // the group's name: "tp", "cp", "ep", ...
  int ranks = 1;                  // the group's size
  size_t issued = 0, waited = 0;  // the log's clock: blocking calls wait where they are issued
};

class CommLog {
 public:
  explicit CommLog(std::function<size_t()> clock = {}) : clock_(std::move(clock)) {}
  size_t now() const { return clock_ ? clock_() : 0; }
  std::vector<CommCall>& calls() { return calls_; }
  std::vector<CommCall> take();

 private:
  std::function<size_t()> clock_;
  std::vector<CommCall> calls_;
};

class RecordingProcessGroup final : public ProcessGroup {
 public:
  RecordingProcessGroup(std::string name, int size, int rank, CommLog& log, Device device = Device::Meta);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "recording"; }
  Device device() const override { return device_; }
  const std::vector<int>& world_ranks() const override { return world_; }

  using ProcessGroup::all_gather;
  using ProcessGroup::all_reduce;
  using ProcessGroup::all_to_all;
  using ProcessGroup::broadcast;
  using ProcessGroup::iall_gather;
  using ProcessGroup::iall_reduce;
  using ProcessGroup::irecv;
  using ProcessGroup::ireduce_scatter;
  using ProcessGroup::isend;
  using ProcessGroup::reduce_scatter;
  void all_reduce(void* buf, int64_t count, CommType t, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, int64_t send_count, CommType t) override;
  void broadcast(void* buf, int64_t count, CommType t, int root) override;
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, CommType t) override;
  void barrier() override;
  WorkPtr iall_reduce(void* buf, int64_t count, CommType t, ReduceOp op) override;
  WorkPtr ireduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp op) override;
  WorkPtr iall_gather(const void* send, void* recv, int64_t send_count, CommType t) override;
  WorkPtr isend(const void* buf, int64_t count, CommType t, int dst, int tag) override;
  WorkPtr irecv(void* buf, int64_t count, CommType t, int src, int tag) override;
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;

 private:
  size_t record(const char* op, int64_t count, CommType t);  // issued now; returns its index
  WorkPtr pending(size_t index);                             // waited when the Work is
  std::string name_;
  int size_, rank_;
  CommLog& log_;
  Device device_;
  std::vector<int> world_;
};

}  // namespace primus::parallel
