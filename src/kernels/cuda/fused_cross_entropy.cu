// Cross-entropy over vocabulary chunks: online log-sum-exp per row, the loss sum through a fixed
// two-stage tree, and the logits gradient.
#include "kernels/cuda/fused_common.cuh"  // first: see its note on fmt

#include <cmath>

namespace primus::cuda {

using namespace fused_detail;

namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32;

// (m, s) represents sum_k exp(z_k - m) over the values seen; m = -inf with s = 0 is "none yet".
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  if (mx == -INFINITY) return;  // both empty (or only -inf logits so far)
  s = s * expf(m - mx) + s2 * expf(m2 - mx);
  m = mx;
}

template <int V>
__device__ __forceinline__ void lse_add(float& m, float& s, const float (&z)[V]) {
  float lm = z[0];
#pragma unroll
  for (int k = 1; k < V; ++k) lm = fmaxf(lm, z[k]);
  if (lm > m) {  // never true for -inf (or NaN) values: m stays -inf until a finite logit
    s *= expf(m - lm);  // m = -inf: 0 * 0
    m = lm;
  }
  if (m != -INFINITY) {
#pragma unroll
    for (int k = 0; k < V; ++k) s += expf(z[k] - m);  // a NaN logit makes s NaN, as it should
  }
}

// Soft-capping (kernels/softcap.h): cap * tanh(z / cap); cap <= 0: z.
template <int V>
__device__ __forceinline__ void softcap_values(float (&z)[V], float cap) {
  if (cap > 0.f) {
#pragma unroll
    for (int k = 0; k < V; ++k) z[k] = cap * tanhf(z[k] / cap);
  }
}

__global__ void ce_init_kernel(float* __restrict__ row_max, float* __restrict__ row_sum,
                               float* __restrict__ target_logit, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.f;
    target_logit[i] = 0.f;
  }
}

// One warp per row over the chunk's vc columns (lane l: columns Vl, Vl + 32V, ...), lanes merged
// by a fixed butterfly, then merged into the row's running state by lane 0.
template <int V>
__global__ void __launch_bounds__(kThreads)
    ce_chunk_forward_kernel(const float* __restrict__ logits, const int32_t* __restrict__ targets, int64_t c0,
                            int64_t vc, float cap, float* __restrict__ row_max, float* __restrict__ row_sum,
                            float* __restrict__ target_logit, int64_t n) {
  const int lane = threadIdx.x & 31;
  const int64_t first = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int64_t step = int64_t(gridDim.x) * kRowsPerBlock;
  for (int64_t row = first; row < n; row += step) {  // uniform over the warp
    const float* z = logits + row * vc;
    float m = -INFINITY, s = 0.f;
    for (int64_t j = int64_t(lane) * V; j < vc; j += 32 * V) {
      float zv[V];
      load_f32<V>(z + j, zv);
      softcap_values<V>(zv, cap);
      lse_add<V>(m, s, zv);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(kFullMask, m, o);
      const float s2 = __shfl_xor_sync(kFullMask, s, o);
      lse_merge(m, s, m2, s2);
    }
    if (lane == 0) {
      float rm = row_max[row], rs = row_sum[row];
      lse_merge(rm, rs, m, s);
      row_max[row] = rm;
      row_sum[row] = rs;
      const int64_t t = targets[row];
      if (t >= c0 && t < c0 + vc) {
        float zt[1] = {z[t - c0]};
        softcap_values<1>(zt, cap);
        target_logit[row] = zt[0];
      }
    }
  }
}

// Stage 1: block b takes rows [b * kFinishRows, (b+1) * kFinishRows); thread t adds the rows
// t, t + 256, ... in order (fp64), the block tree gives partial[b]. Stage 2: one block adds the
// partials (thread t: t, t + 256, ...) and the tree gives the sum. Fixed by n alone.
constexpr int kFinishRows = 2048;

__global__ void __launch_bounds__(kThreads)
    ce_finish_partial_kernel(const float* __restrict__ row_max, const float* __restrict__ row_sum,
                             const float* __restrict__ target_logit, const int32_t* __restrict__ targets,
                             float* __restrict__ lse, double* __restrict__ partial, int64_t n, int64_t num_blocks) {
  __shared__ double red[kThreads / 32];
  for (int64_t b = blockIdx.x; b < num_blocks; b += gridDim.x) {  // uniform over the block
    double acc = 0;
    const int64_t end = std::min<int64_t>(n, (b + 1) * kFinishRows);
    for (int64_t i = b * kFinishRows + threadIdx.x; i < end; i += kThreads) {
      const float l = row_max[i] + logf(row_sum[i]);
      lse[i] = l;
      if (targets[i] >= 0) acc += double(l - target_logit[i]);
    }
    const double total = block_sum<kThreads>(acc, red);
    if (threadIdx.x == 0) partial[b] = total;
  }
}

__global__ void __launch_bounds__(kThreads)
    ce_finish_total_kernel(const double* __restrict__ partial, int64_t num_blocks, float* __restrict__ loss_sum) {
  __shared__ double red[kThreads / 32];
  double acc = 0;
  for (int64_t b = threadIdx.x; b < num_blocks; b += kThreads) acc += partial[b];
  const double total = block_sum<kThreads>(acc, red);
  if (threadIdx.x == 0) *loss_sum = float(total);
}

__global__ void __launch_bounds__(kThreads)
    ce_merge_max_kernel(float* __restrict__ row_max, float* __restrict__ row_sum,
                        const float* __restrict__ global_max, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const float g = global_max[i];
    if (row_sum[i] != 0.f) row_sum[i] *= expf(row_max[i] - g);  // an empty shard row stays 0
    row_max[i] = g;
  }
}

// dlogits = exp(z - lse) - onehot(target), z soft-capped and the result times the cap's slope
// 1 - (z / cap)^2 when cap > 0; zero rows for masked targets. Items of V columns.
template <int V>
__global__ void __launch_bounds__(kThreads)
    ce_chunk_backward_kernel(const float* __restrict__ logits, const float* __restrict__ lse,
                             const int32_t* __restrict__ targets, int64_t c0, int64_t vc, float cap,
                             bf16* __restrict__ dlogits, int64_t n) {
  const int64_t cv = vc / V, total = n * cv;
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * kThreads) {
    const int64_t i = idx / cv, j = (idx - i * cv) * V;
    const int64_t t = targets[i];
    float out[V];
    if (t < 0) {
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = 0.f;
    } else {
      const float l = lse[i];
      float zv[V];
      load_f32<V>(logits + i * vc + j, zv);
      softcap_values<V>(zv, cap);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = expf(zv[k] - l) - (c0 + j + k == t ? 1.0f : 0.0f);
      if (cap > 0.f) {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float u = zv[k] / cap;
          out[k] *= 1.0f - u * u;
        }
      }
    }
    store_bf16<V>(dlogits + i * vc + j, out);
  }
}

}  // namespace

void ce_init(float* row_max, float* row_sum, float* target_logit, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  ce_init_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(row_max, row_sum, target_logit, n);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void ce_chunk_forward(const float* logits, const int32_t* targets, int64_t c0, int64_t vc, float softcap,
                      float* row_max, float* row_sum, float* target_logit, int64_t n, cudaStream_t stream) {
  if (n <= 0 || vc <= 0) return;
  const unsigned grid = blocks_for(n, kRowsPerBlock);
  if (vc % 4 == 0 && aligned16(logits))
    ce_chunk_forward_kernel<4><<<grid, kThreads, 0, stream>>>(logits, targets, c0, vc, softcap, row_max, row_sum,
                                                              target_logit, n);
  else
    ce_chunk_forward_kernel<1><<<grid, kThreads, 0, stream>>>(logits, targets, c0, vc, softcap, row_max, row_sum,
                                                              target_logit, n);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void ce_merge_max(float* row_max, float* row_sum, const float* global_max, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  ce_merge_max_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(row_max, row_sum, global_max, n);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void ce_finish(const float* row_max, const float* row_sum, const float* target_logit, const int32_t* targets,
               float* lse, float* loss_sum, int64_t n, cudaStream_t stream) {
  if (n <= 0) {  // no rows: the sum is 0 (all-zero bits)
    PRIMUS_CUDA_CHECK(cudaMemsetAsync(loss_sum, 0, sizeof(float), stream));
    return;
  }
  const int64_t num_blocks = (n + kFinishRows - 1) / kFinishRows;
  Scratch partial(size_t(num_blocks) * sizeof(double));  // stream-ordered reuse (see fused_norm.cu)
  ce_finish_partial_kernel<<<blocks_for(num_blocks, 1), kThreads, 0, stream>>>(
      row_max, row_sum, target_logit, targets, lse, partial.as<double>(), n, num_blocks);
  PRIMUS_CUDA_CHECK_LAUNCH();
  ce_finish_total_kernel<<<1, kThreads, 0, stream>>>(partial.as<double>(), num_blocks, loss_sum);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void ce_chunk_backward(const float* logits, const float* lse, const int32_t* targets, int64_t c0, int64_t vc,
                       float softcap, bf16* dlogits, int64_t n, cudaStream_t stream) {
  if (n <= 0 || vc <= 0) return;
  if (vc % 8 == 0 && aligned16(logits) && aligned16(dlogits))
    ce_chunk_backward_kernel<8><<<blocks_for(n * (vc / 8), kThreads), kThreads, 0, stream>>>(logits, lse, targets, c0,
                                                                                             vc, softcap, dlogits, n);
  else
    ce_chunk_backward_kernel<1><<<blocks_for(n * vc, kThreads), kThreads, 0, stream>>>(logits, lse, targets, c0, vc,
                                                                                       softcap, dlogits, n);
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace primus::cuda
