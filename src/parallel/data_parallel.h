// Data-parallel gradient reduction in buckets, as Megatron-Core's DistributedDataParallel with
// overlap_grad_reduce: the flat gradient buffer (model/param_store.h) is cut into buckets of
// whole tensors, and each bucket's collective starts the moment its last tensor's gradient is
// final, so that communication runs while the backward computes the earlier layers.
//
// Loss convention: each microbatch's loss is a mean over its tokens and its backward is called
// with dloss = 1 / (microbatches in the GLOBAL batch), so the ranks' gradients are SUMMED here
// (not averaged): afterwards the buffer holds exactly what one process would have computed.
//
// Bucket scheme:
// - Buckets are formed from the END of the buffer (the backward produces the output layer's
//   gradients first): walking the tensors last to first, a bucket is closed as soon as it spans
//   at least bucket_size elements. Bucket 0 therefore holds the last tensors.
// - A bucket is one contiguous range [begin, end): from its first tensor's offset up to the next
//   bucket's begin (alignment gaps between tensors ride along; they are zero in ParamStore), the
//   last bucket up to the end of the buffer. A caller that allocates the buffer padded to a
//   multiple of dp (ParamStore aligns tensors to 16 floats) never needs the staging copy below.
// - Collectives start strictly in bucket order (0, 1, 2, ...): a bucket whose tensors are all
//   ready waits for the buckets before it. Collectives on one communicator match by posting
//   order, so this keeps every rank's sequence identical even if ranks mark tensors in
//   different orders.
// - Reduce-scatter mode (for the distributed optimizer): each bucket is padded to a multiple of
//   dp and split in dp equal shards; rank r receives the sum of shard r. Shard r of a bucket is
//   [begin + r * shard_numel, begin + (r + 1) * shard_numel) clipped to [begin, end). After
//   finish() only the rank's shards of the buffer hold reduced sums; the rest keeps this rank's
//   local gradients. A bucket whose padded size would run past its end is sent from a staging
//   copy (padding zeroed), so no collective ever reads or writes another bucket's elements.
// - dp = 1: nothing is posted; the local buffer already is the sum.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "parallel/process_group.h"

namespace primus::parallel {

class DistributedOptimizer;

enum class GradReduce : uint8_t {
  AllReduce,      // plain data parallel: every rank gets the whole summed buffer
  ReduceScatter,  // use_distributed_optimizer: every rank gets the sum of its shards
};
const char* grad_reduce_name(GradReduce r);

// Megatron's default bucket size: max(40M, 1M * dp) elements.
int64_t default_bucket_size(int dp_size);

struct GradBucketsOptions {
  int64_t bucket_size = 40'000'000;  // elements
  bool overlap_grad_reduce = true;   // false: every collective starts in finish()
  GradReduce reduce = GradReduce::AllReduce;
};

struct GradBucket {
  int64_t begin = 0, end = 0;         // the range of the flat buffer it reduces
  int first_tensor = 0, last_tensor = 0;  // tensor indices, inclusive
  int64_t padded_numel = 0;   // end - begin, rounded up to a multiple of dp (reduce-scatter)
  int64_t shard_numel = 0;    // padded_numel / dp
  int64_t shard_begin = 0, shard_end = 0;  // this rank's shard, clipped to [begin, end)
  bool staged = false;        // sent from a staging copy (padding would leave the bucket)
};

class GradBuckets {
 public:
  // grads: the flat fp32 gradient buffer, on dp's device (host memory for MPI, GPU memory for
  // NCCL). tensors: every tensor of the buffer as (name, offset, numel), in ascending,
  // non-overlapping offsets inside [0, buffer_numel) (ParamStore's registration order). Throws primus::Error for
  // a bad list, bucket_size <= 0, or a null buffer. Local checks only: nothing is sent.
  GradBuckets(ProcessGroup& dp, float* grads, int64_t buffer_numel,
              std::vector<ParamSegment> tensors, GradBucketsOptions options = {});
  ~GradBuckets();  // completes collectives still in flight (the buffer must outlive them)
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Tensor `tensor`'s gradient is final for this step (after the W pass of its layer for the
  // last microbatch). With overlap, a bucket whose tensors are all ready starts its collective
  // here (in bucket order). Marking a tensor twice, or after finish(), is an error.
  void mark_ready(int tensor);
  // Starts every bucket not yet started and waits for all: afterwards the buffer holds the sum
  // over dp (all-reduce), or this rank's shards hold their sums (reduce-scatter). With overlap,
  // every tensor must have been marked ready (a missing mark would mean a bucket reduced before
  // its gradient was final on some path, so it is an error that names the tensor); without
  // overlap, marks are optional. Calling it twice without reset() is an error (it would sum the
  // sums).
  void finish();
  // Gives posted collectives a chance to progress: MPI advances a non-blocking collective only
  // inside MPI calls (set_mpi_progress_interval's thread makes them in training). mark_ready() calls it; a caller may also
  // call it between compute ops. Cheap (one MPI_Test per bucket in flight).
  void poll();
  // Readies the buckets for the next step: clears the marks, and completes any collective still
  // in flight (an abandoned step). Does not zero the buffer; the caller zeroes gradients.
  void reset();

  ProcessGroup& group() const { return dp_; }
  const GradBucketsOptions& options() const { return options_; }
  float* grads() const { return grads_; }
  int64_t buffer_numel() const { return buffer_numel_; }
  const std::vector<ParamSegment>& tensors() const { return tensors_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  int bucket_of(int tensor) const;
  bool is_ready(int tensor) const;
  bool started(int bucket) const;  // its collective has been posted this step
  bool finished() const { return finished_; }
  // Bytes this object holds beside the gradient buffer (shard receive buffers and staging).
  int64_t scratch_bytes() const;

 private:
  friend class DistributedOptimizer;  // reuses the scratch buffers for the parameter all-gather
  void start(int b);
  void complete(int b);  // wait, then (reduce-scatter) copy the received shard into the buffer
  void start_ready_buckets();

  ProcessGroup& dp_;
  float* grads_;
  int64_t buffer_numel_;
  std::vector<ParamSegment> tensors_;
  GradBucketsOptions options_;
  std::vector<GradBucket> buckets_;
  std::vector<int> bucket_of_;       // per tensor
  std::vector<uint8_t> ready_;       // per tensor
  std::vector<int> pending_;         // per bucket: tensors not yet ready
  std::vector<WorkPtr> works_;       // per bucket: in flight (null when not started or done)
  std::vector<uint8_t> started_;     // per bucket
  std::vector<Tensor> shard_recv_;  // per bucket (reduce-scatter): shard_numel, on the group's device
  std::vector<Tensor> staging_;     // per staged bucket: padded_numel
  int next_to_start_ = 0;
  bool finished_ = false;
};

}  // namespace primus::parallel
