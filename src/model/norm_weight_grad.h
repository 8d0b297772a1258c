// An RMSNorm weight's gradient of one microbatch, computed by the B pass and added to the
// weight's gradient by the W pass, so that between the two a microbatch keeps a [C] vector instead
// of the norm's input, its statistics and its output gradient (which only the weight gradient
// would read). The zero-bubble schedules hold a microbatch from its B to its W; the paper's
// M_W counts only the linears' inputs and output gradients (docs/pipeline_schedules.md).
//
// Bit-identical to accumulating in W: every backend's rmsnorm_backward_weight adds its complete
// column sums to dw once (dw += sum), so summing into zeros and adding that to the gradient later
// rounds the same way.
#pragma once

#include "core/tensor.h"
#include "kernels/backend.h"

namespace primus {

class NormWeightGrad {
 public:
  // B: the gradient of the norm y = rmsnorm(x) * w from dy (its output's gradient), x and rstd
  // (in rstd's dtype, which is the gradient's).
  void compute(ops::Backend& be, const Tensor& dy, const Tensor& x, const Tensor& rstd) {
    g_ = be.zeros({x.size(1)}, rstd.dtype());
    be.rmsnorm_backward_weight(dy, x, rstd, g_);
  }
  bool defined() const { return g_.defined(); }
  // W: grad += the gradient; holds nothing after.
  void add_to(ops::Backend& be, Tensor grad) {
    Tensor g = grad.view({g_.numel()});
    be.add(g, g_, g);
    g_ = Tensor();
  }

 private:
  Tensor g_;
};

}  // namespace primus
