// The cross-entropy's scalar rules that the CPU backends' host code shares (kernels/backend.h:
// ce_finish and ce_forward_backward): a row's log-sum-exp from its max and its sum of
// exp(z - max), and the loss sum over the unmasked rows.
#pragma once

#include <cmath>
#include <cstdint>

namespace primus::ops {

template <typename T>
inline T ce_log_sum_exp(T max, T sum) {
  return max + std::log(sum);
}

// The sum of lse - target logit over the rows whose target is not masked (< 0), in row order, in
// double.
template <typename T>
inline double ce_loss_sum(const T* lse, const T* target_logit, const int32_t* targets, int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    if (targets[i] >= 0) total += double(lse[i] - target_logit[i]);
  return total;
}

}  // namespace primus::ops
