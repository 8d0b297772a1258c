// Kernels for the emulator's own tests (test_emulator.cpp): plain CUDA, rewritten by cuda_to_cpp.py
// like the kernels of src/kernels/cuda. Each host function launches one kernel on device buffers,
// on the compute stream (where the tests' buffers are filled and read), waits for it, and returns
// what cudaGetLastError reported for the launch.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/runtime.h"
#include "selftest_kernels.h"

namespace emutest {
namespace {

__global__ void write_flag_kernel(int* flag) {
  extern __shared__ __align__(16) unsigned char smem[];
  if (threadIdx.x == 0) {
    smem[0] = 1;
    *flag = 7;
  }
}

// out[lane * 4 + k]: the four shuffles of the lane's own id, with `width`.
__global__ void shuffle_kernel(int* out, int delta, int width) {
  const int lane = threadIdx.x;
  out[lane * 4 + 0] = __shfl_up_sync(0xffffffffu, lane, unsigned(delta), width);
  out[lane * 4 + 1] = __shfl_down_sync(0xffffffffu, lane, unsigned(delta), width);
  out[lane * 4 + 2] = __shfl_xor_sync(0xffffffffu, lane, delta, width);
  out[lane * 4 + 3] = __shfl_sync(0xffffffffu, lane, delta, width);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// D[16x8] = A[16x16] B[16x8] + C with A stored row-major [m][k] (plain ldmatrix.x4) and B stored
// [k][n] (ldmatrix.x2.trans), fragments as the PTX ISA gives them; one warp.
__global__ void mma_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d) {
  __shared__ __align__(16) __nv_bfloat16 sa[16 * 16];
  __shared__ __align__(16) __nv_bfloat16 sb[16 * 8];
  const int lane = threadIdx.x;
  for (int i = lane; i < 16 * 16; i += 32) sa[i] = a[i];
  for (int i = lane; i < 16 * 8; i += 32) sb[i] = b[i];
  __syncwarp();
  uint32_t ra[4], rb[2];
  // Lane L: row L % 16, column 8 * (L / 16) of A: matrices (m 0-7, k 0-7), (m 8-15, k 0-7),
  // (m 0-7, k 8-15), (m 8-15, k 8-15) = a0..a3.
  const uint32_t aa = smem_addr(&sa[(lane % 16) * 16 + 8 * (lane / 16)]);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(ra[0]), "=r"(ra[1]), "=r"(ra[2]), "=r"(ra[3])
               : "r"(aa));
  // Lanes 0-15 address rows k = 0..15 of B ([k][n], 8 columns): .trans gives b0 (k 0-7), b1 (k 8-15).
  const uint32_t ba = smem_addr(&sb[(lane % 16) * 8]);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(rb[0]), "=r"(rb[1]) : "r"(ba));
  const int g = lane >> 2, t = lane & 3;
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// Reads shared memory nobody wrote.
__global__ void uninitialised_shared_kernel(float* out) {
  __shared__ float s[32];
  out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];
}

// ---- kernels with the bugs the emulation must catch ----

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 32) __syncthreads();  // only warp 0 reaches the barrier
  out[threadIdx.x] = 1;
}

__global__ void early_exit_barrier_kernel(int* out) {
  if (threadIdx.x >= 64) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_from_exited_lane_kernel(int* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 16);
}

__global__ void unwaited_cp_async_kernel(const __nv_bfloat16* src, uint32_t* out) {
  __shared__ __align__(128) __nv_bfloat16 tile[8 * 8];
  const int lane = threadIdx.x;
  if (lane < 8) {
    const uint32_t dst = smem_addr(&tile[lane * 8]);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src + lane * 8), "r"(16) : "memory");
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  __syncthreads();  // a barrier does not wait for cp.async: cp.async.wait_group is missing
  uint32_t r;
  const uint32_t addr = smem_addr(&tile[(lane % 8) * 8]);
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r) : "r"(addr));
  out[lane] = r;
}

__global__ void misaligned_vector_kernel(const float* p, float* out) {
  const float4 v = *reinterpret_cast<const float4*>(p + 1);  // p + 1 is 4 bytes past a 16-byte boundary
  out[threadIdx.x] = v.x;
}

__global__ void global_overrun_kernel(float4* p, int n) { __stwb(p + n + threadIdx.x, make_float4(1, 2, 3, 4)); }

__global__ void shared_overrun_kernel(int n) {
  extern __shared__ __align__(16) float dyn[];
  dyn[n + threadIdx.x] = 1.f;  // just past the end of the dynamic shared memory
}

// What the launch reported; then the kernel runs (the host waits for it).
cudaError_t launched() {
  const cudaError_t e = cudaGetLastError();
  cudaStreamSynchronize(primus::cuda::stream());
  return e;
}

// ---- races between blocks, exact bounds, large indices, bank conflicts ----

// Every block adds (block + 1, 1) to each of the n float2: with atomicAdd, or with a plain +=, as
// the flash attention backward would accumulate dQ without its atomics.
__global__ void accumulate_kernel(float2* acc, int n, bool atomic) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float2 v = make_float2(float(blockIdx.x + 1), 1.f);
    if (atomic) {
      atomicAdd(acc + i, v);
    } else {
      acc[i].x += v.x;
      acc[i].y += v.y;
    }
  }
}

// Block 0 writes a flag that the other blocks read: nothing orders the blocks of a launch.
__global__ void flag_between_blocks_kernel(int* flag, int* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *flag = 1;
  if (blockIdx.x > 0 && threadIdx.x == 0) out[blockIdx.x] = *flag;
}

// Each block writes its own part, then reads it back: no race.
__global__ void own_part_kernel(int* x) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  x[i] = i;
  __syncthreads();
  const int next = x[blockIdx.x * blockDim.x + (threadIdx.x + 1) % blockDim.x];
  __syncthreads();
  x[i] += next;
}

// out[j] = 2 in[j] for j < n, or j <= n (one past the end, as the chunked cross-entropy would read
// with `<=` for `<`).
__global__ void double_kernel(const float* in, float* out, int n, bool one_past) {
  for (int j = threadIdx.x; one_past ? j <= n : j < n; j += blockDim.x) out[j] = 2.f * in[j];
}

// x[base + t] = t for the block's 32 threads; `narrow`: the index goes through 32 bits, as the
// fused AdamW's element offset would with an int in place of int64_t.
__global__ void write_at_kernel(float* x, int64_t base, bool narrow) {
  if (narrow) {
    const int i = int(base) + int(threadIdx.x);
    x[i] = float(threadIdx.x);
  } else {
    x[base + threadIdx.x] = float(threadIdx.x);
  }
}

// One ldmatrix.x1 of 8 rows, `stride` bytes apart in shared memory.
__global__ void ldmatrix_rows_kernel(uint32_t* out, int stride) {
  extern __shared__ __align__(128) unsigned char rows[];
  for (int i = threadIdx.x; i < 8 * stride; i += 32) rows[i] = 0;
  __syncwarp();
  uint32_t r;
  const uint32_t addr = smem_addr(rows + (threadIdx.x % 8) * stride);
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r) : "r"(addr));
  out[threadIdx.x] = r;
}

// ---- plain work for the stream tests ----
__global__ void fill_kernel(int* p, int n, int value) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}
__global__ void copy_kernel(const int* in, int* out, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = in[i];
}

}  // namespace

cudaError_t launch_write_flag(int* flag, int blocks, int threads, size_t smem) {
  write_flag_kernel<<<blocks, threads, smem, primus::cuda::stream()>>>(flag);
  return launched();
}
cudaError_t allow_dynamic_smem_for_write_flag(int bytes) {
  return cudaFuncSetAttribute(write_flag_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}
cudaError_t launch_shuffles(int* out, int delta, int width) {
  shuffle_kernel<<<1, 32, 0, primus::cuda::stream()>>>(out, delta, width);
  return launched();
}
cudaError_t launch_mma(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d) {
  mma_kernel<<<1, 32, 0, primus::cuda::stream()>>>(a, b, c, d);
  return launched();
}
cudaError_t launch_uninitialised_shared(float* out) {
  uninitialised_shared_kernel<<<2, 32, 0, primus::cuda::stream()>>>(out);
  return launched();
}
cudaError_t launch_divergent_barrier(int* out) {
  divergent_barrier_kernel<<<1, 128, 0, primus::cuda::stream()>>>(out);
  return launched();
}
cudaError_t launch_early_exit_barrier(int* out) {
  early_exit_barrier_kernel<<<1, 128, 0, primus::cuda::stream()>>>(out);
  return launched();
}
cudaError_t launch_shuffle_from_exited_lane(int* out) {
  shuffle_from_exited_lane_kernel<<<1, 32, 0, primus::cuda::stream()>>>(out);
  return launched();
}
cudaError_t launch_unwaited_cp_async(const __nv_bfloat16* src, uint32_t* out) {
  unwaited_cp_async_kernel<<<1, 32, 0, primus::cuda::stream()>>>(src, out);
  return launched();
}
cudaError_t launch_misaligned_vector(const float* p, float* out) {
  misaligned_vector_kernel<<<1, 32, 0, primus::cuda::stream()>>>(p, out);
  return launched();
}
cudaError_t launch_global_overrun(float4* p, int n) {
  global_overrun_kernel<<<1, 32, 0, primus::cuda::stream()>>>(p, n);
  return launched();
}
cudaError_t launch_shared_overrun(int n) {
  shared_overrun_kernel<<<1, 32, n * sizeof(float), primus::cuda::stream()>>>(n);
  return launched();
}

cudaError_t launch_accumulate(float2* acc, int n, int blocks, bool atomic) {
  accumulate_kernel<<<blocks, 64, 0, primus::cuda::stream()>>>(acc, n, atomic);
  return launched();
}
cudaError_t launch_flag_between_blocks(int* flag, int* out, int blocks) {
  flag_between_blocks_kernel<<<blocks, 32, 0, primus::cuda::stream()>>>(flag, out);
  return launched();
}
cudaError_t launch_own_part(int* x, int blocks) {
  own_part_kernel<<<blocks, 64, 0, primus::cuda::stream()>>>(x);
  return launched();
}
cudaError_t launch_double(const float* in, float* out, int n, bool one_past) {
  double_kernel<<<1, 32, 0, primus::cuda::stream()>>>(in, out, n, one_past);
  return launched();
}
cudaError_t launch_write_at(float* x, int64_t base, bool narrow) {
  write_at_kernel<<<1, 32, 0, primus::cuda::stream()>>>(x, base, narrow);
  return launched();
}
cudaError_t launch_ldmatrix_rows(uint32_t* out, int stride) {
  ldmatrix_rows_kernel<<<1, 32, 8 * stride, primus::cuda::stream()>>>(out, stride);
  return launched();
}
void queue_fill(int* p, int n, int value, cudaStream_t stream) { fill_kernel<<<4, 64, 0, stream>>>(p, n, value); }
void queue_copy(const int* in, int* out, int n, cudaStream_t stream) { copy_kernel<<<4, 64, 0, stream>>>(in, out, n); }

}  // namespace emutest
