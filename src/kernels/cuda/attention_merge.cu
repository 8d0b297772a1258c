// Context parallelism's log-sum-exp merge (flash_attention.h): one warp per (sequence, query,
// head); every lane reads the two log-sum-exps and takes head-dimension values lane, lane + 32,
// ...; lane 0 writes the merged log-sum-exp once the warp has read the old one.
#include "kernels/cuda/fused_common.cuh"  // first: see its note on fmt

#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/runtime.h"

namespace primus::cuda {

using namespace fused_detail;

namespace {

constexpr int kWarps = 8;

__global__ void __launch_bounds__(kWarps * 32)
    attention_merge_kernel(float* __restrict__ acc, float* __restrict__ lse, const bf16* __restrict__ block_out,
                           const float* __restrict__ block_lse, int64_t items, int seq, int heads, int head_dim) {
  const int lane = threadIdx.x & 31;
  const int64_t item = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);  // lse index: (b, h, t)
  if (item >= items) return;
  const int t = int(item % seq), h = int((item / seq) % heads);
  const int64_t b = item / (int64_t(seq) * heads);
  const float la = lse[item], lb = block_lse[item], m = fmaxf(la, lb);
  if (m == -INFINITY) return;  // neither has seen a key yet
  const float wa = expf(la - m), wb = expf(lb - m), inv = 1.0f / (wa + wb);
  const int64_t off = ((b * seq + t) * heads + h) * head_dim;
  for (int d = lane; d < head_dim; d += 32)
    acc[off + d] = (acc[off + d] * wa + __bfloat162float(block_out[off + d]) * wb) * inv;
  __syncwarp();
  if (lane == 0) lse[item] = m + logf(wa + wb);
}

constexpr int kSinkThreads = 256;

// One CTA per head: each thread sums rows tid, tid + 256, ... in order, then a fixed tree.
__global__ void __launch_bounds__(kSinkThreads)
    attention_sink_backward_kernel(const bf16* __restrict__ out, const float* __restrict__ lse,
                                   const bf16* __restrict__ dout, const float* __restrict__ sinks,
                                   float* __restrict__ dsinks, int batch, int seq, int heads, int head_dim) {
  __shared__ float part[kSinkThreads];
  const int h = blockIdx.x;
  const int64_t rows = int64_t(batch) * seq;
  float sum = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += kSinkThreads) {
    const int64_t b = r / seq, t = r % seq;
    const int64_t off = (r * heads + h) * head_dim;
    float di = 0.f;
    for (int d = 0; d < head_dim; ++d) di += __bfloat162float(out[off + d]) * __bfloat162float(dout[off + d]);
    sum += expf(sinks[h] - lse[(b * heads + h) * seq + t]) * di;
  }
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int w = kSinkThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsinks[h] -= part[0];
}

}  // namespace

void attention_sink_backward(const bf16* out, const float* lse, const bf16* dout, const float* sinks, float* dsinks,
                             const AttentionDims& d, cudaStream_t stream) {
  if (d.heads == 0) return;
  attention_sink_backward_kernel<<<unsigned(d.heads), kSinkThreads, 0, stream>>>(
      out, lse, dout, sinks, dsinks, int(d.batch), int(d.seq), int(d.heads), int(d.head_dim));
  PRIMUS_CUDA_CHECK_LAUNCH();
}

void attention_merge(float* acc, float* lse, const bf16* block_out, const float* block_lse, const AttentionDims& d,
                     cudaStream_t stream) {
  const int64_t items = d.batch * d.heads * d.seq;
  if (items == 0) return;
  const unsigned blocks = unsigned((items + kWarps - 1) / kWarps);
  attention_merge_kernel<<<blocks, kWarps * 32, 0, stream>>>(acc, lse, block_out, block_lse, items, int(d.seq),
                                                              int(d.heads), int(d.head_dim));
  PRIMUS_CUDA_CHECK_LAUNCH();
}

}  // namespace primus::cuda
