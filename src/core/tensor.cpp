#include "core/tensor.h"

#include "core/device.h"
#include "core/memory.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace primus {

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = device == Device::CPU ? host_alloc(bytes) : device_hooks(device).alloc(bytes);
}

Storage::~Storage() {
  if (device_ == Device::CPU)
    host_free(data_, bytes_);
  else
    device_hooks(device_).free(data_, bytes_);
}

Shape contiguous_strides(const Shape& shape) {
  Shape s(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

static int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    if (d < 0) fail("tensor shape [{}] has a negative dimension", fmt::join(shape, ", "));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

int64_t Tensor::size(int64_t d) const {
  if (d < 0) d += dim();
  PRIMUS_CHECK(d >= 0 && d < dim(), "dim {} of a {}-d tensor", d, dim());
  return shape_[d];
}

int64_t Tensor::numel() const { return shape_numel(shape_); }

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

std::string Tensor::shape_str() const { return fmt::format("[{}]", fmt::join(shape_, ", ")); }

void* Tensor::raw() const {
  PRIMUS_CHECK(storage_ != nullptr, "undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t length) const {
  if (d < 0) d += dim();
  PRIMUS_CHECK(d >= 0 && d < dim(), "slice dim {}", d);
  PRIMUS_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d], "slice [{}, +{}) of size {}",
               start, length, shape_[d]);
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = length;
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  PRIMUS_CHECK(is_contiguous(), "view of a non-contiguous tensor {}", shape_str());
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      PRIMUS_CHECK(infer < 0, "two -1 in view");
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[infer] = known ? numel() / known : 0;
  PRIMUS_CHECK(shape_numel(s) == numel(), "view {} -> [{}]", shape_str(), fmt::join(shape, ", "));
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  if (is_contiguous()) {
    if (device_ == Device::CPU)
      std::memset(raw(), 0, nbytes());
    else
      device_hooks(device_).zero(raw(), nbytes());
    return;
  }
  Tensor z = zeros(shape_, dtype_, device_);
  copy_from(z);
}

// Copies element by element over the last dimension's runs; contiguous fast path first.
void Tensor::copy_from(const Tensor& src) {
  PRIMUS_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy {} {} into {} {}", src.shape_str(),
               dtype_name(src.dtype_), shape_str(), dtype_name(dtype_));
  const size_t es = dtype_size(dtype_);
  if (device_ != Device::CPU || src.device_ != Device::CPU) {
    PRIMUS_CHECK(is_contiguous() && src.is_contiguous(), "copy between devices needs contiguous tensors");
    PRIMUS_CHECK(device_ == src.device_ || device_ == Device::CPU || src.device_ == Device::CPU,
                 "copy from a {} tensor to a {} tensor: go through the host", device_name(src.device_),
                 device_name(device_));
    const CopyKind kind = src.device_ == Device::CPU ? CopyKind::HostToDevice
                          : device_ == Device::CPU   ? CopyKind::DeviceToHost
                                                     : CopyKind::DeviceToDevice;
    if (nbytes()) device_hooks(device_ == Device::CPU ? src.device_ : device_).copy(raw(), src.raw(), nbytes(), kind);
    return;
  }
  if (is_contiguous() && src.is_contiguous()) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  const int64_t n = numel();
  if (n == 0) return;
  const int64_t nd = dim();
  std::vector<int64_t> idx(nd, 0);
  const int64_t inner = nd ? shape_[nd - 1] : 1;
  auto* dst_base = static_cast<char*>(raw());
  auto* src_base = static_cast<const char*>(src.raw());
  for (int64_t done = 0; done < n; done += inner) {
    int64_t doff = 0, soff = 0;
    for (int64_t k = 0; k + 1 < nd; ++k) {
      doff += idx[k] * strides_[k];
      soff += idx[k] * src.strides_[k];
    }
    const int64_t ds = nd ? strides_[nd - 1] : 1, ss = nd ? src.strides_[nd - 1] : 1;
    for (int64_t j = 0; j < inner; ++j)
      std::memcpy(dst_base + (doff + j * ds) * es, src_base + (soff + j * ss) * es, es);
    for (int64_t k = nd - 2; k >= 0; --k) {
      if (++idx[k] < shape_[k]) break;
      idx[k] = 0;
    }
  }
}

void copy_block(const Tensor& dst, int64_t dr, int64_t dc, const Tensor& src, int64_t sr, int64_t sc, int64_t rows,
                int64_t cols) {
  PRIMUS_CHECK(dst.dim() == 2 && src.dim() == 2 && dst.dtype() == src.dtype() && dst.device() == src.device(),
               "copy_block between {} and {}", dst.shape_str(), src.shape_str());
  PRIMUS_CHECK(dr + rows <= dst.size(0) && dc + cols <= dst.size(1) && sr + rows <= src.size(0) &&
                   sc + cols <= src.size(1),
               "copy_block of {} x {} outside {} or {}", rows, cols, dst.shape_str(), src.shape_str());
  const size_t e = dtype_size(src.dtype());
  device_copy_2d(dst.device(), static_cast<char*>(dst.raw()) + size_t(dr * dst.size(1) + dc) * e,
                 size_t(dst.size(1)) * e, static_cast<const char*>(src.raw()) + size_t(sr * src.size(1) + sc) * e,
                 size_t(src.size(1)) * e, size_t(cols) * e, size_t(rows));
}

}  // namespace primus
