#include "parallel/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/device.h"
#include "core/error.h"

namespace primus::parallel {

const char* grad_reduce_name(GradReduce r) {
  switch (r) {
    case GradReduce::AllReduce: return "all-reduce";
    case GradReduce::ReduceScatter: return "reduce-scatter";
  }
  return "?";
}

int64_t default_bucket_size(int dp_size) {
  return std::max<int64_t>(40'000'000, int64_t{1'000'000} * std::max(dp_size, 1));
}

GradBuckets::GradBuckets(ProcessGroup& dp, float* grads, int64_t buffer_numel,
                         std::vector<ParamSegment> tensors, GradBucketsOptions options)
    : dp_(dp), grads_(grads), buffer_numel_(buffer_numel), tensors_(std::move(tensors)),
      options_(options) {
  if (options_.bucket_size <= 0)
    fail("GradBuckets: bucket_size must be a positive number of elements, got {}",
         options_.bucket_size);
  if (buffer_numel_ < 0) fail("GradBuckets: negative buffer size {}", buffer_numel_);
  if (!grads_ && buffer_numel_ > 0) fail("GradBuckets: the gradient buffer is null");
  int64_t prev_end = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    if (t.numel < 0) fail("GradBuckets: tensor '{}' has negative numel {}", t.name, t.numel);
    if (t.offset < prev_end)
      fail("GradBuckets: tensor '{}' at offset {} overlaps or precedes the previous tensor (which "
           "ends at {}); tensors must be listed in ascending offset order",
           t.name, t.offset, prev_end);
    if (t.offset + t.numel > buffer_numel_)
      fail("GradBuckets: tensor '{}' [{}, {}) lies outside the {}-element gradient buffer", t.name,
           t.offset, t.offset + t.numel, buffer_numel_);
    prev_end = t.offset + t.numel;
  }

  // Buckets from the end: walk the tensors backwards and close a bucket once it spans
  // bucket_size elements. A bucket reaches up to where the next one (in buffer order) begins.
  const int n = static_cast<int>(tensors_.size());
  const int64_t dp_size = dp_.size();
  bucket_of_.assign(static_cast<size_t>(n), -1);
  int64_t end = buffer_numel_;
  int last = n - 1;
  for (int i = n - 1; i >= 0; --i) {
    const int64_t begin = tensors_[static_cast<size_t>(i)].offset;
    if (end - begin >= options_.bucket_size || i == 0) {
      GradBucket b;
      b.begin = begin;
      b.end = end;
      b.first_tensor = i;
      b.last_tensor = last;
      const int64_t span = end - begin;
      b.padded_numel = options_.reduce == GradReduce::ReduceScatter
                           ? (span + dp_size - 1) / dp_size * dp_size
                           : span;
      b.shard_numel = options_.reduce == GradReduce::ReduceScatter ? b.padded_numel / dp_size
                                                                    : span;
      if (options_.reduce == GradReduce::ReduceScatter) {
        const int64_t r = dp_.rank();
        b.shard_begin = std::min(end, begin + r * b.shard_numel);
        b.shard_end = std::min(end, begin + (r + 1) * b.shard_numel);
        b.staged = b.padded_numel != span;
      } else {
        b.shard_begin = begin;
        b.shard_end = end;
      }
      for (int k = i; k <= last; ++k) bucket_of_[static_cast<size_t>(k)] = num_buckets();
      buckets_.push_back(b);
      end = begin;
      last = i - 1;
    }
  }
  const size_t nb = buckets_.size();
  ready_.assign(static_cast<size_t>(n), 0);
  pending_.resize(nb);
  works_.resize(nb);
  started_.assign(nb, 0);
  if (options_.reduce == GradReduce::ReduceScatter && dp_size > 1) {
    shard_recv_.resize(nb);
    staging_.resize(nb);
    for (size_t b = 0; b < nb; ++b) {
      shard_recv_[b] = Tensor::zeros({buckets_[b].shard_numel}, DType::F32, dp_.device());
      if (buckets_[b].staged) staging_[b] = Tensor::zeros({buckets_[b].padded_numel}, DType::F32, dp_.device());
    }
  }
  reset();
}

GradBuckets::~GradBuckets() {
  // Work's destructor completes an operation that is still running; do it here explicitly, in
  // bucket order, before the scratch buffers below are freed.
  for (auto& w : works_) {
    if (!w) continue;
    try {
      w->wait();
    } catch (...) {  // never throw from a destructor; the step is being abandoned anyway
    }
    w.reset();
  }
}

int GradBuckets::bucket_of(int tensor) const {
  if (tensor < 0 || tensor >= static_cast<int>(tensors_.size()))
    fail("GradBuckets: tensor index {} out of range (there are {} tensors)", tensor,
         tensors_.size());
  return bucket_of_[static_cast<size_t>(tensor)];
}

bool GradBuckets::is_ready(int tensor) const {
  bucket_of(tensor);  // range check
  return ready_[static_cast<size_t>(tensor)] != 0;
}

bool GradBuckets::started(int bucket) const {
  if (bucket < 0 || bucket >= num_buckets())
    fail("GradBuckets: bucket index {} out of range (there are {} buckets)", bucket, num_buckets());
  return started_[static_cast<size_t>(bucket)] != 0;
}

int64_t GradBuckets::scratch_bytes() const {
  int64_t n = 0;
  for (const auto& v : shard_recv_) n += v.defined() ? v.numel() : 0;
  for (const auto& v : staging_) n += v.defined() ? v.numel() : 0;
  return n * static_cast<int64_t>(sizeof(float));
}

void GradBuckets::mark_ready(int tensor) {
  const int b = bucket_of(tensor);
  const auto& t = tensors_[static_cast<size_t>(tensor)];
  if (finished_)
    fail("GradBuckets: tensor '{}' marked ready after finish(); call reset() before the next step",
         t.name);
  if (ready_[static_cast<size_t>(tensor)])
    fail("GradBuckets: tensor '{}' (index {}) marked ready twice in one step", t.name, tensor);
  ready_[static_cast<size_t>(tensor)] = 1;
  --pending_[static_cast<size_t>(b)];
  if (options_.overlap_grad_reduce) {
    start_ready_buckets();
    poll();
  }
}

void GradBuckets::start_ready_buckets() {
  while (next_to_start_ < num_buckets() && pending_[static_cast<size_t>(next_to_start_)] == 0)
    start(next_to_start_++);
}

void GradBuckets::poll() {
  for (auto& w : works_)
    if (w) w->test();
}

void GradBuckets::start(int bi) {
  const auto b = static_cast<size_t>(bi);
  const GradBucket& bk = buckets_[b];
  started_[b] = 1;
  // One rank: the local gradients already are the sum (and the whole bucket is the shard).
  if (dp_.size() == 1) return;
  if (options_.reduce == GradReduce::AllReduce) {
    works_[b] = dp_.iall_reduce(grads_ + bk.begin, bk.end - bk.begin, CommType::F32, ReduceOp::Sum);
  } else {
    const float* send = grads_ + bk.begin;
    if (bk.staged) {
      float* s = staging_[b].data<float>();
      const int64_t span = bk.end - bk.begin;
      device_copy(dp_.device(), s, grads_ + bk.begin, sizeof(float) * static_cast<size_t>(span));
      device_zero(dp_.device(), s + span, sizeof(float) * static_cast<size_t>(bk.padded_numel - span));
      send = s;
    }
    works_[b] = dp_.ireduce_scatter(send, shard_recv_[b].data<float>(), bk.shard_numel, CommType::F32,
                                    ReduceOp::Sum);
  }
}

void GradBuckets::complete(int bi) {
  const auto b = static_cast<size_t>(bi);
  if (!works_[b]) return;
  works_[b]->wait();
  works_[b].reset();
  const GradBucket& bk = buckets_[b];
  if (options_.reduce == GradReduce::ReduceScatter && bk.shard_end > bk.shard_begin)
    device_copy(dp_.device(), grads_ + bk.shard_begin, shard_recv_[b].data<float>(),
                sizeof(float) * static_cast<size_t>(bk.shard_end - bk.shard_begin));
}

void GradBuckets::finish() {
  if (finished_) fail("GradBuckets::finish called twice without reset(): it would sum the sums");
  if (options_.overlap_grad_reduce) {
    for (size_t i = 0; i < ready_.size(); ++i) {
      if (ready_[i]) continue;
      const int64_t marked = std::count(ready_.begin(), ready_.end(), uint8_t{1});
      fail("GradBuckets::finish with overlap_grad_reduce: tensor '{}' (index {}, bucket {}) was "
           "never marked ready ({} of {} tensors marked); call mark_ready for every tensor once "
           "its gradient is final",
           tensors_[i].name, i, bucket_of_[i], marked, tensors_.size());
    }
  }
  while (next_to_start_ < num_buckets()) start(next_to_start_++);
  for (int b = 0; b < num_buckets(); ++b) complete(b);
  finished_ = true;
}

void GradBuckets::reset() {
  for (int b = 0; b < num_buckets(); ++b) {
    if (works_[static_cast<size_t>(b)]) {
      works_[static_cast<size_t>(b)]->wait();
      works_[static_cast<size_t>(b)].reset();
    }
  }
  std::fill(ready_.begin(), ready_.end(), uint8_t{0});
  std::fill(started_.begin(), started_.end(), uint8_t{0});
  for (int b = 0; b < num_buckets(); ++b) {
    const auto& bk = buckets_[static_cast<size_t>(b)];
    pending_[static_cast<size_t>(b)] = bk.last_tensor - bk.first_tensor + 1;
  }
  next_to_start_ = 0;
  finished_ = false;
}

}  // namespace primus::parallel
