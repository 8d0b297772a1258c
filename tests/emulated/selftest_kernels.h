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

}  // namespace emutest
