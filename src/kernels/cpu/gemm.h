// Row-major GEMM through OpenBLAS: C = alpha * op(A) @ op(B) + beta * C, op = transpose when
// trans_* is set. M x N result, K inner. float for training, double for the gradient tests.
#pragma once

#include <cstdint>

namespace primus::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// The three GEMMs of a linear layer y = x W^T (+ b), x [n, in], W [out, in], y [n, out]:
//   forward           y  = x W^T            (accumulate: y += ..., e.g. onto a residual)
//   backward_input    dx = dy W             (accumulate: dx += ...)
//   backward_weight   dW += scale * dy^T x,  db += scale * colsum(dy)
template <typename T>
void linear_forward(const T* x, const T* w, const T* bias, T* y, int64_t n, int64_t in, int64_t out,
                    bool accumulate = false);
template <typename T>
void linear_backward_input(const T* dy, const T* w, T* dx, int64_t n, int64_t in, int64_t out,
                           bool accumulate = false);
template <typename T>
void linear_backward_weight(const T* dy, const T* x, T* dw, T* dbias, int64_t n, int64_t in, int64_t out,
                            T scale = T(1));

// Sets flush-to-zero and denormals-are-zero on every OpenMP thread. AdamW's second moments and
// small gradients turn denormal late in training, and denormal arithmetic is many times slower
// on x86; training never needs values below 1e-38.
void flush_denormals_to_zero();

// The machine's practical fp32 peak: best of `reps` n^3 SGEMMs on all threads, in GFLOP/s.
// MFU on the CPU is reported against this measured number (PRIMUS_PEAK_GFLOPS overrides it).
double measure_sgemm_peak_gflops(int n = 2048, int reps = 4);
double sgemm_peak_gflops();  // PRIMUS_PEAK_GFLOPS if set, else measured once (n = 1024) and cached

}  // namespace primus::cpu
