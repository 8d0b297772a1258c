#include "kernels/cpu/gemm.h"

#include <cblas.h>

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
#pragma omp parallel for schedule(static)
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
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < out; ++j) {
      T s = 0;
      for (int64_t i = 0; i < n; ++i) s += dy[i * out + j];
      dbias[j] += scale * s;
    }
  }
}

#define INSTANTIATE(T)                                                                                   \
  template void linear_forward<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, bool);    \
  template void linear_backward_input<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, bool);       \
  template void linear_backward_weight<T>(const T*, const T*, T*, T*, int64_t, int64_t, int64_t, T);
INSTANTIATE(float)
INSTANTIATE(double)

}  // namespace primus::cpu
