// How quantize_fp8 (kernels/backend.h) runs on the host: the rows of a 2-D tensor in bands of
// whole blocks (fp8::band_rows), the bands split between the threads in one parallel region,
// current scaling's amax over all bands first. This file's quantize_in_bands is the one home of
// that loop; what one band does is an Fp8BandKernel: the op set's default (fp8::quantize through
// fp32 buffers, every dtype) or a backend's own (the CPU bf16 backend's AVX-512 kernels).
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace primus::ops {

struct Fp8Request {
  fp8::Format format;
  fp8::Granularity granularity;
  bool reduce_cols;  // the GEMM reduces over the tensor's columns (else its rows)
  float scale;       // Tensor granularity: the scale (0: current scaling); blocks: unused
};

class Fp8BandKernel {
 public:
  virtual ~Fp8BandKernel() = default;
  // amax |src| over elements [i0, i0 + n) of a host tensor (NaN when one is NaN).
  virtual float amax(const Tensor& src, int64_t i0, int64_t n) const = 0;
  // Rows [r0, r0 + rows) of src quantized into the same rows of dst as fp8::quantize does it
  // (rows: a whole number of blocks, or the tensor's last rows); `scale` is the tensor scale
  // decided (the request's, or current scaling's). Returns their amax (NaN when one is NaN).
  // Called from several threads at once on disjoint rows.
  virtual float quantize(const Tensor& src, int64_t r0, int64_t rows, const Fp8Request& r, float scale,
                         Tensor& dst) const = 0;
};

// The default kernel (every host dtype: fp32, fp64, bf16), bit for bit fp8::quantize.
const Fp8BandKernel& default_fp8_band_kernel();

// src quantized into dst (host tensors, as Backend::quantize_fp8 takes them) band by band by k.
Backend::Fp8Quantized quantize_in_bands(const Tensor& src, const Fp8Request& r, Tensor& dst, const Fp8BandKernel& k);

}  // namespace primus::ops
