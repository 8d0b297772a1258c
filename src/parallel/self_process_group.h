// A group of one process: what a run without mpirun trains with, so that the trainer never
// special-cases "no MPI". Collectives are copies (or nothing); point-to-point has no peer.
#pragma once

#include "parallel/process_group.h"

namespace primus::parallel {

class SelfProcessGroup final : public ProcessGroup {
 public:
  explicit SelfProcessGroup(std::string name = "world") : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "self"; }
  Device device() const override { return Device::CPU; }
  const std::vector<int>& world_ranks() const override { return ranks_; }

  void all_reduce(void*, int64_t count, CommType, ReduceOp) override { check_count("all_reduce", count); }
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp) override;
  void all_gather(const void* send, void* recv, int64_t send_count, CommType t) override;
  void broadcast(void*, int64_t count, CommType, int root) override;
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, CommType t) override;
  void barrier() override {}
  WorkPtr iall_reduce(void* buf, int64_t count, CommType t, ReduceOp op) override;
  WorkPtr ireduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp op) override;
  WorkPtr iall_gather(const void* send, void* recv, int64_t send_count, CommType t) override;
  WorkPtr isend(const void*, int64_t, CommType, int dst, int) override;
  WorkPtr irecv(void*, int64_t, CommType, int src, int) override;
  std::unique_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& name) override;
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;

 private:
  std::string name_;
  std::vector<int> ranks_{0};
};

}  // namespace primus::parallel
