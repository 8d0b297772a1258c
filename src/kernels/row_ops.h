// The shape rules of the token-routing row ops (kernels/backend.h), in one place for the default
// implementation (row_ops.cpp) and the backends that override it; each throws naming the op.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace primus::ops {

void check_gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                       const Tensor& out);
void check_scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                            const Tensor& out);
void check_row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b);

}  // namespace primus::ops
