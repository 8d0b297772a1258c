#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

namespace primus::cpu {

template <>
void gemm<float>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
              lda, B, ldb, beta, C, ldc);
}

template <>
void gemm<double>(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
                  const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
              lda, B, ldb, beta, C, ldc);
}

template <typename T>
void linear_forward(const T* x, const T* w, const T* bias, T* y, int64_t n, int64_t in, int64_t out,
                    bool accumulate) {
  T beta = accumulate ? T(1) : T(0);
  if (bias) {
    // Seed y with the bias so that the GEMM adds onto it in one pass.
#pragma omp parallel for schedule(static) if(n * out >= (1 << 15))
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < out; ++j) y[i * out + j] = (accumulate ? y[i * out + j] : T(0)) + bias[j];
    beta = T(1);
  }
  gemm<T>(false, true, n, out, in, T(1), x, in, w, in, beta, y, out);
}

template <typename T>
void linear_backward_input(const T* dy, const T* w, T* dx, int64_t n, int64_t in, int64_t out, bool accumulate) {
  gemm<T>(false, false, n, in, out, T(1), dy, out, w, in, accumulate ? T(1) : T(0), dx, in);
}

template <typename T>
void linear_backward_weight(const T* dy, const T* x, T* dw, T* dbias, int64_t n, int64_t in, int64_t out,
                            T scale) {
  gemm<T>(true, false, out, in, n, scale, dy, out, x, in, T(1), dw, in);
  if (dbias) {
#pragma omp parallel for schedule(static) if(n * out >= (1 << 15))
    for (int64_t j = 0; j < out; ++j) {
      T s = 0;
      for (int64_t i = 0; i < n; ++i) s += dy[i * out + j];
      dbias[j] += scale * s;
    }
  }
}

void flush_denormals_to_zero() {
#pragma omp parallel
  _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ (bit 15) and DAZ (bit 6)
}

double measure_sgemm_peak_gflops(int n, int reps) {
  std::vector<float> a(size_t(n) * n, 1.0f), b(size_t(n) * n, 0.5f), c(size_t(n) * n);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

double sgemm_peak_gflops() {
  static const double peak = [] {
    if (const char* env = std::getenv("PRIMUS_PEAK_GFLOPS"); env && std::atof(env) > 0) return std::atof(env);
    return measure_sgemm_peak_gflops(1024, 4);
  }();
  return peak;
}

#define INSTANTIATE(T)                                                                                   \
  template void linear_forward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, bool);    \
  template void linear_backward_input<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool);       \
  template void linear_backward_weight<T>(const T*, const T*, T*, T*, int64_t, int64_t, int64_t, T);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace primus::cpu
