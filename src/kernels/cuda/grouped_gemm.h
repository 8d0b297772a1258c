// Grouped GEMM on the GPU: the experts of a mixture-of-experts layer in one cuBLAS call,
// cublasGemmGroupedBatchedEx (cuBLAS 12.5 and later), instead of one cuBLASLt call each.
//
// Problems are row-major as in gemm.h, D[m, n] = alpha * op(A) op(B) + beta * D, and share the
// transposes, alpha and beta, not their shapes (each is its own group of one, with its own m, n,
// k). A, B and D are bf16 with fp32 accumulation (CUBLAS_COMPUTE_32F): the type combination the
// grouped call offers for bf16. (An fp32 D from bf16 inputs, the weight gradients, is not among
// them: CudaBackend runs those through gemm.h one by one.) The arrays of device pointers that
// the call reads are copied to the device with each call, a copy the host waits for, as for the
// routing row ops' lists.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

namespace primus::cuda {

struct GroupedGemmProblem {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;  // row strides in elements
  const void* A = nullptr;
  const void* B = nullptr;
  void* D = nullptr;
  float alpha = 1.0f;  // D = alpha op(A) op(B) + beta D
};

// Runs every problem on the compute stream (runtime.h), after the pointer arrays' copy on it;
// problems with m or n 0 are skipped. Errors (a cuBLAS status, k 0, a dimension past int) are
// primus::Error naming the call and the problem.
void grouped_gemm(bool trans_a, bool trans_b, float beta, const std::vector<GroupedGemmProblem>& problems);

}  // namespace primus::cuda
