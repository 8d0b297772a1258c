// The FP8 op of the op set (backend.h) in its default form: fp8::quantize on the host, in bands
// of rows split between the threads (fp8_bands.h), each band converted to fp32 and back in a
// thread's buffer. A device's tensors go through a host copy (the CUDA backend has its own
// kernels: kernels/cuda/fp8_quantize.cu; the CPU bf16 backend its AVX-512 band kernel).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/fp8_bands.h"

namespace primus::ops {
namespace {

// n values of t from element i0 as fp32 (exact from bf16), and back.
void load(const Tensor& t, int64_t i0, int64_t n, float* out) {
  switch (t.dtype()) {
    case DType::F32: std::memcpy(out, t.data<float>() + i0, size_t(n) * 4); break;
    case DType::F64: {
      const double* p = t.data<double>() + i0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) out[i] = float(p[i]);
      break;
    }
    case DType::BF16: {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(t.raw()) + i0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = uint32_t(p[i]) << 16;
        std::memcpy(out + i, &bits, 4);
      }
      break;
    }
    default: fail("quantize_fp8 of a {} tensor", dtype_name(t.dtype()));
  }
}

void store(const float* v, int64_t n, Tensor& t, int64_t i0) {
  switch (t.dtype()) {
    case DType::F32: std::memcpy(t.data<float>() + i0, v, size_t(n) * 4); break;
    case DType::F64: {
      double* p = t.data<double>() + i0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) p[i] = v[i];
      break;
    }
    case DType::BF16: {  // FP8 values (rescaled by powers of two) are bf16 values: exact
      uint16_t* p = reinterpret_cast<uint16_t*>(t.raw()) + i0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, v + i, 4);
        p[i] = uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);  // to nearest even (below 2^-133)
      }
      break;
    }
    default: fail("quantize_fp8 into a {} tensor", dtype_name(t.dtype()));
  }
}

// fp8::quantize through fp32 buffers of the band's size (allocated per band: a band of 128-row
// blocks over a vocabulary's columns is tens of MiB, not to be kept per thread).
class DefaultBandKernel final : public Fp8BandKernel {
 public:
  float amax(const Tensor& src, int64_t i0, int64_t n) const override {
    std::vector<float> x(static_cast<size_t>(n));
    load(src, i0, n, x.data());
    return fp8::amax(x.data(), n);
  }
  float quantize(const Tensor& src, int64_t r0, int64_t rows, const Fp8Request& r, float scale,
                 Tensor& dst) const override {
    const int64_t cols = src.size(1), n = rows * cols;
    std::vector<float> x(static_cast<size_t>(n)), q(static_cast<size_t>(n));
    load(src, r0 * cols, n, x.data());
    const float a = fp8::quantize(x.data(), rows, cols, r.format, r.granularity, r.reduce_cols, scale, q.data());
    store(q.data(), n, dst, r0 * cols);
    return a;
  }
};

}  // namespace

const Fp8BandKernel& default_fp8_band_kernel() {
  static const DefaultBandKernel k;
  return k;
}

Backend::Fp8Quantized quantize_in_bands(const Tensor& src, const Fp8Request& r, Tensor& dst, const Fp8BandKernel& k) {
  const int64_t rows = src.size(0), cols = src.size(1);
  // Bands of whole blocks (of about 16k values where a block is a row or the tensor).
  const int64_t whole = fp8::band_rows(r.granularity, r.reduce_cols);  // rows of whole blocks; 1: any number
  const int64_t band = whole == 1 ? std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)) : whole;
  const int64_t bands = (rows + band - 1) / band;
  const bool current = r.granularity == fp8::Granularity::Tensor && r.scale == 0;
  float scale = r.scale, amax = 0.0f;
  bool nan = false;
#pragma omp parallel
  {
    if (current) {  // current scaling: the tensor's amax first
#pragma omp for reduction(max : amax) reduction(|| : nan) schedule(static)
      for (int64_t b = 0; b < bands; ++b) {
        const float a = k.amax(src, b * band * cols, std::min(band, rows - b * band) * cols);
        nan = nan || std::isnan(a);
        if (!std::isnan(a)) amax = std::max(amax, a);
      }
#pragma omp single
      scale = fp8::scale_from_amax(nan ? NAN : amax, fp8::max_finite(r.format), false);
    }
#pragma omp for reduction(max : amax) reduction(|| : nan) schedule(static)
    for (int64_t b = 0; b < bands; ++b) {
      const float a = k.quantize(src, b * band, std::min(band, rows - b * band), r, scale, dst);
      nan = nan || std::isnan(a);
      if (!std::isnan(a)) amax = std::max(amax, a);
    }
  }
  return {nan ? NAN : amax, r.granularity == fp8::Granularity::Tensor ? scale : 1.0f};
}

void Backend::check_fp8_operands(const Tensor& src, const Tensor& dst) {
  PRIMUS_CHECK(src.dim() == 2 && dst.shape() == src.shape() && src.is_contiguous() && dst.is_contiguous() &&
                   src.dtype() == dst.dtype(),
               "quantize_fp8: src {} {} into dst {} {}", dtype_name(src.dtype()), src.shape_str(),
               dtype_name(dst.dtype()), dst.shape_str());
}

void Backend::check_fp8_amax_out(const Fp8AmaxOut& amax_out) {
  const Tensor& acc = amax_out.acc;
  PRIMUS_CHECK(acc.dtype() == DType::F32 && amax_out.index >= 0 && amax_out.index < acc.numel(),
               "quantize_fp8: amax accumulator {} {}, element {}", dtype_name(acc.dtype()), acc.shape_str(),
               amax_out.index);
}

Backend::Fp8Quantized Backend::deliver_amax(Fp8Quantized q, const Fp8AmaxOut& amax_out) {
  if (amax_out.acc.defined()) {
    check_fp8_amax_out(amax_out);
    const Tensor& acc = amax_out.acc;
    Tensor host = acc.device() == Device::CPU ? acc : acc.to(Device::CPU);
    float& a = host.data<float>()[amax_out.index];
    a = fp8::fold_amax(a, q.amax);
    if (acc.device() != Device::CPU) Tensor(acc).copy_from(host);
  }
  if (amax_out.acc.defined() || !amax_out.needed) q.amax = 0.0f;
  return q;
}

Backend::Fp8Quantized Backend::quantize_fp8(const Tensor& src, fp8::Format format, fp8::Granularity granularity,
                                            bool reduce_cols, float scale, Tensor& dst, const Fp8AmaxOut& amax_out) {
  check_fp8_operands(src, dst);
  const Fp8Request r{format, granularity, reduce_cols, scale};
  if (src.device() == Device::CPU && dst.device() == Device::CPU)
    return deliver_amax(quantize_in_bands(src, r, dst, default_fp8_band_kernel()), amax_out);
  const Tensor h = src.to(Device::CPU);
  Tensor out = Tensor::empty(dst.shape(), dst.dtype());
  const Fp8Quantized q = quantize_in_bands(h, r, out, default_fp8_band_kernel());
  dst.copy_from(out);
  return deliver_amax(q, amax_out);
}

}  // namespace primus::ops
