#include "parallel/fsdp.h"

#include <algorithm>

#include "core/device.h"
#include "core/error.h"

namespace primus::parallel {

FsdpRows fsdp_rows(int64_t length, int dp, int rank) {
  const int64_t k = (length + dp - 1) / dp;
  const int64_t first = std::min(length, k * rank);
  return {first, std::min(length, first + k) - first};
}

FsdpUnit fsdp_shard_unit(std::vector<FsdpTensor> tensors, int64_t full_numel, int dp, int rank) {
  FsdpUnit u;
  u.full_numel = full_numel;
  int64_t at = 0;
  for (FsdpTensor& t : tensors) {
    t.shard_offset = at;
    const int64_t piece = t.outer * fsdp_rows(t.length, dp, rank).count * t.inner;
    at = (at + piece + kFsdpPieceAlign - 1) / kFsdpPieceAlign * kFsdpPieceAlign;
  }
  u.tensors = std::move(tensors);
  u.shard_numel = at;
  return u;
}

namespace {

char* at(const Tensor& t, int64_t element) { return static_cast<char*>(t.raw()) + element * int64_t(dtype_size(t.dtype())); }

// Copies `count` rows of a [outer, rows, inner] tensor between buffers whose row counts along the
// middle dim differ (src_rows, dst_rows), starting at row src_first / dst_first: one 2-D copy.
void copy_rows(Device dev, size_t elem, char* dst, int64_t dst_rows, int64_t dst_first, const char* src,
               int64_t src_rows, int64_t src_first, int64_t count, const FsdpTensor& t) {
  if (count <= 0) return;
  const size_t row = size_t(t.inner) * elem;
  device_copy_2d(dev, dst + size_t(dst_first) * row, size_t(dst_rows) * row, src + size_t(src_first) * row,
                 size_t(src_rows) * row, size_t(count) * row, size_t(t.outer));
}

class Gather final : public FsdpGroup::Pending {
 public:
  Gather(const FsdpUnit& u, int dp, int64_t slot, Tensor full, Tensor send, Tensor recv, WorkPtr work)
      : u_(u), dp_(dp), slot_(slot), full_(std::move(full)), send_(std::move(send)), recv_(std::move(recv)),
        work_(std::move(work)) {}
  void wait() override {
    if (!work_) return;
    work_->wait();
    work_.reset();
    const size_t e = dtype_size(full_.dtype());
    int64_t slot_at = 0;
    for (const FsdpTensor& t : u_.tensors) {
      const int64_t k = (t.length + dp_ - 1) / dp_;
      for (int r = 0; r < dp_; ++r) {
        const FsdpRows rows = fsdp_rows(t.length, dp_, r);
        copy_rows(full_.device(), e, at(full_, t.full_offset), t.length, rows.first, at(recv_, r * slot_ + slot_at), k,
                  0, rows.count, t);
      }
      slot_at += t.outer * k * t.inner;
    }
    send_ = recv_ = Tensor();
  }
  int64_t bytes() const override { return int64_t(send_.defined() ? send_.nbytes() + recv_.nbytes() : 0); }

 private:
  const FsdpUnit& u_;
  int dp_;
  int64_t slot_;
  Tensor full_, send_, recv_;
  WorkPtr work_;
};

class Reduce final : public FsdpGroup::Pending {
 public:
  Reduce(const FsdpUnit& u, int dp, int rank, Tensor shard, Tensor send, Tensor recv, WorkPtr work)
      : u_(u), dp_(dp), rank_(rank), shard_(std::move(shard)), send_(std::move(send)), recv_(std::move(recv)),
        work_(std::move(work)) {}
  void wait() override {
    if (!work_) return;
    work_->wait();
    work_.reset();
    int64_t slot_at = 0;
    for (const FsdpTensor& t : u_.tensors) {
      const int64_t k = (t.length + dp_ - 1) / dp_;
      const FsdpRows rows = fsdp_rows(t.length, dp_, rank_);
      if (rows.count > 0)
        copy_rows(shard_.device(), sizeof(float), at(shard_, t.shard_offset), rows.count, 0, at(recv_, slot_at), k, 0,
                  rows.count, t);
      slot_at += t.outer * k * t.inner;
    }
    send_ = recv_ = Tensor();
  }
  int64_t bytes() const override { return int64_t(send_.defined() ? send_.nbytes() + recv_.nbytes() : 0); }

 private:
  const FsdpUnit& u_;
  int dp_, rank_;
  Tensor shard_, send_, recv_;
  WorkPtr work_;
};

}  // namespace

FsdpGroup::FsdpGroup(ProcessGroup& dp, std::vector<FsdpUnit> units) : dp_(dp), units_(std::move(units)) {
  const int n = dp_.size();
  for (const FsdpUnit& u : units_) {
    int64_t slot = 0;
    for (const FsdpTensor& t : u.tensors) {
      PRIMUS_CHECK(t.outer >= 1 && t.length >= 1 && t.inner >= 1, "FSDP tensor of shape [{}, {}, {}]", t.outer,
                   t.length, t.inner);
      PRIMUS_CHECK(t.full_offset >= 0 && t.full_offset + t.outer * t.length * t.inner <= u.full_numel,
                   "FSDP tensor outside its unit's full buffer");
      slot += t.outer * ((t.length + n - 1) / n) * t.inner;
    }
    slot_numel_.push_back(slot);
  }
}

std::unique_ptr<FsdpGroup::Pending> FsdpGroup::start_gather(int unit, const Tensor& shard, Tensor full) {
  const FsdpUnit& u = units_[unit];
  const int n = dp_.size(), r = dp_.rank();
  const int64_t slot = slot_numel_[unit];
  PRIMUS_CHECK(full.numel() == u.full_numel && full.dtype() == (shard.defined() ? shard.dtype() : full.dtype()) &&
                   full.device() == dp_.device(),
               "FSDP gather of unit {}: a full buffer of {} elements", unit, u.full_numel);
  const DType dt = full.dtype();
  const size_t e = dtype_size(dt);
  Tensor send = Tensor::zeros({slot}, dt, dp_.device()), recv = Tensor::empty({n * slot}, dt, dp_.device());
  int64_t slot_at = 0;
  for (const FsdpTensor& t : u.tensors) {
    const int64_t k = (t.length + n - 1) / n;
    const FsdpRows rows = fsdp_rows(t.length, n, r);
    if (rows.count > 0)
      copy_rows(dp_.device(), e, at(send, slot_at), k, 0, at(shard, t.shard_offset), rows.count, 0, rows.count, t);
    slot_at += t.outer * k * t.inner;
  }
  WorkPtr work = dp_.iall_gather(send.raw(), recv.raw(), slot, comm_type_of(dt));
  return std::make_unique<Gather>(u, n, slot, std::move(full), std::move(send), std::move(recv), std::move(work));
}

std::unique_ptr<FsdpGroup::Pending> FsdpGroup::start_reduce(int unit, const Tensor& full_grads, Tensor shard_grads) {
  const FsdpUnit& u = units_[unit];
  const int n = dp_.size(), r = dp_.rank();
  const int64_t slot = slot_numel_[unit];
  PRIMUS_CHECK(full_grads.numel() == u.full_numel && full_grads.dtype() == DType::F32 &&
                   (u.shard_numel == 0 || shard_grads.numel() == u.shard_numel),
               "FSDP reduce of unit {}: fp32 gradients of {} elements, shard of {}", unit, u.full_numel, u.shard_numel);
  Tensor send = Tensor::zeros({n * slot}, DType::F32, dp_.device()), recv = Tensor::empty({slot}, DType::F32, dp_.device());
  int64_t slot_at = 0;
  for (const FsdpTensor& t : u.tensors) {
    const int64_t k = (t.length + n - 1) / n;
    for (int q = 0; q < n; ++q) {
      const FsdpRows rows = fsdp_rows(t.length, n, q);
      copy_rows(dp_.device(), sizeof(float), at(send, q * slot + slot_at), k, 0, at(full_grads, t.full_offset),
                t.length, rows.first, rows.count, t);
    }
    slot_at += t.outer * k * t.inner;
  }
  WorkPtr work = dp_.ireduce_scatter(send.raw(), recv.raw(), slot, CommType::F32, ReduceOp::Sum);
  return std::make_unique<Reduce>(u, n, r, std::move(shard_grads), std::move(send), std::move(recv), std::move(work));
}

}  // namespace primus::parallel
