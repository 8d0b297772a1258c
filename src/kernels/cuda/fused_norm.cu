// RMSNorm (forward, input gradient, weight gradient) and the column sums that share the weight
// gradient's deterministic two-stage reduction (bias gradients).
//
// Row-wise kernels: one warp per row, 8 warps (256 threads) per block, warps striding over rows.
// A row is read twice (statistics, then the output); the second read hits L2 (a row of 4096 bf16
// is 8 KiB). With c % 8 == 0 and 16-byte aligned buffers, lanes move 8 bf16 per 16-byte access
// (lane l takes columns 8l, 8l + 256, ...: a warp reads 512 contiguous bytes per step); otherwise
// lanes take single columns (odd c).
#include "kernels/cuda/fused_common.cuh"

namespace primus::cuda {

using namespace fused_detail;

namespace {

constexpr int kRowThreads = 256;
constexpr int kRowsPerBlock = kRowThreads / 32;

// Min 6 blocks/SM: left alone, ptxas squeezes the V = 8 variant into 32 registers and spills.
template <int V>
__global__ void __launch_bounds__(kRowThreads, 6)
    rmsnorm_forward_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y,
                           float* __restrict__ rstd, int64_t n, int64_t c, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t first = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int64_t step = int64_t(gridDim.x) * kRowsPerBlock;
  for (int64_t row = first; row < n; row += step) {  // uniform over the warp
    const bf16* xr = x + row * c;
    float ss = 0.f;
    for (int64_t j = int64_t(lane) * V; j < c; j += 32 * V) {
      float xv[V];
      load_bf16<V>(xr + j, xv);
#pragma unroll
      for (int k = 0; k < V; ++k) ss += xv[k] * xv[k];
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / float(c) + eps);
    if (lane == 0) rstd[row] = r;
    bf16* yr = y + row * c;
    for (int64_t j = int64_t(lane) * V; j < c; j += 32 * V) {
      float xv[V], wv[V], out[V];
      load_bf16<V>(xr + j, xv);
      load_bf16<V>(w + j, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = xv[k] * r * wv[k];
      store_bf16<V>(yr + j, out);
    }
  }
}

// residual may be null or alias dx (read before written, by the same thread): no __restrict__.
template <int V>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_backward_input_kernel(const bf16* dy, const bf16* x, const bf16* __restrict__ w,
                                  const float* __restrict__ rstd, const bf16* residual, bf16* dx, int64_t n,
                                  int64_t c) {
  const int lane = threadIdx.x & 31;
  const int64_t first = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int64_t step = int64_t(gridDim.x) * kRowsPerBlock;
  for (int64_t row = first; row < n; row += step) {
    const bf16* dyr = dy + row * c;
    const bf16* xr = x + row * c;
    const float r = rstd[row];
    float dot = 0.f;
    for (int64_t j = int64_t(lane) * V; j < c; j += 32 * V) {
      float dyv[V], xv[V], wv[V];
      load_bf16<V>(dyr + j, dyv);
      load_bf16<V>(xr + j, xv);
      load_bf16<V>(w + j, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) dot += dyv[k] * wv[k] * xv[k];
    }
    dot = warp_sum(dot);
    const float kk = dot * r * r / float(c);
    bf16* dxr = dx + row * c;
    const bf16* resr = residual ? residual + row * c : nullptr;
    for (int64_t j = int64_t(lane) * V; j < c; j += 32 * V) {
      float dyv[V], xv[V], wv[V], out[V];
      load_bf16<V>(dyr + j, dyv);
      load_bf16<V>(xr + j, xv);
      load_bf16<V>(w + j, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = r * (dyv[k] * wv[k] - xv[k] * kk);
      if (resr) {
        float rv[V];
        load_bf16<V>(resr + j, rv);
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] = rv[k] + out[k];
      }
      store_bf16<V>(dxr + j, out);
    }
  }
}

// ---- Column sums, two stages ----
// Stage 1: block (column tile of 32*V columns, row block of `rows_per_block` rows). Its 256
// threads are 32 column-lanes x 8 row-lanes; row-lane q sums rows q, q+8, ... of the row block in
// order, the 8 row-lane sums are added in order 0..7 through shared memory, and the tile's sums go
// to partial[row_block, column]. Stage 2: one thread per column adds the partials in row-block
// order and adds the total into out. Row blocks are 64 rows, longer when n would need more than
// kMaxRowBlocks of them (bounding the scratch at kMaxRowBlocks * c floats). Every shape is fixed by
// (n, c) alone, never by the device: same inputs, same bits.
constexpr int64_t kColRows = 64;
constexpr int64_t kMaxRowBlocks = 1024;
constexpr int kColThreads = 256;

template <bool kWithX, int V>
__global__ void __launch_bounds__(kColThreads)
    column_partial_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x, const float* __restrict__ rstd,
                          float* __restrict__ partial, int64_t n, int64_t c, int64_t rows_per_block,
                          int64_t num_row_blocks) {
  constexpr int kTile = 32 * V;
  __shared__ __align__(16) float red[8][kTile];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int64_t tile0 = int64_t(blockIdx.x) * kTile;
  const int64_t j = tile0 + int64_t(tx) * V;  // c % V == 0 on the vector path: j < c covers all V
  for (int64_t rb = blockIdx.y; rb < num_row_blocks; rb += gridDim.y) {  // uniform over the block
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.f;
    if (j < c) {
      const int64_t r_end = std::min<int64_t>(n, (rb + 1) * rows_per_block);
      for (int64_t i = rb * rows_per_block + ty; i < r_end; i += 8) {
        float dyv[V];
        load_bf16<V>(dy + i * c + j, dyv);
        if constexpr (kWithX) {
          float xv[V];
          load_bf16<V>(x + i * c + j, xv);
          const float r = rstd[i];
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] += dyv[k] * xv[k] * r;
        } else {
#pragma unroll
          for (int k = 0; k < V; ++k) acc[k] += dyv[k];
        }
      }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) red[ty][tx * V + k] = acc[k];  // shared memory: not store_f32 (global only)
    __syncthreads();
    for (int col = threadIdx.x; col < kTile; col += kColThreads) {
      float s = red[0][col];
#pragma unroll
      for (int q = 1; q < 8; ++q) s += red[q][col];
      if (tile0 + col < c) partial[rb * c + tile0 + col] = s;
    }
    __syncthreads();  // red is rewritten by the next row block
  }
}

__global__ void column_finish_kernel(const float* __restrict__ partial, float* __restrict__ out, int64_t c,
                                     int64_t num_row_blocks) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < c; j += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int64_t b = 0; b < num_row_blocks; ++b) s += partial[b * c + j];
    out[j] += s;
  }
}

template <bool kWithX>
void column_reduce(const bf16* dy, const bf16* x, const float* rstd, float* out, int64_t n, int64_t c,
                   cudaStream_t stream) {
  if (n <= 0 || c <= 0) return;
  int64_t rows_per_block = kColRows;
  if (n > kColRows * kMaxRowBlocks) rows_per_block = ((n + kMaxRowBlocks - 1) / kMaxRowBlocks + 7) / 8 * 8;
  const int64_t num_row_blocks = (n + rows_per_block - 1) / rows_per_block;
  // Stream-ordered reuse: the caching allocator hands this block out again only to work queued
  // after ours on the compute stream.
  Scratch partial(size_t(num_row_blocks) * size_t(c) * sizeof(float));
  const bool vec = c % 8 == 0 && aligned16(dy) && (!kWithX || aligned16(x));
  const int64_t tile = vec ? 256 : 32;
  const dim3 grid(unsigned((c + tile - 1) / tile), unsigned(std::min<int64_t>(num_row_blocks, 65535)));
  if (vec)
    column_partial_kernel<kWithX, 8><<<grid, kColThreads, 0, stream>>>(dy, x, rstd, partial.as<float>(), n, c,
                                                                       rows_per_block, num_row_blocks);
  else
    column_partial_kernel<kWithX, 1><<<grid, kColThreads, 0, stream>>>(dy, x, rstd, partial.as<float>(), n, c,
                                                                       rows_per_block, num_row_blocks);
  PRIMUS_CUDA_CHECK_LAUNCH();
  column_finish_kernel<<<blocks_for(c, 256), 256, 0, stream>>>(partial.as<float>(), out, c, num_row_blocks);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(const bf16* x, const bf16* w, bf16* y, float* rstd, int64_t n, int64_t c, float eps,
                     cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned grid = blocks_for(n, kRowsPerBlock);
  if (c % 8 == 0 && aligned16(x) && aligned16(w) && aligned16(y))
    rmsnorm_forward_kernel<8><<<grid, kRowThreads, 0, stream>>>(x, w, y, rstd, n, c, eps);
  else
    rmsnorm_forward_kernel<1><<<grid, kRowThreads, 0, stream>>>(x, w, y, rstd, n, c, eps);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward_input(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, const bf16* residual,
                            bf16* dx, int64_t n, int64_t c, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned grid = blocks_for(n, kRowsPerBlock);
  if (c % 8 == 0 && aligned16(dy) && aligned16(x) && aligned16(w) && aligned16(dx) &&
      (!residual || aligned16(residual)))
    rmsnorm_backward_input_kernel<8><<<grid, kRowThreads, 0, stream>>>(dy, x, w, rstd, residual, dx, n, c);
  else
    rmsnorm_backward_input_kernel<1><<<grid, kRowThreads, 0, stream>>>(dy, x, w, rstd, residual, dx, n, c);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward_weight(const bf16* dy, const bf16* x, const float* rstd, float* dw, int64_t n, int64_t c,
                             cudaStream_t stream) {
  column_reduce<true>(dy, x, rstd, dw, n, c, stream);
}

void column_sum_accumulate(const bf16* dy, float* out, int64_t n, int64_t m, cudaStream_t stream) {
  column_reduce<false>(dy, nullptr, nullptr, out, n, m, stream);
}

}  // namespace primus::cuda
