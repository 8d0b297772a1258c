// Small tensors between the device and host doubles (router logits and their gradients, tests).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace primus::ops {

// Every element of `t` (f32, f64 or bf16, any device) as a double, in row-major order.
std::vector<double> host_values(const Tensor& t);
// A tensor of `dtype` on `device` holding `values` (rounded once to dtype; on the shape-only
// device, none).
Tensor tensor_from_values(const std::vector<double>& values, const Shape& shape, DType dtype, Device device);

}  // namespace primus::ops
