// Internal helper for the hand-written generators: appends ops to one rank's list and keeps the
// next microbatch of each op type and chunk, so generators read like the papers' pseudo-code.
#pragma once

#include <deque>
#include <utility>
#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline::detail {

class RankBuilder {
 public:
  RankBuilder(std::vector<Op>& ops, int vpp) : ops_(ops), f_(vpp, 0), b_(vpp, 0), w_(vpp, 0) {}
  void F(int chunk = 0) { ops_.push_back({OpType::F, f_[chunk]++, chunk, {}, {}}); }
  // Input gradient only; the weight gradient is queued for a later W().
  void B(int chunk = 0) {
    queue_.emplace_back(b_[chunk], chunk);
    ops_.push_back({OpType::B, b_[chunk]++, chunk, {}, {}});
  }
  void BW(int chunk = 0) { ops_.push_back({OpType::BW, b_[chunk]++, chunk, {}, {}}); }
  // The oldest queued weight gradient.
  void W() {
    auto [mb, chunk] = queue_.front();
    queue_.pop_front();
    ops_.push_back({OpType::W, mb, chunk, {}, {}});
  }
  // The op just added and the next one run as one overlapped pair (Op::overlap_next).
  void overlap_with_next() { ops_.back().overlap_next = true; }
  int forwards(int chunk = 0) const { return f_[chunk]; }
  int backwards(int chunk = 0) const { return b_[chunk]; }
  size_t queued_w() const { return queue_.size(); }

 private:
  std::vector<Op>& ops_;
  std::vector<int> f_, b_, w_;
  std::deque<std::pair<int, int>> queue_;
};

}  // namespace primus::pipeline::detail
