// ProcessGroup: the collectives and point-to-point transfers a set of ranks performs together.
// The interface is backend-neutral so that NCCL (GPU) fits beside MPI (CPU): buffers are passed
// either as Tensors or as raw pointer + element count + CommType, every op that may run in the
// background returns a Work handle, and a group reports the device its buffers live on.
//
// Conventions (as in torch.distributed / Megatron):
// - Ranks passed to a group's methods (root, dst, src, new_group's list) are ranks *within that
//   group*, 0..size()-1; world_ranks() maps them back to global ranks.
// - Collectives are called by every member, in the same order, with matching sizes. Whatever can
//   be checked locally (a buffer that does not match the group size, a root out of range, a
//   non-contiguous tensor, a reduction the dtype cannot do) throws primus::Error before any
//   message is sent, so that no rank is left waiting. Mismatches that only the peer can see
//   (a message longer than the posted receive) surface as primus::Error from wait().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace primus::parallel {

enum class ReduceOp : uint8_t { Sum, Max, Min };
const char* reduce_op_name(ReduceOp op);

// Element types on the wire: the Tensor dtypes plus the integer types that bookkeeping needs
// (token counts, flags). The MPI backend reduces bf16 with its own operations (fp32 arithmetic,
// one rounding per step, as NCCL) and moves fp16 without reducing it; NCCL reduces both.
enum class CommType : uint8_t { F32, F64, BF16, F16, I32, I64, U8 };
size_t comm_type_size(CommType t);
const char* comm_type_name(CommType t);
CommType comm_type_of(DType t);

template <typename T> struct comm_type_of_t;
template <> struct comm_type_of_t<float> { static constexpr CommType value = CommType::F32; };
template <> struct comm_type_of_t<double> { static constexpr CommType value = CommType::F64; };
template <> struct comm_type_of_t<int32_t> { static constexpr CommType value = CommType::I32; };
template <> struct comm_type_of_t<int64_t> { static constexpr CommType value = CommType::I64; };
template <> struct comm_type_of_t<uint8_t> { static constexpr CommType value = CommType::U8; };

// A handle on an operation running in the background. wait() blocks until it is done (and
// throws primus::Error if it failed); test() polls. The buffers of the operation must stay
// alive until then; the Tensor overloads keep their tensors alive inside the Work. A Work that
// is dropped unfinished is completed in its destructor (a pending receive is cancelled), so a
// buffer is never written after its owner is gone.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
  void keep_alive(Tensor t) { held_.push_back(std::move(t)); }

 private:
  std::vector<Tensor> held_;
};
using WorkPtr = std::unique_ptr<Work>;

// Waits for every handle in order (e.g. the sends and receives of one pipeline step).
void wait_all(std::vector<WorkPtr>& works);

class ProcessGroup;
// Every member's `text`, in group-rank order, on every member (two all-gathers: the lengths,
// then the texts padded to the longest). Host groups only: reports and small records.
std::vector<std::string> all_gather_strings(ProcessGroup& pg, const std::string& text);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;     // "world", "tp", "dp", ...
  virtual std::string backend() const = 0;         // "mpi", later "nccl"
  virtual Device device() const = 0;               // where buffers must live
  virtual const std::vector<int>& world_ranks() const = 0;  // group rank -> global rank
  // "tp group (world ranks 0,1)": used in every error message about this group.
  std::string describe() const;

  // ---- raw buffers: count elements of type t on this group's device ----
  // In place: buf holds count elements on every rank; afterwards the reduction over ranks.
  virtual void all_reduce(void* buf, int64_t count, CommType t, ReduceOp op) = 0;
  // send holds size() * recv_count elements: chunk i is reduced over ranks into rank i's recv.
  virtual void reduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t,
                              ReduceOp op) = 0;
  // recv holds size() * send_count elements: rank i's send lands at chunk i.
  virtual void all_gather(const void* send, void* recv, int64_t send_count, CommType t) = 0;
  virtual void broadcast(void* buf, int64_t count, CommType t, int root) = 0;
  // send and recv hold size() * count_per_rank elements: send chunk j goes to rank j and lands
  // in its recv chunk (this rank).
  virtual void all_to_all(const void* send, void* recv, int64_t count_per_rank, CommType t) = 0;
  virtual void barrier() = 0;

  // Point-to-point semantics. false (MPI): a receive meets the send with its tag, and a posted
  // receive holds nothing else up. true (NCCL): a pair of ranks' sends and receives meet in
  // posting order whatever the tags, and run on the group's stream, where a pending receive holds
  // up the transfers posted after it. The pipeline executor posts accordingly.
  virtual bool p2p_in_posting_order() const { return false; }

  // Non-blocking variants, for overlapping communication with compute (DP gradient buckets,
  // ZeRO shards) and for the pipeline's transfers posted early.
  virtual WorkPtr iall_reduce(void* buf, int64_t count, CommType t, ReduceOp op) = 0;
  virtual WorkPtr ireduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t,
                                  ReduceOp op) = 0;
  virtual WorkPtr iall_gather(const void* send, void* recv, int64_t send_count, CommType t) = 0;
  virtual WorkPtr isend(const void* buf, int64_t count, CommType t, int dst, int tag = 0) = 0;
  virtual WorkPtr irecv(void* buf, int64_t count, CommType t, int src, int tag = 0) = 0;

  // A sub-group of the members listed (group ranks of this group, in the new group's rank
  // order). Collective over *all* members of this group; non-members get nullptr. By default the
  // list is validated (non-empty, in range, no repeats: the same verdict on every member, so a
  // bad list fails everywhere before any message) and the group made by split().
  virtual std::unique_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& name);
  // Like MPI_Comm_split: ranks with the same color form a group, ordered by key (then by rank).
  // Collective over all members; color < 0 means "in no group" and returns nullptr.
  virtual std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) = 0;

  // ---- Tensor overloads: contiguous tensors on device(); sizes checked against size() ----
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  void reduce_scatter(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::Sum);
  void all_gather(const Tensor& input, Tensor& output);
  void broadcast(Tensor& t, int root);
  void all_to_all(const Tensor& input, Tensor& output);
  WorkPtr iall_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
  WorkPtr ireduce_scatter(const Tensor& input, Tensor& output, ReduceOp op = ReduceOp::Sum);
  WorkPtr iall_gather(const Tensor& input, Tensor& output);
  WorkPtr isend(const Tensor& t, int dst, int tag = 0);
  WorkPtr irecv(Tensor& t, int src, int tag = 0);

  // Typed helpers for small host-side values (loss sums, token counts, flags).
  template <typename T> void all_reduce(std::vector<T>& v, ReduceOp op = ReduceOp::Sum) {
    all_reduce(v.data(), static_cast<int64_t>(v.size()), comm_type_of_t<T>::value, op);
  }
  template <typename T> T all_reduce_value(T v, ReduceOp op = ReduceOp::Sum) {
    all_reduce(&v, 1, comm_type_of_t<T>::value, op);
    return v;
  }

 protected:
  // Shared argument checks for backends; each throws primus::Error naming the op and group.
  void check_rank(const char* op, const char* what, int r) const;
  void check_count(const char* op, int64_t count) const;
  void check_tensor(const char* op, const char* what, const Tensor& t) const;
};

}  // namespace primus::parallel
