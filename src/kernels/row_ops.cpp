// The token-routing row ops of the op set (backend.h) in their default form: double on the host,
// one rounding per result. A device's tensors go through a host copy: correct everywhere; the
// CUDA backend overrides the three with kernels computing the same (cuda/fused_row_ops.cu).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/host_values.h"
#include "kernels/row_ops.h"

namespace primus::ops {
namespace {

double get(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return t.data<float>()[i];
    case DType::F64: return t.data<double>()[i];
    case DType::BF16: return t.data<bf16>()[i].to_float();
    default: fail("row op on a {} tensor", dtype_name(t.dtype()));
  }
}

void put(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::F32: t.data<float>()[i] = float(v); break;
    case DType::F64: t.data<double>()[i] = v; break;
    case DType::BF16: t.data<bf16>()[i] = bf16::from_float(float(v)); break;
    default: fail("row op on a {} tensor", dtype_name(t.dtype()));
  }
}

Tensor host(const Tensor& t) { return t.device() == Device::CPU ? t : t.to(Device::CPU); }

// Writes a host result back into a device tensor (a no-op for the CPU: it was written in place).
void store(const Tensor& host_copy, Tensor& dst) {
  if (dst.device() != Device::CPU) dst.copy_from(host_copy);
}

void check_rows(const Tensor& t, const std::vector<int32_t>& rows, const char* op) {
  for (int32_t r : rows)
    PRIMUS_CHECK(r >= 0 && r < t.size(0), "{}: row {} outside [0, {})", op, r, t.size(0));
}

double scale_of(const std::vector<double>& scale, size_t i) { return scale.empty() ? 1.0 : scale[i]; }

}  // namespace

void check_gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                       const Tensor& out) {
  PRIMUS_CHECK(out.dim() == 2 && out.size(0) == int64_t(rows.size()) && out.size(1) == x.size(1) &&
                   (scale.empty() || scale.size() == rows.size()),
               "gather_rows: shapes");
  check_rows(x, rows, "gather_rows");
}

void check_scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                            const Tensor& out) {
  PRIMUS_CHECK(y.dim() == 2 && y.size(0) == int64_t(rows.size()) && out.size(1) == y.size(1) &&
                   (scale.empty() || scale.size() == rows.size()),
               "scatter_add_rows: shapes");
  check_rows(out, rows, "scatter_add_rows");
}

void check_row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) {
  PRIMUS_CHECK(b.dim() == 2 && b.size(0) == int64_t(rows.size()) && a.size(1) == b.size(1), "row_dots: shapes");
  check_rows(a, rows, "row_dots");
}

std::vector<double> host_values(const Tensor& t) {
  const Tensor h = host(t);
  std::vector<double> v(size_t(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) v[size_t(i)] = get(h, i);
  return v;
}

Tensor tensor_from_values(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
  if (device == Device::Meta) {  // a shape-only tensor holds no values (core/meta_device.h)
    Tensor t = Tensor::empty(shape, dtype, device);
    PRIMUS_CHECK(t.numel() == int64_t(values.size()), "tensor_from_values: {} values for {}", values.size(),
                 t.shape_str());
    return t;
  }
  Tensor h = Tensor::empty(shape, dtype);
  PRIMUS_CHECK(h.numel() == int64_t(values.size()), "tensor_from_values: {} values for {}", values.size(),
               h.shape_str());
  for (int64_t i = 0; i < h.numel(); ++i) put(h, i, values[size_t(i)]);
  return device == Device::CPU ? h : h.to(device);
}

void Backend::gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                          Tensor& out) {
  check_gather_rows(x, rows, scale, out);
  synchronize();
  const Tensor hx = host(x);
  Tensor ho = out.device() == Device::CPU ? out : Tensor::empty(out.shape(), out.dtype());
  const int64_t C = x.size(1);
  for (size_t i = 0; i < rows.size(); ++i) {
    const double s = scale_of(scale, i);
    for (int64_t c = 0; c < C; ++c) put(ho, int64_t(i) * C + c, s * get(hx, int64_t(rows[i]) * C + c));
  }
  store(ho, out);
}

void Backend::scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                               Tensor& out) {
  check_scatter_add_rows(y, rows, scale, out);
  synchronize();
  const Tensor hy = host(y);
  Tensor ho = host(out);
  const int64_t C = y.size(1);
  // Per destination row: out's value plus its contributions in list order, in double, rounded
  // once. The fused multiply-adds are written out (GCC contracts them anyway at x86-64-v3) so that
  // the bits do not depend on the compiler: the CUDA kernel (fused_row_ops.cu) matches them.
  std::vector<std::vector<int32_t>> by_row(size_t(out.size(0)));
  for (size_t i = 0; i < rows.size(); ++i) by_row[size_t(rows[i])].push_back(int32_t(i));
  std::vector<double> acc(static_cast<size_t>(C), 0.0);
  for (size_t r = 0; r < by_row.size(); ++r) {
    if (by_row[r].empty()) continue;
    for (int64_t c = 0; c < C; ++c) acc[size_t(c)] = get(ho, int64_t(r) * C + c);
    for (int32_t i : by_row[r]) {
      const double s = scale_of(scale, size_t(i));
      for (int64_t c = 0; c < C; ++c) acc[size_t(c)] = std::fma(s, get(hy, int64_t(i) * C + c), acc[size_t(c)]);
    }
    for (int64_t c = 0; c < C; ++c) put(ho, int64_t(r) * C + c, acc[size_t(c)]);
  }
  store(ho, out);
}

std::vector<double> Backend::row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) {
  check_row_dots(a, rows, b);
  synchronize();
  const Tensor ha = host(a), hb = host(b);
  const int64_t C = a.size(1);
  std::vector<double> out(rows.size(), 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s = std::fma(get(ha, int64_t(rows[i]) * C + c), get(hb, int64_t(i) * C + c), s);
    out[i] = s;
  }
  return out;
}

}  // namespace primus::ops
