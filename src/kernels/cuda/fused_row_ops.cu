// The token-routing row ops of the mixture-of-experts layer (gather_rows, scatter_add_rows,
// row_dots), on the device instead of the op set's host default (kernels/row_ops.cpp), computing
// what it computes: double arithmetic, each result rounded once to the destination dtype (through
// float, as the host's put does), the scatter's contributions added in list order by fused
// multiply-adds (row_ops.cpp's std::fma). So gather and scatter give the host's bits exactly.
//
// Accesses are scalar: a warp reads 32 consecutive columns of one row (coalesced); the rows are
// few and the double arithmetic is not the bottleneck of an MoE layer.
#include "kernels/cuda/fused_common.cuh"  // first: see its note on fmt

#include <algorithm>

namespace primus::cuda {

using namespace fused_detail;

namespace {

constexpr int kThreads = 256;
constexpr int kColThreads = 128;  // scatter: the columns of one destination row per block
constexpr int kDotThreads = 128;  // row_dots: one block per listed row

__device__ __forceinline__ double widen(bf16 v) { return double(__bfloat162float(v)); }
__device__ __forceinline__ double widen(float v) { return double(v); }
// double -> float -> bf16, both round to nearest even: the host's bf16::from_float(float(v)).
__device__ __forceinline__ void put(bf16* p, double v) { *p = __float2bfloat16(float(v)); }
__device__ __forceinline__ void put(float* p, double v) { *p = float(v); }

// out[i, j] = scale[i] * x[rows[i], j]; scale null means 1. Items are single elements.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const T* __restrict__ x, const int32_t* __restrict__ rows, const double* __restrict__ scale,
                       T* __restrict__ out, int64_t n, int64_t c) {
  const int64_t total = n * c;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t i = idx / c, j = idx - i * c;
    const double s = scale ? scale[i] : 1.0;
    put(out + idx, s * widen(x[int64_t(rows[i]) * c + j]));
  }
}

// Items are (destination group u, chunk of kColThreads columns); a thread owns one column of one
// destination row, so nothing is shared and no atomics are needed. Its sum starts from out's
// value and adds the group's contributions in list order (`lists` ascending within a group).
template <typename T>
__global__ void __launch_bounds__(kColThreads)
    scatter_add_rows_kernel(const int32_t* __restrict__ dest, const int32_t* __restrict__ offsets,
                            const int32_t* __restrict__ lists, int64_t num_dest, const T* __restrict__ y,
                            const double* __restrict__ scale, T* __restrict__ out, int64_t c) {
  const int64_t chunks = (c + kColThreads - 1) / kColThreads, total = num_dest * chunks;
  for (int64_t item = blockIdx.x; item < total; item += gridDim.x) {
    const int64_t u = item / chunks, j = (item - u * chunks) * kColThreads + threadIdx.x;
    if (j >= c) continue;
    T* dst = out + int64_t(dest[u]) * c + j;
    double acc = widen(*dst);
    for (int32_t p = offsets[u]; p < offsets[u + 1]; ++p) {
      const int64_t i = lists[p];
      acc = __fma_rn(scale ? scale[i] : 1.0, widen(y[i * c + j]), acc);
    }
    put(dst, acc);
  }
}

// dots[i] = <a[rows[i]], b[i]>: one block per listed row (blocks stride over them), threads over
// columns, then the fixed block tree of fused_common.cuh.
template <typename T>
__global__ void __launch_bounds__(kDotThreads)
    row_dots_kernel(const T* __restrict__ a, const int32_t* __restrict__ rows, const T* __restrict__ b,
                    double* __restrict__ dots, int64_t n, int64_t c) {
  __shared__ double red[kDotThreads / 32];
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {  // uniform over the block
    const T* ar = a + int64_t(rows[i]) * c;
    const T* br = b + i * c;
    double acc = 0;
    for (int64_t j = threadIdx.x; j < c; j += kDotThreads) acc = __fma_rn(widen(ar[j]), widen(br[j]), acc);
    const double total = block_sum<kDotThreads>(acc, red);
    if (threadIdx.x == 0) dots[i] = total;
  }
}

template <typename T>
void launch_gather(const T* x, const int32_t* rows, const double* scale, T* out, int64_t n, int64_t c,
                   cudaStream_t stream) {
  if (n <= 0 || c <= 0) return;
  gather_rows_kernel<T><<<blocks_for(n * c, kThreads), kThreads, 0, stream>>>(x, rows, scale, out, n, c);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_scatter(const int32_t* dest, const int32_t* offsets, const int32_t* lists, int64_t num_dest, const T* y,
                    const double* scale, T* out, int64_t c, cudaStream_t stream) {
  if (num_dest <= 0 || c <= 0) return;
  const int64_t items = num_dest * ((c + kColThreads - 1) / kColThreads);
  scatter_add_rows_kernel<T><<<blocks_for(items, 1), kColThreads, 0, stream>>>(dest, offsets, lists, num_dest, y,
                                                                               scale, out, c);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_dots(const T* a, const int32_t* rows, const T* b, double* dots, int64_t n, int64_t c,
                 cudaStream_t stream) {
  if (n <= 0) return;
  row_dots_kernel<T><<<blocks_for(n, 1), kDotThreads, 0, stream>>>(a, rows, b, dots, n, c);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gather_rows(const bf16* x, const int32_t* rows, const double* scale, bf16* out, int64_t n, int64_t c,
                 cudaStream_t stream) {
  launch_gather(x, rows, scale, out, n, c, stream);
}
void gather_rows(const float* x, const int32_t* rows, const double* scale, float* out, int64_t n, int64_t c,
                 cudaStream_t stream) {
  launch_gather(x, rows, scale, out, n, c, stream);
}

void scatter_add_rows(const int32_t* dest, const int32_t* offsets, const int32_t* lists, int64_t num_dest,
                      const bf16* y, const double* scale, bf16* out, int64_t c, cudaStream_t stream) {
  launch_scatter(dest, offsets, lists, num_dest, y, scale, out, c, stream);
}
void scatter_add_rows(const int32_t* dest, const int32_t* offsets, const int32_t* lists, int64_t num_dest,
                      const float* y, const double* scale, float* out, int64_t c, cudaStream_t stream) {
  launch_scatter(dest, offsets, lists, num_dest, y, scale, out, c, stream);
}

void row_dots(const bf16* a, const int32_t* rows, const bf16* b, double* dots, int64_t n, int64_t c,
              cudaStream_t stream) {
  launch_dots(a, rows, b, dots, n, c, stream);
}
void row_dots(const float* a, const int32_t* rows, const float* b, double* dots, int64_t n, int64_t c,
              cudaStream_t stream) {
  launch_dots(a, rows, b, dots, n, c, stream);
}

}  // namespace primus::cuda
