// Central finite differences in double precision, shared by the kernel and model tests.
#pragma once

#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"

namespace primus::test {

inline std::vector<double> random_vector(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = scale * rng.normal();
  return v;
}

// d loss / d x[i] by (f(x + e) - f(x - e)) / 2e, restoring x[i].
template <typename F>
double numeric_grad(double* x, F&& loss, double eps = 1e-6) {
  const double saved = *x;
  *x = saved + eps;
  const double plus = loss();
  *x = saved - eps;
  const double minus = loss();
  *x = saved;
  return (plus - minus) / (2 * eps);
}

// Compares the analytic gradient with finite differences for every element of x.
template <typename F>
void expect_grad_matches(const char* what, double* x, const double* analytic, size_t n, F&& loss,
                         double rtol = 1e-6, double atol = 1e-8) {
  for (size_t i = 0; i < n; ++i) {
    const double num = numeric_grad(x + i, loss);
    ASSERT_NEAR(analytic[i], num, atol + rtol * std::fabs(num)) << what << " element " << i;
  }
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace primus::test
