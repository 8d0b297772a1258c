// FP8 numerics as Transformer Engine defines them, on the host: the two formats, rounding and
// saturation, the scales of each recipe, and quantization into the values an FP8 GEMM multiplies.
//
//   E4M3  (OCP "E4M3FN") 4 exponent bits (bias 7), 3 mantissa bits; largest finite 448, smallest
//         subnormal 2^-9; no infinities, NaN = S.1111.111
//   E5M2  5 exponent bits (bias 15), 2 mantissa bits; largest finite 57344, smallest subnormal
//         2^-16; IEEE infinities and NaNs
//
// Every value of both formats is exactly a bf16 value (and an fp32 one), so an FP8 GEMM with fp32
// accumulation runs exactly through a bf16 (or fp32) GEMM of the quantized values, its scales
// applied around it (docs/fp8.md). That is how the CPU runs FP8, and what the GPU is tested against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace primus::fp8 {

enum class Format : uint8_t { E4M3, E5M2 };
const char* format_name(Format f);  // "e4m3" | "e5m2"
float max_finite(Format f);         // 448 | 57344

// x rounded to the nearest value of the format, ties to even; beyond the largest finite value
// (infinities included) saturated to it with x's sign (TE's and cuBLASLt's "satfinite"); NaN stays
// NaN; the sign of zero is kept.
float round(float x, Format f);
uint8_t encode(float x, Format f);  // the bits of round(x, f)
// out[i] = round(x[i] * mul, f) * post, vectorized (the same values as round()).
void round_array(const float* x, float mul, float post, int64_t n, Format f, float* out);
float decode(uint8_t bits, Format f);

// A tensor's or tile's quantization scale from its amax (TE's compute_scale_from_amax): max / amax;
// 1 when amax is 0, infinite or NaN; FLT_MAX when the quotient overflows; with pow2 the power of
// two at or below it (the mantissa cleared), which makes the rescaled FP8 values exact in bf16.
float scale_from_amax(float amax, float max, bool pow2);

// MXFP8's shared block scale, an E8M0 byte (a biased power of two, 2^(e - 127)), of
// amax * (1 / max) rounded up, so that no element of the block saturates (TE's float_to_e8m0).
uint8_t e8m0_of(float value);
float e8m0_value(uint8_t e);

// How an operand of a GEMM is scaled. Blocks run along the GEMM's reduction dimension.
enum class Granularity : uint8_t {
  Tensor,     // one fp32 scale per tensor (delayed and current scaling)
  Tile1x128,  // blockwise: 1 x 128 tiles along the reduction dimension (activations, gradients)
  Block128,   // blockwise: 128 x 128 blocks (weights)
  Mx32,       // MXFP8: 1 x 32 blocks along the reduction dimension, E8M0 scales
};
const char* granularity_name(Granularity g);
// The coarser of two scalings, as a device's matrix units must take them: MX blocks, else
// DeepSeek's blocks, else tensor scales.
Granularity coarsest(Granularity a, Granularity b);

// An FP8 GEMM operand's kind: its format and its scaling.
struct OperandKind {
  Format format = Format::E4M3;
  Granularity granularity = Granularity::Tensor;
};

// Quantizes the row-major [rows, cols] array x into the values an FP8 GEMM multiplies:
//   Tensor  out = round(x * scale): the FP8 values themselves; the GEMM multiplies by 1 / scale
//   blocks  out = round(x * s_b) / s_b with each block's power-of-two scale s_b (blockwise: from
//           the block's amax; MXFP8: its E8M0 scale): the FP8 values rescaled, exactly; the GEMM
//           multiplies by nothing
// reduce_cols: the GEMM reduces over x's columns (1-D blocks run along a row), else over its rows
// (along a column). Ragged edges make smaller blocks. Returns amax |x| (NaN when x holds a NaN).
// Serial: a band of band_rows() rows is quantized alone, so callers split the rows between threads.
float quantize(const float* x, int64_t rows, int64_t cols, Format f, Granularity g, bool reduce_cols, float scale,
               float* out);
// The rows of a block: 128 (blocks; 1-D blocks down the columns), 32 (MX blocks down the columns), 1.
int64_t band_rows(Granularity g, bool reduce_cols);
// The columns of a block: 128 (blocks; 1-D blocks along the rows), 32 (MX blocks along the rows), 1
// (1-D blocks down the columns); 0 for Tensor (one scale for all).
int64_t block_cols(Granularity g, bool reduce_cols);
// amax |x| over n values (NaN when one is NaN).
float amax(const float* x, int64_t n);
// Two amaxes as one: the larger, a NaN in either sticking.
float fold_amax(float a, float b);

// Delayed scaling's per-tensor state (TE's DelayedScaling): the amax history, newest first, and the
// scale the next quantizations use.
enum class AmaxAlgo : uint8_t { Max, MostRecent };
constexpr const char* amax_algo_name(AmaxAlgo a) { return a == AmaxAlgo::Max ? "max" : "most_recent"; }  // Megatron's
struct DelayedScale {
  std::vector<float> history;  // [amax_history_len]; history[0] collects the current amaxes
  float scale = 1.0f;
  explicit DelayedScale(int history_len = 1) : history(size_t(history_len), 0.0f) {}
  // Folds a quantization's amax into history[0] (NaN sticks).
  void record(float amax);
  // TE's update: the history rolls (the newest entry to the back, a zero in front), the scale
  // becomes scaled_max / (max of the old history's entries that are not NaN, or its newest
  // entry), kept when that amax is 0 or not finite, FLT_MAX when the quotient overflows.
  // scaled_max = max_finite / 2^margin.
  void update(AmaxAlgo algo, float scaled_max);
};

}  // namespace primus::fp8
