// The default grouped GEMM (backend.h): one gemm() per problem. The CPU bf16 backend overrides it
// with one parallel region for all the problems (cpu/bf16/gemm_avx512.cpp); the CUDA backend with
// one cuBLAS grouped call for its bf16 products (cuda/cuda_backend.cpp). The fp32/fp64 CPU
// backend and the reference backend use this loop.
#include "core/error.h"
#include "kernels/backend.h"

namespace primus::ops {

void Backend::grouped_gemm(bool trans_a, bool trans_b, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                           const std::vector<Tensor>& B, float beta, std::vector<Tensor>& D) {
  PRIMUS_CHECK(A.size() == B.size() && A.size() == D.size() && alpha.size() == A.size(),
               "grouped_gemm of {} A, {} B, {} D and {} alphas", A.size(), B.size(), D.size(), alpha.size());
  for (size_t i = 0; i < A.size(); ++i)
    gemm(trans_a, trans_b, alpha[i], A[i], B[i], beta, beta != 0.0f ? D[i] : Tensor(), D[i], Tensor());
}

}  // namespace primus::ops
