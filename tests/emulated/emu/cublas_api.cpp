// The cuBLAS functions src/kernels/cuda/grouped_gemm.cpp calls, for the emulated device: a handle
// with its stream, and cublasGemmGroupedBatchedEx as a column-major reference computed on the host,
// queued on the handle's stream like a kernel and recording what it reads and writes. The test
// binary links these instead of libcublas.
//
// The operation (cublas_api.h; the cuBLAS guide, "cublasGemmGroupedBatchedEx"), column-major: group
// i has group_size[i] problems sharing transa, transb, m, n, k, alpha, lda, ldb, beta and ldc;
// problem j (counted over all groups) computes C_j = alpha op(A_j) op(B_j) + beta C_j in fp32,
// rounded once to C's type; C_j is not read when beta == 0. The scalars and the shape arrays are
// host arrays; Aarray, Barray and Carray are device arrays of device pointers, read when the
// operation runs (stream order). Types: A, B and C all bf16 or all fp32 with CUBLAS_COMPUTE_32F
// (the combinations cuBLAS documents for those types; fp16 and the TF32 compute types are not
// emulated). Like cuBLAS, a bad argument is an error status, not a best guess; stricter than a
// GPU, every matrix must lie inside one device allocation, aligned to its elements, and a C must
// not overlap its own A or B. Every error status is explained on stderr ("emulated cuBLAS: ...").
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "emu/blas_values.h"
#include "emu/emulator.h"

namespace {

using emu::detail::find_allocation;

struct Handle {
  cudaStream_t stream = nullptr;
};
std::mutex g_mu;
std::set<const Handle*>& handles() {
  static std::set<const Handle*> h;
  return h;
}
Handle* handle_of(cublasHandle_t h) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto* p = reinterpret_cast<Handle*>(h);
  return handles().count(p) ? p : nullptr;
}

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_?";
  }
}

cublasStatus_t error(cublasStatus_t s, const char* fn, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
cublasStatus_t error(cublasStatus_t s, const char* fn, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "emulated cuBLAS: %s: %s: %s\n", fn, status_name(s), msg);
  return s;
}

// One problem: column-major matrices X(r, c) = X[r + c * ld].
struct Problem {
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
};

using emu::blas::elem_size;
using emu::blas::load;
using emu::blas::store;

// Bytes a cols x ld column-major matrix with `rows` rows spans.
size_t extent(int64_t rows, int64_t cols, int64_t ld, size_t e) {
  return rows == 0 || cols == 0 ? 0 : (size_t(cols - 1) * size_t(ld) + size_t(rows)) * e;
}

// The whole grouped call, queued on the handle's stream: reads the pointer arrays when it runs.
class GroupedOp final : public emu::detail::Op {
 public:
  GroupedOp(std::vector<Problem> problems, const void* const* a, const void* const* b, void* const* c,
            cudaDataType_t type)
      : p_(std::move(problems)), a_(a), b_(b), c_(c), type_(type) {}

  Status run() override {
    using emu::detail::Access;
    const size_t count = p_.size(), e = elem_size(type_);
    for (const void* const* arr : {static_cast<const void* const*>(a_), static_cast<const void* const*>(b_),
                                   static_cast<const void* const*>(c_)})
      emu::detail::note_access(arr, count * sizeof(void*), Access::kRead, 0);
    for (size_t j = 0; j < count; ++j) {
      const Problem& p = p_[j];
      const void* A = a_[j];
      const void* B = b_[j];
      void* C = c_[j];
      // op(A) is m x k: A is m x k (N) or k x m (T); op(B) is k x n: B is k x n (N) or n x k (T).
      const int64_t arows = p.ta ? p.k : p.m, acols = p.ta ? p.m : p.k;
      const int64_t brows = p.tb ? p.n : p.k, bcols = p.tb ? p.k : p.n;
      const auto* cbytes = static_cast<const char*>(C);
      const size_t cext = extent(p.m, p.n, p.ldc, e);
      for (auto [ptr, rows, cols, ld, what] :
           {std::tuple{A, arows, acols, p.lda, "A"}, std::tuple{B, brows, bcols, p.ldb, "B"},
            std::tuple{static_cast<const void*>(C), p.m, p.n, p.ldc, "C"}}) {
        const size_t bytes = extent(rows, cols, ld, e);
        if (!bytes) continue;
        const char* why = nullptr;
        if (!find_allocation(ptr, bytes))
          why = "is not inside one device allocation: on a GPU, an illegal memory access";
        else if (reinterpret_cast<uintptr_t>(ptr) % e)
          why = "is not aligned to its elements: on a GPU, a misaligned access";
        else if (ptr != C && cext && static_cast<const char*>(ptr) < cbytes + cext &&
                 cbytes < static_cast<const char*>(ptr) + bytes)
          why = "overlaps the problem's C, which the product writes while reading it";
        if (why) {
          std::fprintf(stderr, "emulated cuBLAS: cublasGemmGroupedBatchedEx: problem %zu's %s [%p, +%zu bytes) %s\n",
                       j, what, ptr, bytes, why);
          std::abort();
        }
      }
      if (p.alpha != 0.0f) {
        emu::detail::note_strided(A, size_t(acols), size_t(arows) * e, size_t(p.lda) * e, Access::kRead);
        emu::detail::note_strided(B, size_t(bcols), size_t(brows) * e, size_t(p.ldb) * e, Access::kRead);
      }
      if (p.beta != 0.0f) emu::detail::note_strided(C, size_t(p.n), size_t(p.m) * e, size_t(p.ldc) * e, Access::kRead);
      emu::detail::note_strided(C, size_t(p.n), size_t(p.m) * e, size_t(p.ldc) * e, Access::kWrite);
      std::vector<float> out(size_t(p.m * p.n));
      for (int64_t jj = 0; jj < p.n; ++jj)
        for (int64_t i = 0; i < p.m; ++i) {
          float lanes[4] = {0, 0, 0, 0};  // four interleaved fp32 partial sums, as a GPU tile splits k
          for (int64_t l = 0; l < p.k; ++l) {
            const float x = load(A, type_, p.ta ? size_t(l + i * p.lda) : size_t(i + l * p.lda));
            const float y = load(B, type_, p.tb ? size_t(jj + l * p.ldb) : size_t(l + jj * p.ldb));
            lanes[l % 4] = std::fma(x, y, lanes[l % 4]);
          }
          float v = p.alpha * ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]));
          if (p.beta != 0.0f) v += p.beta * load(C, type_, size_t(i + jj * p.ldc));
          out[size_t(i + jj * p.m)] = v;
        }
      for (int64_t jj = 0; jj < p.n; ++jj)
        for (int64_t i = 0; i < p.m; ++i) store(C, type_, size_t(i + jj * p.ldc), out[size_t(i + jj * p.m)]);
    }
    return kDone;
  }

 private:
  std::vector<Problem> p_;
  const void* const* a_;
  const void* const* b_;
  void* const* c_;
  cudaDataType_t type_;
};

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return error(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate", "null handle pointer");
  auto* h = new Handle;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    handles().insert(h);
  }
  *handle = reinterpret_cast<cublasHandle_t>(h);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  Handle* h = handle_of(handle);
  if (!h) return error(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy", "not a live handle");
  {
    std::lock_guard<std::mutex> lock(g_mu);
    handles().erase(h);
  }
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  Handle* h = handle_of(handle);
  if (!h) return error(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream", "not a live handle");
  if (!emu::detail::valid_stream(stream)) return error(CUBLAS_STATUS_INVALID_VALUE, "cublasSetStream", "not a live stream");
  h->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t handle, const cublasOperation_t transa_array[],
                                          const cublasOperation_t transb_array[], const int m_array[],
                                          const int n_array[], const int k_array[], const void* alpha_array,
                                          const void* const Aarray[], cudaDataType_t Atype, const int lda_array[],
                                          const void* const Barray[], cudaDataType_t Btype, const int ldb_array[],
                                          const void* beta_array, void* const Carray[], cudaDataType_t Ctype,
                                          const int ldc_array[], int group_count, const int group_size[],
                                          cublasComputeType_t computeType) {
  const char* fn = "cublasGemmGroupedBatchedEx";
  Handle* h = handle_of(handle);
  if (!h) return error(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live handle");
  if (group_count < 0) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "group_count %d", group_count);
  if (group_count == 0) return CUBLAS_STATUS_SUCCESS;
  if (!transa_array || !transb_array || !m_array || !n_array || !k_array || !alpha_array || !lda_array ||
      !ldb_array || !beta_array || !ldc_array || !group_size)
    return error(CUBLAS_STATUS_INVALID_VALUE, fn, "a null host array");
  if (!(Atype == Btype && Btype == Ctype && (Atype == CUDA_R_16BF || Atype == CUDA_R_32F)))
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                 "types A %d, B %d, C %d: the emulation has A, B and C all bf16 or all fp32 (cuBLAS has no bf16 "
                 "inputs with an fp32 C in the grouped call)",
                 int(Atype), int(Btype), int(Ctype));
  if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute type %d is not emulated (CUBLAS_COMPUTE_32F is)",
                 int(computeType));
  const auto* alphas = static_cast<const float*>(alpha_array);
  const auto* betas = static_cast<const float*>(beta_array);
  std::vector<Problem> problems;
  for (int g = 0; g < group_count; ++g) {
    const cublasOperation_t ta = transa_array[g], tb = transb_array[g];
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
      return error(CUBLAS_STATUS_INVALID_VALUE, fn, "group %d: transa %d, transb %d (N or T)", g, int(ta), int(tb));
    const int m = m_array[g], n = n_array[g], k = k_array[g];
    if (m < 0 || n < 0 || k < 0 || group_size[g] < 0)
      return error(CUBLAS_STATUS_INVALID_VALUE, fn, "group %d: m %d, n %d, k %d, size %d", g, m, n, k, group_size[g]);
    const int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (lda_array[g] < std::max(1, arows) || ldb_array[g] < std::max(1, brows) || ldc_array[g] < std::max(1, m))
      return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                   "group %d: lda %d, ldb %d, ldc %d below the rows of A (%d), B (%d) or C (%d)", g, lda_array[g],
                   ldb_array[g], ldc_array[g], arows, brows, m);
    for (int j = 0; j < group_size[g]; ++j)
      problems.push_back(Problem{ta == CUBLAS_OP_T, tb == CUBLAS_OP_T, m, n, k, lda_array[g], ldb_array[g],
                                 ldc_array[g], alphas[g], betas[g]});
  }
  const size_t count = problems.size();
  if (count == 0) return CUBLAS_STATUS_SUCCESS;
  // The pointer arrays are device memory (a host array here is an illegal access on a GPU).
  for (auto [arr, what] : {std::pair{static_cast<const void*>(Aarray), "Aarray"},
                           std::pair{static_cast<const void*>(Barray), "Barray"},
                           std::pair{static_cast<const void*>(Carray), "Carray"}})
    if (!arr || !find_allocation(arr, count * sizeof(void*)))
      return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%s [%p, +%zu bytes) is not an array in device memory", what, arr,
                   count * sizeof(void*));
  if (!emu::detail::valid_stream(h->stream)) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "the handle's stream is gone");
  emu::detail::enqueue(h->stream, std::make_unique<GroupedOp>(std::move(problems), Aarray, Barray, Carray, Atype),
                       emu::detail::OpLabel{"cublasGemmGroupedBatchedEx"});
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
