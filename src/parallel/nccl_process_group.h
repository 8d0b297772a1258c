// The NCCL backend of ProcessGroup: collectives and point-to-point transfers between GPUs, on
// device (Device::CUDA) buffers. Built only with the CUDA backend (PRIMUS_HAVE_CUDA).
//
// Bootstrap: NcclProcessGroup::create(bootstrap, name) is collective over a CPU group (the MPI
// world, any MPI sub-group, or a SelfProcessGroup for one process): its rank 0 makes the
// ncclUniqueId and broadcasts it, and every member joins with ncclCommInitRank. One GPU per
// process: cuda::init(device) must have run first (the caller picks the device, e.g. the local
// rank). Group ranks equal the bootstrap group's ranks, and so do world_ranks().
//
// Streams and ordering (stream-ordered, as torch.distributed's work.wait() on CUDA):
// - Each group runs its communication on its own CUDA stream. Posting an op records an event on
//   the compute stream (cuda::stream()) and makes the group's stream wait on it: the op sees
//   everything the compute stream was asked to do before the call.
// - The op's Work::wait() does not block the host: it makes the compute stream wait on an event
//   recorded on the group's stream after the op, so kernels queued afterwards see the result.
//   test() polls that event (cudaEventQuery) without blocking. A host that reads the result must
//   synchronise the compute stream (cuda::copy_to_host does).
// - Blocking calls (all_reduce, all_gather, ...) are post + wait(): ordered, not host-blocking.
//   barrier() does block the host until every rank reached it.
// - A Work dropped unwaited makes the compute stream wait in its destructor, so memory released
//   with it (the caching allocator hands blocks out in compute-stream order) is never reused
//   while the transfer may still touch it.
//
// Point-to-point: NCCL matches sends and receives by (peer, order), not by tag: tags are checked
// for sign and otherwise ignored, and the n-th send to a peer meets the peer's n-th receive from
// this rank. isend/irecv calls posted back to back are queued and issued together as one
// ncclGroupStart/End batch, because NCCL needs a send and a receive that must progress together
// (a pipeline stage exchanging with both neighbours, or a rank sending to itself) in one group.
// The batch is issued when anything else happens on any NCCL group of the process: another
// collective, a wait()/test() of any Work, a split, a barrier, a destructor. So post the sends
// and receives of one step, then wait on them; do not block the host elsewhere (e.g. on MPI) while
// a posted send is still unwaited. Counts must match on both sides (NCCL cannot report a
// mismatch: the transfer hangs or corrupts).
//
// Host buffers: NCCL needs device memory, and every op refuses a host pointer with an error
// naming the op and the group, except all_reduce, which stages a small host buffer (at most
// kMaxHostStagingBytes) through device memory synchronously: the typed host helpers of the base
// class (all_reduce(std::vector<T>&), all_reduce_value) thus work as on the MPI backend, for
// the trainer's loss sums and token counts.
//
// Sub-groups: new_group/split use ncclCommSplit (NCCL >= 2.18), with the MPI backend's semantics:
// group ranks, nullptr for non-members (color < 0 joins as NCCL_SPLIT_NOCOLOR).
//
// Threads: the ops of all NCCL groups of the process are serialised by one mutex, so a
// communication thread may post beside the compute thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "parallel/process_group.h"

namespace primus::parallel {

class NcclProcessGroup final : public ProcessGroup {
 public:
  // The largest host buffer all_reduce stages through device memory.
  static constexpr size_t kMaxHostStagingBytes = size_t(1) << 20;

  // Collective over the members of `bootstrap` (a CPU group: MPI or Self).
  static std::unique_ptr<NcclProcessGroup> create(ProcessGroup& bootstrap, const std::string& name);
  ~NcclProcessGroup() override;  // issues what is queued, waits for its stream, ncclCommDestroy
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::CUDA; }
  bool p2p_in_posting_order() const override { return true; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  ncclComm_t comm() const;
  cudaStream_t comm_stream() const;  // the stream this group communicates on

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

  void all_reduce(void* buf, int64_t count, CommType t, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp op) override;
  void all_gather(const void* send, void* recv, int64_t send_count, CommType t) override;
  void broadcast(void* buf, int64_t count, CommType t, int root) override;
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, CommType t) override;
  void barrier() override;

  WorkPtr iall_reduce(void* buf, int64_t count, CommType t, ReduceOp op) override;
  WorkPtr ireduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t, ReduceOp op) override;
  WorkPtr iall_gather(const void* send, void* recv, int64_t send_count, CommType t) override;
  WorkPtr isend(const void* buf, int64_t count, CommType t, int dst, int tag = 0) override;
  WorkPtr irecv(void* buf, int64_t count, CommType t, int src, int tag = 0) override;

  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;

  struct Core;  // the communicator, its stream and queued point-to-point ops (shared with Works)

 private:
  NcclProcessGroup(std::shared_ptr<Core> core, std::string name, std::vector<int> world_ranks);
  void check_device_buffer(const char* op, const char* what, const void* p) const;

  std::shared_ptr<Core> core_;
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_ = 0, size_ = 1;
};

}  // namespace primus::parallel
