// The op set's quantize_fp8 on the GPU (kernels/cuda/fp8_quantize.cu): the same values as the
// host's fp8::quantize (kernels/fp8.h), bit for bit, from the same scalar rules
// (kernels/fp8_scalar.h). Row-major, contiguous, bf16 or fp32 in and out; runs on `stream` and
// waits for the amax it returns (one small copy to the host) unless told where else it goes
// (Fp8AmaxDest).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace primus::cuda {

struct Fp8Result {
  float amax = 0, scale = 1;  // amax |x| (NaN when x holds one); the tensor scale used (1 for blocks)
};

// Where the blocks' dequantization scales (1 / s_b) go for cuBLASLt's block-scaled FP8 GEMMs
// (gemm.h's layouts): the GEMM reduces over x's columns (k_along_cols: x [outer, k]) or rows (x
// [k, outer]); 1 x 128 tiles give the Vec128 layout [ceil(k / 128), outer], 128 x 128 blocks the
// Blk128 layout [ceil(outer / 128), round_up(ceil(k / 128), 4)] (its padding written as zeros).
struct Fp8GemmScales {
  float* out = nullptr;  // gemm_scale_count() floats on the device; null: none
  bool k_along_cols = true;
};

// What fp8_quantize does with amax |x|: returns it, waiting for the device (the default); folds it
// into *fold on the device (a non-negative fp32 amax or a NaN, folded as fp8::fold_amax: the larger,
// a NaN sticking) and returns 0 without waiting; or, not wanted, neither. Current scaling waits for
// the amax whatever this says: the scale comes from it on the host.
struct Fp8AmaxDest {
  float* fold = nullptr;
  bool wanted = true;
};

// x [rows, cols] quantized into out (same dtype: fp32 when f32, else bf16), in E4M3 (e4m3) or
// E5M2:
//   block_rows == 0       tensor scaling: out = round(x * scale), the FP8 values themselves;
//                         scale 0: current scaling, from the tensor's amax (fp8::scale_from_amax)
//   block_rows, block_cols  blocks of that shape (ragged at the edges): out = round(x * s_b) / s_b
//                         with each block's power-of-two scale s_b (mx: MXFP8's E8M0 rule, else
//                         blockwise's); gemm_scales.out, when set, receives 1 / s_b (1 x 128 and
//                         128 x 128 blocks only)
Fp8Result fp8_quantize(const void* x, void* out, bool f32, int64_t rows, int64_t cols, bool e4m3, int64_t block_rows,
                       int64_t block_cols, bool mx, float scale, cudaStream_t stream,
                       const Fp8GemmScales& gemm_scales = {}, const Fp8AmaxDest& amax = {});

// x [rows, cols] (bf16 when !f32, else fp32) as FP8 bytes of E4M3 (e4m3) or E5M2, for cuBLASLt's
// FP8 GEMMs (gemm.h): out [rows, cols], or with transpose out [cols, rows], each row `ld` (at least
// its length) bytes long with zeros past its end (a GEMM's inner dimension padded to a multiple of
// 16 adds nothing). Each value is rounded to the format and encoded (fp8_scalar.h's encode): the FP8
// values that tensor-scaled quantize_fp8 writes come out exactly. With block scales (the output's
// rows being a GEMM operand's outer dimension and its columns k, in gemm.h's Vec128 layout when
// vec128, else Blk128), each value is divided by its block's scale first: the FP8 values of
// block-scaled quantize_fp8's output (FP8 values times 1 / s_b) come out exactly. Runs on `stream`
// without waiting.
void fp8_pack(const void* x, bool f32, int64_t rows, int64_t cols, bool e4m3, bool transpose, int64_t ld, uint8_t* out,
              cudaStream_t stream, const float* block_scales = nullptr, bool vec128 = true);

}  // namespace primus::cuda
