// Gradient clipping by global L2 norm, split in steps so that a distributed version can sum the
// squared norms of its shards across ranks (all-reduce) before deciding the scale:
//   sq = grad_sq_sum(local); all_reduce(sq); norm = sqrt(sq); scale_grads(g, n, clip_coefficient(norm, max))
#pragma once

#include <cstdint>

namespace primus {

// Sum of squares of g[0..n), accumulated in double (fp32 sums lose digits past ~1e7 elements).
double grad_sq_sum(const float* g, int64_t n);
// sqrt(grad_sq_sum(g, n)).
double global_grad_norm(const float* g, int64_t n);
// The factor Megatron applies: max_norm / (norm + 1e-6) when that is below 1, else 1. A
// non-finite norm gives 1: scaling cannot repair NaN/Inf gradients, and the caller must see
// the bad norm (returned by clip_grad_norm) to skip the step.
double clip_coefficient(double total_norm, double max_norm);
void scale_grads(float* g, int64_t n, double factor);
// Clips g in place to global norm max_norm (max_norm <= 0 disables clipping); returns the norm
// before clipping.
double clip_grad_norm(float* g, int64_t n, double max_norm);

}  // namespace primus
