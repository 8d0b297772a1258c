// TracedProcessGroup: a ProcessGroup that records every collective and point-to-point transfer
// while the profiler is active and forwards it to the real group in any case. An event spans
// from the op's start (the later of its issue and, on a GPU, the moment the communication stream
// and the compute stream's input are ready) to its completion (a blocking call's return; for an
// op that runs in the background, the wait() or test() that saw it done, so on the host its end
// is an upper bound). It carries the group's name and ranks, the bytes moved (the whole buffer:
// all-reduce and broadcast its count, reduce-scatter its input, all-gather its output, all-to-all
// either side, a transfer its message), the issue time, the time the host blocked in wait(), and
// the op's index among the group's collectives, which is the same on every member and lets
// `analyze trace` line a collective up across ranks.
#pragma once

#include <memory>
#include <string>

#include "parallel/mesh.h"
#include "parallel/process_group.h"
#include "trace/profiler.h"

namespace primus::trace {

class TracedProcessGroup final : public parallel::ProcessGroup {
 public:
  TracedProcessGroup(std::unique_ptr<parallel::ProcessGroup> inner, Profiler& profiler);
  parallel::ProcessGroup& inner() const { return *inner_; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  std::string backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  const std::vector<int>& world_ranks() const override { return inner_->world_ranks(); }
  bool p2p_in_posting_order() const override { return inner_->p2p_in_posting_order(); }

  using ProcessGroup::all_gather;
  using ProcessGroup::all_reduce;
  using ProcessGroup::all_to_all;
  using ProcessGroup::broadcast;
  using ProcessGroup::iall_gather;
  using ProcessGroup::iall_reduce;
  using ProcessGroup::ireduce_scatter;
  using ProcessGroup::irecv;
  using ProcessGroup::isend;
  using ProcessGroup::reduce_scatter;

  void all_reduce(void* buf, int64_t count, parallel::CommType t, parallel::ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, parallel::CommType t,
                      parallel::ReduceOp op) override;
  void all_gather(const void* send, void* recv, int64_t send_count, parallel::CommType t) override;
  void broadcast(void* buf, int64_t count, parallel::CommType t, int root) override;
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, parallel::CommType t) override;
  void barrier() override;

  parallel::WorkPtr iall_reduce(void* buf, int64_t count, parallel::CommType t, parallel::ReduceOp op) override;
  parallel::WorkPtr ireduce_scatter(const void* send, void* recv, int64_t recv_count, parallel::CommType t,
                                    parallel::ReduceOp op) override;
  parallel::WorkPtr iall_gather(const void* send, void* recv, int64_t send_count, parallel::CommType t) override;
  parallel::WorkPtr isend(const void* buf, int64_t count, parallel::CommType t, int dst, int tag = 0) override;
  parallel::WorkPtr irecv(void* buf, int64_t count, parallel::CommType t, int src, int tag = 0) override;

  std::unique_ptr<parallel::ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& name) override;
  std::unique_ptr<parallel::ProcessGroup> split(int color, int key, const std::string& name) override;

 private:
  // A recorded op in flight: null when the profiler is not active.
  std::unique_ptr<Event> issue(const char* op, double bytes, parallel::CommType t, int peer, bool collective);
  template <typename Fn> void blocking(const char* op, double bytes, parallel::CommType t, Fn&& run);
  template <typename Fn>
  parallel::WorkPtr background(const char* op, double bytes, parallel::CommType t, int peer, bool collective, Fn&& post);

  std::unique_ptr<parallel::ProcessGroup> inner_;
  Profiler& p_;
  void* stream_ = nullptr;  // the communication stream on a GPU
  const std::string* name_ = nullptr;
  std::string ranks_;
  int64_t collectives_ = 0;  // counted always, so that every member numbers them alike
};

// Replaces every group of `groups` by its traced decorator.
void trace_groups(parallel::MeshGroups& groups, Profiler& profiler);

}  // namespace primus::trace
