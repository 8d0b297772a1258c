// The op set's dropout in its default form (kernels/backend.h): on the host, the mask of
// kernels/dropout_mask.h. The CPU backends use it as it is; a device's tensors go through a host
// copy (the CUDA backend overrides it with cuda/fused_elementwise.cu's kernel).
#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/dropout_mask.h"

namespace primus::ops {
namespace {

template <class T, class Scale>
void apply(const T* x, T* y, int64_t n, const DropoutMask& m, Scale scale) {
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = m.keeps(uint64_t(i)) ? T(Scale(x[i]) * scale) : T(0);
}

void apply_bf16(const bf16* x, bf16* y, int64_t n, const DropoutMask& m) {
  const float scale = float(m.scale);
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = bf16::from_float(m.keeps(uint64_t(i)) ? x[i].to_float() * scale : 0.0f);
}

}  // namespace

void Backend::dropout(const Tensor& x, Tensor& y, double p, uint64_t seed) {
  PRIMUS_CHECK(p >= 0.0 && p < 1.0, "dropout: p {} outside [0, 1)", p);
  PRIMUS_CHECK(x.dtype() == y.dtype() && x.numel() == y.numel(), "dropout of {} {} into {} {}",
               dtype_name(x.dtype()), x.shape_str(), dtype_name(y.dtype()), y.shape_str());
  const DropoutMask m(p, seed);
  synchronize();
  const Tensor hx = x.device() == Device::CPU ? x : x.to(Device::CPU);
  Tensor hy = y.device() == Device::CPU ? y : Tensor::empty(y.shape(), y.dtype());
  const int64_t n = x.numel();
  switch (x.dtype()) {
    case DType::F32: apply(hx.data<float>(), hy.data<float>(), n, m, float(m.scale)); break;
    case DType::F64: apply(hx.data<double>(), hy.data<double>(), n, m, m.scale); break;
    case DType::BF16: apply_bf16(hx.data<bf16>(), hy.data<bf16>(), n, m); break;
    default: fail("dropout of a {} tensor", dtype_name(x.dtype()));
  }
  if (y.device() != Device::CPU) y.copy_from(hy);
}

}  // namespace primus::ops
