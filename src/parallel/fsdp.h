// Fully sharded data parallel (ZeRO-2 and ZeRO-3 / FSDP): how a unit of tensors is split over the
// data-parallel ranks, and the unit's two collectives. The weight source that decides when they
// run is train/sharded_weights.h; the memory estimate (plan/memory_estimate.h) sizes a rank's
// shards with the same geometry (fsdp_shard_unit) before anything is built. It knows buffers, not
// models.
//
// Sharding (FSDP2's per-parameter scheme). A tensor is split along one dim, seen as
// [outer, length, inner] around it: with k = ceil(length / dp), dp rank r holds rows
// [r k, min(length, (r + 1) k)) along it, possibly none. A rank's shards of a unit lie in its shard
// buffer at offsets the caller chooses (a ParamStore's); the unit's full tensors lie in a full
// buffer at their offsets in the model's layout.
//
// On the wire every rank sends a slot per tensor of k rows ([outer, k, inner], its rows first,
// then zeros), the slots of a unit back to back: equal counts on every rank, as all-gather and
// reduce-scatter need.
//   gather:  shard buffer -> own slots (2-D copies) -> all-gather into [dp][slots] -> copy each
//            rank's rows out into the full buffer (2-D copies: a tensor split along a dim other
//            than 0 is a column block of it)
//   reduce:  full gradient -> [dp][slots] (2-D copies, zero padding) -> reduce-scatter (sum) ->
//            this rank's slot copied into its gradient shards (one reduction per unit and step: it
//            overwrites them)
// Both are non-blocking: start_* posts the collective and returns a Pending that holds the wire
// buffers; wait() completes it and copies out. Collectives of one group match by posting order:
// every rank must start the same units in the same order. Buffers live on the group's device.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "parallel/process_group.h"

namespace primus::parallel {

struct FsdpRows {
  int64_t first = 0, count = 0;
};
// The rows along the shard dim that dp rank `rank` of `dp` holds of a tensor of `length` rows.
FsdpRows fsdp_rows(int64_t length, int dp, int rank);

struct FsdpTensor {
  int64_t outer = 1, length = 0, inner = 1;  // the tensor's shape around its shard dim
  int64_t full_offset = 0;                    // elements into the unit's full buffer
  int64_t shard_offset = 0;                   // elements into this rank's shard buffer (when it holds rows)
};

struct FsdpUnit {
  std::vector<FsdpTensor> tensors;
  int64_t full_numel = 0;   // length of the full buffer
  int64_t shard_numel = 0;  // length of this rank's shard buffer (0 when it holds nothing of the unit)
};

// The unit of `tensors` (outer, length, inner and full_offset given; full_numel elements whole)
// as rank `rank` of `dp` holds it: each tensor's piece (its fsdp_rows) placed in the rank's shard
// buffer in the order given, each piece starting kFsdpPieceAlign elements after a multiple (as
// ParamStore's tensors), and the unit's shard_numel (a multiple of kFsdpPieceAlign).
constexpr int64_t kFsdpPieceAlign = 16;
FsdpUnit fsdp_shard_unit(std::vector<FsdpTensor> tensors, int64_t full_numel, int dp, int rank);

// How far a sharded run's unit collectives run ahead of and behind the passes
// (train/sharded_weights.h): ZeRO-3 gathers the next unit while one computes, and both stages
// keep this many units' gradient reductions in flight while the backward goes on (a unit's whole
// gradient accumulates beside them).
constexpr int kFsdpGathersInFlight = 2;
constexpr int kFsdpReductionsInFlight = 2;

class FsdpGroup {
 public:
  // A collective in flight with its wire buffers; wait() completes it and copies the result out.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
    virtual int64_t bytes() const = 0;  // of the wire buffers it holds
  };

  FsdpGroup(ProcessGroup& dp, std::vector<FsdpUnit> units);

  ProcessGroup& group() const { return dp_; }
  const std::vector<FsdpUnit>& units() const { return units_; }
  int64_t slot_numel(int unit) const { return slot_numel_[unit]; }

  // All-gather of `unit`: `shard` holds this rank's shard buffer (shard_numel elements, any dtype
  // the group moves), `full` receives full_numel elements of the same dtype on wait().
  std::unique_ptr<Pending> start_gather(int unit, const Tensor& shard, Tensor full);
  // Reduce-scatter (sum) of the unit's full fp32 gradient (read here: the caller may free it once
  // this returns); wait() writes this rank's sums into `shard_grads` (shard_numel fp32 elements).
  std::unique_ptr<Pending> start_reduce(int unit, const Tensor& full_grads, Tensor shard_grads);

 private:
  ProcessGroup& dp_;
  std::vector<FsdpUnit> units_;
  std::vector<int64_t> slot_numel_;
};

}  // namespace primus::parallel
