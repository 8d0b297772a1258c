// Dequantization of the quantized weights published Hugging Face checkpoints hold, to fp32, on
// import (this engine trains in fp32 / bf16; export writes F32 or BF16):
//   - DeepSeek-V3's fp8 block quantization: a weight stored as F8_E4M3 (E4M3 "fn": bias 7, no
//     infinities, S.1111.111 is NaN) with `<name>_scale_inv` of [ceil(rows / 128), ceil(cols / 128)]
//     fp32 factors, one per 128 x 128 block: w[i][j] = fp8[i][j] * scale_inv[i / 128][j / 128].
//   - OCP MXFP4 (gpt-oss's experts): `<name>_blocks` U8 [..., G, 16], two E2M1 values a byte (low
//     nibble first), and `<name>_scales` U8 [..., G], an E8M0 exponent per 32-value block:
//     w[..., 32 g + k] = e2m1 * 2^(scale - 127).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace primus::hf {

// One E4M3 (fn) byte as a float; NaN for S.1111.111.
float e4m3_to_float(uint8_t b);
// One E2M1 nibble (low 4 bits of `b`) as a float: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
float e2m1_to_float(uint8_t b);

// `fp8` (rows x cols E4M3 bytes) times the per-block factors `scale_inv` ([ceil(rows / block),
// ceil(cols / block)]); `what` names the tensor in errors (a scale grid of another shape).
std::vector<float> dequant_fp8_blocks(const std::string& fp8, int64_t rows, int64_t cols,
                                      const std::vector<float>& scale_inv, const std::vector<int64_t>& scale_shape,
                                      int64_t block, const std::string& what);

// MXFP4 `blocks` ([n, G, 16] bytes) and `scales` ([n, G] bytes): n x (32 G) floats.
std::vector<float> dequant_mxfp4(const std::string& blocks, const std::string& scales, int64_t n, int64_t groups,
                                 const std::string& what);

}  // namespace primus::hf
