// Tensor: a shape, strides and a dtype over shared, 64-byte aligned storage. No autograd: the
// model's layers own their backward passes. Views (slice, reshape of contiguous data) share
// storage; clone() copies.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace primus {

using Shape = std::vector<int64_t>;

// One allocation; freed when the last Tensor that views it goes away.
class Storage {
 public:
  static constexpr size_t kAlignment = 64;
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::CPU;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const;
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  std::string shape_str() const;

  void* raw() const;
  template <typename T> T* data() const {
    PRIMUS_CHECK(dtype_ == dtype_of<T>::value, "tensor is {}, not the requested type",
                 dtype_name(dtype_));
    return static_cast<T*>(raw());
  }

  // Views sharing storage.
  Tensor slice(int64_t dim, int64_t start, int64_t length) const;  // narrow along one dim
  Tensor view(const Shape& shape) const;                           // contiguous only; one -1 allowed
  Tensor flatten() const { return view({numel()}); }

  Tensor clone() const;  // contiguous deep copy
  Tensor to(Device device) const;  // contiguous copy on `device`
  void zero_();
  // Same shape and dtype; any strides on the host, contiguous when either side is a device.
  void copy_from(const Tensor& src);

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_, strides_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

Shape contiguous_strides(const Shape& shape);

// dst[dr + i, dc .. dc + cols) = src[sr + i, sc .. sc + cols) for i < rows: 2-D row-major tensors
// of one dtype on one device (a column block, or a block of rows); one strided device copy.
void copy_block(const Tensor& dst, int64_t dr, int64_t dc, const Tensor& src, int64_t sr, int64_t sc, int64_t rows,
                int64_t cols);

}  // namespace primus
