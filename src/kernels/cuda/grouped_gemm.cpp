#include "kernels/cuda/grouped_gemm.h"

#include <cublas_v2.h>

#include <climits>
#include <mutex>

#include "core/error.h"
#include "kernels/cuda/runtime.h"

namespace primus::cuda {

namespace {

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "a cuBLAS error";
  }
}

// One handle and one device buffer for the pointer arrays serve the process (never destroyed:
// at exit the CUDA context may already be gone). Calls are serialised by the mutex.
struct GroupedState {
  std::mutex mu;
  cublasHandle_t handle = nullptr;
  void* pointers = nullptr;  // device: [A' | B' | C] pointer arrays of the last call
  size_t pointer_bytes = 0;
};
GroupedState& grouped_state() {
  static GroupedState* s = new GroupedState;
  return *s;
}

int as_int(int64_t v, const char* what, size_t problem) {
  PRIMUS_CHECK(v >= 0 && v <= INT_MAX, "grouped GEMM problem {}: {} = {} is outside cuBLAS's int range", problem, what,
               v);
  return int(v);
}

}  // namespace

void grouped_gemm(bool trans_a, bool trans_b, float beta, const std::vector<GroupedGemmProblem>& problems) {
  // Row-major D = op(A) op(B) is column-major D^T = op(B)^T op(A)^T (as in gemm.cpp): cuBLAS's A
  // is our B and its m our n; each matrix's leading dimension is its row stride.
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, group_size;
  std::vector<float> alphas, betas;
  std::vector<const void*> a, b;
  std::vector<void*> c;
  for (size_t i = 0; i < problems.size(); ++i) {
    const GroupedGemmProblem& p = problems[i];
    if (p.m == 0 || p.n == 0) continue;
    PRIMUS_CHECK(p.k > 0, "grouped GEMM problem {}: [{}, {}] with an empty inner dimension", i, p.m, p.n);
    PRIMUS_CHECK(p.A && p.B && p.D, "grouped GEMM problem {}: a null pointer", i);
    ta.push_back(trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    tb.push_back(trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    m.push_back(as_int(p.n, "n", i));
    n.push_back(as_int(p.m, "m", i));
    k.push_back(as_int(p.k, "k", i));
    lda.push_back(as_int(p.ldb, "ldb", i));
    ldb.push_back(as_int(p.lda, "lda", i));
    ldc.push_back(as_int(p.ldd, "ldd", i));
    group_size.push_back(1);
    alphas.push_back(p.alpha);
    betas.push_back(beta);
    a.push_back(p.B);
    b.push_back(p.A);
    c.push_back(p.D);
  }
  const size_t count = a.size();
  if (count == 0) return;
  GroupedState& s = grouped_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.handle) {
    if (!initialized()) fail("grouped GEMM on the GPU before cuda::init(): initialise the CUDA backend first");
    cublasHandle_t h = nullptr;
    const cublasStatus_t st = cublasCreate(&h);
    if (st != CUBLAS_STATUS_SUCCESS) fail("cublasCreate failed: {}", status_name(st));
    s.handle = h;
  }
  const size_t bytes = 3 * count * sizeof(void*);
  if (s.pointer_bytes < bytes) {
    if (s.pointers) device_free(s.pointers, s.pointer_bytes);
    s.pointers = device_alloc(bytes);
    s.pointer_bytes = bytes;
  }
  std::vector<const void*> host(3 * count);
  for (size_t i = 0; i < count; ++i) host[i] = a[i], host[count + i] = b[i], host[2 * count + i] = c[i];
  // On the compute stream, as the GEMMs: the previous call's have read the buffer before this
  // copy overwrites it.
  copy_to_device(s.pointers, host.data(), bytes);
  auto* dev = static_cast<void**>(s.pointers);
  cublasStatus_t st = cublasSetStream(s.handle, cuda::stream());
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasGemmGroupedBatchedEx(s.handle, ta.data(), tb.data(), m.data(), n.data(), k.data(), alphas.data(),
                                    const_cast<const void* const*>(dev), CUDA_R_16BF, lda.data(),
                                    const_cast<const void* const*>(dev + count), CUDA_R_16BF, ldb.data(), betas.data(),
                                    dev + 2 * count, CUDA_R_16BF, ldc.data(), int(count), group_size.data(),
                                    CUBLAS_COMPUTE_32F);
  if (st != CUBLAS_STATUS_SUCCESS)
    fail("cublasGemmGroupedBatchedEx of {} bf16 problems ({}{}, first [{}, {}] x k {}) failed: {}", count,
         trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', n[0], m[0], k[0], status_name(st));
}

}  // namespace primus::cuda
