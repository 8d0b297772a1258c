#include "model/qk_norm.h"

namespace primus {

QkNorm::QkNorm(ops::Backend& backend, DType activation, int64_t heads, int64_t groups, int64_t head_dim, float eps)
    : be_(backend),
      act_(activation),
      stat_(ops::stat_dtype(activation)),
      heads_(heads),
      groups_(groups),
      D_(head_dim),
      eps_(eps) {}

void QkNorm::forward(Tensor& qkv, const Tensor& wq, const Tensor& wk, QkNormContext& c) const {
  const int64_t N = qkv.size(0);
  // One pass per block: q heads at column 0, k groups after them.
  auto norm = [&](int64_t col, int64_t n_heads, const Tensor& w, Tensor& x, Tensor& rstd) {
    x = be_.empty({N, n_heads * D_}, act_);
    copy_block(x, 0, 0, qkv, 0, col, N, n_heads * D_);
    x = x.view({N * n_heads, D_});
    rstd = be_.empty({N * n_heads}, stat_);
    Tensor y = be_.empty({N * n_heads, D_}, act_);
    be_.rmsnorm_forward(x, w, y, rstd, eps_);
    copy_block(qkv, 0, col, y.view({N, n_heads * D_}), 0, 0, N, n_heads * D_);
  };
  norm(0, heads_, wq, c.q, c.rstd_q);
  norm(heads_ * D_, groups_, wk, c.k, c.rstd_k);
}

void QkNorm::backward_input(Tensor& dqkv, const Tensor& wq, const Tensor& wk, QkNormContext& c, bool learned) const {
  const int64_t N = dqkv.size(0);
  auto back = [&](int64_t col, int64_t n_heads, const Tensor& w, const Tensor& x, const Tensor& rstd,
                  NormWeightGrad& g) {
    Tensor dy = be_.empty({N, n_heads * D_}, act_);
    copy_block(dy, 0, 0, dqkv, 0, col, N, n_heads * D_);
    dy = dy.view({N * n_heads, D_});
    Tensor dx = be_.empty({N * n_heads, D_}, act_);
    be_.rmsnorm_backward_input(dy, x, w, rstd, Tensor(), dx);
    copy_block(dqkv, 0, col, dx.view({N, n_heads * D_}), 0, 0, N, n_heads * D_);
    if (learned) g.compute(be_, dy, x, rstd);
  };
  back(0, heads_, wq, c.q, c.rstd_q, c.gq);
  back(heads_ * D_, groups_, wk, c.k, c.rstd_k, c.gk);
  c.q = c.k = c.rstd_q = c.rstd_k = Tensor();
}

void QkNorm::backward_weight(QkNormContext& c, Tensor& gq, Tensor& gk) const {
  c.gq.add_to(be_, gq);
  c.gk.add_to(be_, gk);
}

}  // namespace primus
