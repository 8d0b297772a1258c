// Host entry points of selftest_kernels.cu (the emulator's own tests): each launches one kernel on
// the compute stream, waits for it, and returns what cudaGetLastError() said after the launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace emutest {

cudaError_t launch_write_flag(int* flag, int blocks, int threads, size_t smem);
cudaError_t allow_dynamic_smem_for_write_flag(int bytes);
cudaError_t launch_shuffles(int* out, int delta, int width);
cudaError_t launch_mma(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d);
cudaError_t launch_uninitialised_shared(float* out);
// Kernels with bugs (the tests expect the emulation to abort).
cudaError_t launch_divergent_barrier(int* out);
cudaError_t launch_early_exit_barrier(int* out);
cudaError_t launch_shuffle_from_exited_lane(int* out);
cudaError_t launch_unwaited_cp_async(const __nv_bfloat16* src, uint32_t* out);
cudaError_t launch_misaligned_vector(const float* p, float* out);
cudaError_t launch_global_overrun(float4* p, int n);
cudaError_t launch_shared_overrun(int n);
// Races between blocks, exact bounds, large indices (see the kernels).
cudaError_t launch_accumulate(float2* acc, int n, int blocks, bool atomic);
cudaError_t launch_flag_between_blocks(int* flag, int* out, int blocks);
cudaError_t launch_own_part(int* x, int blocks);
cudaError_t launch_double(const float* in, float* out, int n, bool one_past);
cudaError_t launch_write_at(float* x, int64_t base, bool narrow);
cudaError_t launch_ldmatrix_rows(uint32_t* out, int stride);
// Queued on `stream` without waiting (the stream tests order them themselves).
void queue_fill(int* p, int n, int value, cudaStream_t stream);
void queue_copy(const int* in, int* out, int n, cudaStream_t stream);

}  // namespace emutest
