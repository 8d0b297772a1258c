#include "optim/grad_clip.h"

#include <cmath>

#include "core/error.h"

namespace primus {

double grad_sq_sum(const float* g, int64_t n) {
  if (n < 0) fail("grad_sq_sum: negative length {}", n);
  double sum = 0.0;
#pragma omp parallel for simd reduction(+ : sum) schedule(static) if (parallel : n > 65536)
  for (int64_t i = 0; i < n; ++i) sum += double(g[i]) * double(g[i]);
  return sum;
}

double global_grad_norm(const float* g, int64_t n) { return std::sqrt(grad_sq_sum(g, n)); }

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(total_norm)) return 1.0;
  double c = max_norm / (total_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

void scale_grads(float* g, int64_t n, double factor) {
  const float f = float(factor);
#pragma omp parallel for simd schedule(static) if (parallel : n > 65536)
  for (int64_t i = 0; i < n; ++i) g[i] *= f;
}

double clip_grad_norm(float* g, int64_t n, double max_norm) {
  double norm = global_grad_norm(g, n);
  double c = clip_coefficient(norm, max_norm);
  if (c < 1.0) scale_grads(g, n, c);
  return norm;
}

}  // namespace primus
