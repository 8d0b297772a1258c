// The FP8 op of the op set (backend.h) in its default form: fp8::quantize on host fp32 values.
// bf16 and fp64 tensors are converted to fp32 first (exact for bf16); a device's tensors go
// through a host copy.
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"

namespace primus::ops {
namespace {

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.device() == Device::CPU ? t : t.to(Device::CPU);
  const int64_t n = h.numel();
  std::vector<float> v(static_cast<size_t>(n));
  switch (h.dtype()) {
    case DType::F32: std::copy(h.data<float>(), h.data<float>() + n, v.begin()); break;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(h.data<double>()[i]);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = h.data<bf16>()[i].to_float();
      break;
    default: fail("quantize_fp8 of a {} tensor", dtype_name(h.dtype()));
  }
  return v;
}

void put_floats(const std::vector<float>& v, Tensor& dst) {
  Tensor h = dst.device() == Device::CPU ? dst : Tensor::empty(dst.shape(), dst.dtype());
  const int64_t n = h.numel();
  switch (h.dtype()) {
    case DType::F32: std::copy(v.begin(), v.end(), h.data<float>()); break;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) h.data<double>()[i] = v[size_t(i)];
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) h.data<bf16>()[i] = bf16::from_float(v[size_t(i)]);  // exact
      break;
    default: fail("quantize_fp8 into a {} tensor", dtype_name(h.dtype()));
  }
  if (dst.device() != Device::CPU) dst.copy_from(h);
}

}  // namespace

Backend::Fp8Quantized Backend::quantize_fp8(const Tensor& src, fp8::Format format, fp8::Granularity granularity,
                                            bool reduce_cols, float scale, Tensor& dst) {
  PRIMUS_CHECK(src.dim() == 2 && dst.shape() == src.shape() && src.is_contiguous() && dst.is_contiguous(),
               "quantize_fp8: src {} into dst {}", src.shape_str(), dst.shape_str());
  const std::vector<float> x = host_floats(src);
  std::vector<float> q(x.size());
  Fp8Quantized r;
  if (granularity == fp8::Granularity::Tensor && scale == 0) {  // current scaling
    r.amax = fp8::amax(x.data(), int64_t(x.size()));
    scale = fp8::scale_from_amax(r.amax, fp8::max_finite(format), false);
  }
  r.amax = fp8::quantize(x.data(), src.size(0), src.size(1), format, granularity, reduce_cols, scale, q.data());
  r.scale = granularity == fp8::Granularity::Tensor ? scale : 1.0f;
  put_floats(q, dst);
  return r;
}

}  // namespace primus::ops
