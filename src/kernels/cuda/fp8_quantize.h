// The op set's quantize_fp8 on the GPU (kernels/cuda/fp8_quantize.cu): the same values as the
// host's fp8::quantize (kernels/fp8.h), bit for bit, from the same scalar rules
// (kernels/fp8_scalar.h). Row-major, contiguous, bf16 or fp32 in and out; runs on `stream` and
// waits for the amax it returns (one small copy to the host).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace primus::cuda {

struct Fp8Result {
  float amax = 0, scale = 1;  // amax |x| (NaN when x holds one); the tensor scale used (1 for blocks)
};

// x [rows, cols] quantized into out (same dtype: fp32 when f32, else bf16), in E4M3 (e4m3) or
// E5M2:
//   block_rows == 0       tensor scaling: out = round(x * scale), the FP8 values themselves;
//                         scale 0: current scaling, from the tensor's amax (fp8::scale_from_amax)
//   block_rows, block_cols  blocks of that shape (ragged at the edges): out = round(x * s_b) / s_b
//                         with each block's power-of-two scale s_b (mx: MXFP8's E8M0 rule, else
//                         blockwise's)
Fp8Result fp8_quantize(const void* x, void* out, bool f32, int64_t rows, int64_t cols, bool e4m3, int64_t block_rows,
                       int64_t block_cols, bool mx, float scale, cudaStream_t stream);

// x [rows, cols] (bf16 when !f32, else fp32) as FP8 bytes of E4M3 (e4m3) or E5M2, for cuBLASLt's
// FP8 GEMMs (gemm.h): out [rows, cols], or with transpose out [cols, rows], each row `ld` (at least
// its length) bytes long with zeros past its end (a GEMM's inner dimension padded to a multiple of
// 16 adds nothing). Each value is rounded to the format and encoded (fp8_scalar.h's encode): the FP8
// values that tensor-scaled quantize_fp8 writes come out exactly. Runs on `stream` without waiting.
void fp8_pack(const void* x, bool f32, int64_t rows, int64_t cols, bool e4m3, bool transpose, int64_t ld, uint8_t* out,
              cudaStream_t stream);

}  // namespace primus::cuda
