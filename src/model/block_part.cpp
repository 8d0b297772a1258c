#include "model/block_part.h"

namespace primus {

Tensor PartKit::linear(const Tensor& x, int weight, int bias) const {
  const Tensor W = params.weight(weight);
  Tensor y = empty({x.size(0), W.size(0)});
  linears.forward(1.0f, x, W, weight, 0.0f, Tensor(), y, bias >= 0 ? params.weight(bias) : Tensor());
  return y;
}

// With one rank the GEMM adds onto the residual; with tp ranks the partial products are summed
// (or, under sequence parallelism, reduce-scattered) first.
Tensor PartKit::row_parallel_residual(const Tensor& in, int weight, const Tensor& residual, int bias) const {
  const Tensor W = params.weight(weight);
  const int64_t N = in.size(0), C = W.size(0);
  if (tp.size() == 1) {
    Tensor y = empty({N, C});
    linears.forward(1.0f, in, W, weight, 1.0f, residual, y, bias >= 0 ? params.weight(bias) : Tensor());
    return y;
  }
  Tensor partial = empty({N, C});
  linears.forward(1.0f, in, W, weight, 0.0f, Tensor(), partial,
                  bias >= 0 && tp.rank() == 0 ? params.weight(bias) : Tensor());
  Tensor y = tp.reduce(partial);
  be.add(y, residual, y);
  return y;
}

void PartKit::bias_grad(const Tensor& dy, int bias) const {
  Tensor g = params.grad(bias);
  be.column_sum_accumulate(dy, g);
}

Tensor PartKit::linear_input_grad(const Tensor& dy, int weight) const {
  const Tensor W = params.weight(weight);
  Tensor dx = empty({dy.size(0), W.size(1)});
  linears.input_grad(1.0f, dy, W, weight, 0.0f, Tensor(), dx);
  return dx;
}

void PartKit::linear_weight_grad(const Tensor& dy, const Tensor& x, int weight) const {
  Tensor gw = params.grad(weight);
  linears.weight_grad(1.0f, dy, x, weight, gw);
}

Tensor PartKit::norm(const Tensor& x, int weight, Tensor& rstd) const {
  Tensor h = empty(x.shape());
  rstd = stat_empty({x.size(0)});
  be.rmsnorm_forward(x, params.weight(weight), h, rstd, float(spec.norm_epsilon));
  return h;
}

}  // namespace primus
