#include "model/mla.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace primus {

std::vector<int> MlaParams::ids() const {
  std::vector<int> v;
  for (int id : {q_proj, q_down, q_norm, q_up, kv_down, kv_norm, kv_up})
    if (id >= 0) v.push_back(id);
  return v;
}

MlaParams register_mla_params(ParamStore& params, const ModelSpec& s, int64_t layer, int tp, int r) {
  const std::string pre = s.layer_prefix(layer) + "self_attention.";
  const int64_t C = s.hidden_size, H = s.num_attention_heads, qk = s.qk_head_dim + s.qk_pos_emb_head_dim;
  const int64_t kvw = s.qk_head_dim + s.v_head_dim, hl = H / tp;
  // Column-parallel rows are head-major ([head][width]): a rank's heads are one piece. Whole
  // (unsharded) with one rank, as before.
  auto heads_of = [&](int64_t width) {
    return tp > 1 ? ShardSpec{0, {{r * hl * width, hl * width}}} : ShardSpec{};
  };
  // Replicated on every tp rank, gradient covering this rank's heads only.
  auto replicated = [&](int id) {
    params.mark_tp_partial_grads(id);
    return id;
  };
  MlaParams p;
  if (s.q_lora_rank > 0) {
    p.q_down = replicated(params.add(pre + "linear_q_down_proj.weight", {s.q_lora_rank, C}, ParamInit::Normal, true));
    if (s.qk_layernorm)
      p.q_norm = replicated(params.add(pre + "q_layernorm.weight", {s.q_lora_rank}, ParamInit::Ones, false));
    p.q_up = params.add_sharded(pre + "linear_q_up_proj.weight", {H * qk, s.q_lora_rank}, heads_of(qk),
                                ParamInit::Normal, true);
  } else {
    p.q_proj = params.add_sharded(pre + "linear_q_proj.weight", {H * qk, C}, heads_of(qk), ParamInit::Normal, true);
  }
  p.kv_down = replicated(params.add(pre + "linear_kv_down_proj.weight", {s.kv_lora_rank + s.qk_pos_emb_head_dim, C},
                                    ParamInit::Normal, true));
  if (s.qk_layernorm)
    p.kv_norm = replicated(params.add(pre + "kv_layernorm.weight", {s.kv_lora_rank}, ParamInit::Ones, false));
  p.kv_up = params.add_sharded(pre + "linear_kv_up_proj.weight", {H * kvw, s.kv_lora_rank}, heads_of(kvw),
                               ParamInit::Normal, true);
  return p;
}

void mla_rope_tables(const ModelSpec& s, int64_t positions, double* cos, double* sin) {
  yarn_rope_tables(yarn_of(s).value_or(Yarn{}), s.qk_pos_emb_head_dim, s.rotary_base, positions, cos, sin);
}

Mla::Mla(ops::Backend& backend, DType activation, const ModelSpec& s, const Linears& linears, int tp, int cp,
         int cp_rank)
    : be_(backend),
      lin_(linears),
      act_(activation),
      stat_(ops::stat_dtype(activation)),
      C_(s.hidden_size),
      H_(s.num_attention_heads / tp),
      dn_(s.qk_head_dim),
      dr_(s.qk_pos_emb_head_dim),
      dv_(s.v_head_dim),
      Dq_(s.qk_head_dim + s.qk_pos_emb_head_dim),
      W_(std::max(Dq_, dv_)),
      Rq_(s.q_lora_rank),
      R_(s.kv_lora_rank),
      eps_(float(s.norm_epsilon)) {
  PRIMUS_CHECK(tp >= 1 && s.num_attention_heads % tp == 0, "MLA: {} heads over {} tensor-parallel ranks",
               s.num_attention_heads, tp);
  const double m = yarn_mscale(s.rotary_scaling_factor, s.mscale_all_dim);
  q_alpha_ = float(std::sqrt(double(W_) / double(Dq_)) * m * m);
  const int64_t P = s.max_position_embeddings, half = dr_ / 2;
  Tensor c = Tensor::empty({P, half}, DType::F64), sn = Tensor::empty({P, half}, DType::F64);
  mla_rope_tables(s, P, c.data<double>(), sn.data<double>());
  if (stat_ != DType::F64) {
    Tensor c32 = Tensor::empty({P, half}, DType::F32), s32 = Tensor::empty({P, half}, DType::F32);
    for (int64_t i = 0; i < P * half; ++i) {
      c32.data<float>()[i] = float(c.data<double>()[i]);
      s32.data<float>()[i] = float(sn.data<double>()[i]);
    }
    c = c32;
    sn = s32;
  }
  rope_ = std::make_unique<Rotary>(be_, c, sn, dr_, cp, cp_rank);
}

Tensor Mla::norm(const Tensor& x, int weight, Tensor& rstd, const Weights& w) const {
  if (weight < 0) return x;
  Tensor y = act(x.shape());
  rstd = be_.empty({x.size(0)}, stat_);
  be_.rmsnorm_forward(x, w(weight), y, rstd, eps_);
  return y;
}

Tensor Mla::forward(const MlaParams& p, MlaContext& c, const Tensor& h1, int64_t seq, int64_t pos0,
                    const Weights& w, const std::vector<int32_t>* positions) const {
  const int64_t N = h1.size(0), H = H_, W = W_;
  // Queries, scaled by q_alpha_ (rope is linear: the order does not matter).
  Tensor q = act({N, H * Dq_});
  if (p.q_proj >= 0) {
    lin_.forward(q_alpha_, h1, w(p.q_proj), p.q_proj, 0.0f, Tensor(), q, Tensor());
  } else {
    c.cq = act({N, Rq_});
    lin_.forward(1.0f, h1, w(p.q_down), p.q_down, 0.0f, Tensor(), c.cq, Tensor());
    c.cqn = norm(c.cq, p.q_norm, c.rstd_q, w);
    lin_.forward(q_alpha_, c.cqn, w(p.q_up), p.q_up, 0.0f, Tensor(), q, Tensor());
  }
  // The latent and the shared rotary key.
  Tensor ckv = act({N, R_ + dr_});
  lin_.forward(1.0f, h1, w(p.kv_down), p.kv_down, 0.0f, Tensor(), ckv, Tensor());
  c.c = act({N, R_});
  copy_block(c.c, 0, 0, ckv, 0, 0, N, R_);
  Tensor kr = act({N, dr_});
  copy_block(kr, 0, 0, ckv, 0, R_, N, dr_);
  rope_->apply(kr, 1, seq, pos0, false, positions);
  c.cn = norm(c.c, p.kv_norm, c.rstd_kv, w);
  Tensor kv = act({N, H * (dn_ + dv_)});
  lin_.forward(1.0f, c.cn, w(p.kv_up), p.kv_up, 0.0f, Tensor(), kv, Tensor());
  // Each head's rotary query part, rotated in a contiguous buffer.
  Tensor qr = act({N, H * dr_});
  for (int64_t h = 0; h < H; ++h) copy_block(qr, 0, h * dr_, q, 0, h * Dq_ + dn_, N, dr_);
  rope_->apply(qr, H, seq, pos0, false, positions);
  Tensor qkv = be_.zeros({N, 3 * H * W}, act_);
  for (int64_t h = 0; h < H; ++h) {
    copy_block(qkv, 0, h * W, q, 0, h * Dq_, N, dn_);
    copy_block(qkv, 0, h * W + dn_, qr, 0, h * dr_, N, dr_);
    copy_block(qkv, 0, (H + h) * W, kv, 0, h * (dn_ + dv_), N, dn_);
    copy_block(qkv, 0, (H + h) * W + dn_, kr, 0, 0, N, dr_);
    copy_block(qkv, 0, (2 * H + h) * W, kv, 0, h * (dn_ + dv_) + dn_, N, dv_);
  }
  return qkv;
}

Tensor Mla::values(const Tensor& out) const {
  const int64_t N = out.size(0);
  Tensor v = act({N, H_ * dv_});
  for (int64_t h = 0; h < H_; ++h) copy_block(v, 0, h * dv_, out, 0, h * W_, N, dv_);
  return v;
}

Tensor Mla::values_grad(const Tensor& dattn) const {
  const int64_t N = dattn.size(0);
  Tensor dout = be_.zeros({N, H_ * W_}, act_);
  for (int64_t h = 0; h < H_; ++h) copy_block(dout, 0, h * W_, dattn, 0, h * dv_, N, dv_);
  return dout;
}

Tensor Mla::backward_input(const MlaParams& p, MlaContext& c, const Tensor& dqkv, int64_t seq, const Weights& w,
                           const std::vector<int32_t>* positions) const {
  const int64_t N = dqkv.size(0), H = H_, W = W_;
  // Queries: the nope parts as they are, the rotary parts rotated back.
  c.dq = act({N, H * Dq_});
  Tensor dqr = act({N, H * dr_});
  for (int64_t h = 0; h < H; ++h) {
    copy_block(c.dq, 0, h * Dq_, dqkv, 0, h * W, N, dn_);
    copy_block(dqr, 0, h * dr_, dqkv, 0, h * W + dn_, N, dr_);
  }
  rope_->apply(dqr, H, seq, 0, true, positions);
  for (int64_t h = 0; h < H; ++h) copy_block(c.dq, 0, h * Dq_ + dn_, dqr, 0, h * dr_, N, dr_);
  // Keys and values: per-head k_nope and v into kv's layout; the shared rotary
  // key's gradient summed over the heads (this rank's: a partial sum under tp).
  c.dkv = act({N, H * (dn_ + dv_)});
  Tensor dkr = act({N, dr_}), part = act({N, dr_});
  for (int64_t h = 0; h < H; ++h) {
    copy_block(c.dkv, 0, h * (dn_ + dv_), dqkv, 0, (H + h) * W, N, dn_);
    copy_block(c.dkv, 0, h * (dn_ + dv_) + dn_, dqkv, 0, (2 * H + h) * W, N, dv_);
    copy_block(h == 0 ? dkr : part, 0, 0, dqkv, 0, (H + h) * W + dn_, N, dr_);
    if (h > 0) be_.add(dkr, part, dkr);
  }
  rope_->apply(dkr, 1, seq, 0, true, positions);
  Tensor dcn = act({N, R_});
  lin_.input_grad(1.0f, c.dkv, w(p.kv_up), p.kv_up, 0.0f, Tensor(), dcn);
  Tensor dc = dcn;
  if (p.kv_norm >= 0) {
    dc = act({N, R_});
    be_.rmsnorm_backward_input(dcn, c.c, w(p.kv_norm), c.rstd_kv, Tensor(), dc);
    c.gkv_norm.compute(be_, dcn, c.c, c.rstd_kv);
  }
  c.dckv = act({N, R_ + dr_});
  copy_block(c.dckv, 0, 0, dc, 0, 0, N, R_);
  copy_block(c.dckv, 0, R_, dkr, 0, 0, N, dr_);
  Tensor dh1 = act({N, C_});
  lin_.input_grad(1.0f, c.dckv, w(p.kv_down), p.kv_down, 0.0f, Tensor(), dh1);
  if (p.q_proj >= 0) {
    lin_.input_grad(q_alpha_, c.dq, w(p.q_proj), p.q_proj, 1.0f, dh1, dh1);
  } else {
    Tensor dcqn = act({N, Rq_});
    lin_.input_grad(q_alpha_, c.dq, w(p.q_up), p.q_up, 0.0f, Tensor(), dcqn);
    c.dcq = dcqn;
    if (p.q_norm >= 0) {
      c.dcq = act({N, Rq_});
      be_.rmsnorm_backward_input(dcqn, c.cq, w(p.q_norm), c.rstd_q, Tensor(), c.dcq);
      c.gq_norm.compute(be_, dcqn, c.cq, c.rstd_q);
    }
    lin_.input_grad(1.0f, c.dcq, w(p.q_down), p.q_down, 1.0f, dh1, dh1);
  }
  // W reads the projections' inputs (h1, cqn, cn) and output gradients, and the norms' gradients.
  c.cq = c.rstd_q = c.c = c.rstd_kv = Tensor();
  return dh1;
}

void Mla::backward_weight(const MlaParams& p, MlaContext& c, const Tensor& h1, const Weights& g) const {
  auto acc = [&](float alpha, const Tensor& dy, const Tensor& x, int id) {  // dW += alpha dy^T x
    Tensor gw = g(id);
    lin_.weight_grad(alpha, dy, x, id, gw);
  };
  if (p.q_proj >= 0) {
    acc(q_alpha_, c.dq, h1, p.q_proj);
  } else {
    acc(q_alpha_, c.dq, c.cqn, p.q_up);
    if (p.q_norm >= 0) c.gq_norm.add_to(be_, g(p.q_norm));
    acc(1.0f, c.dcq, h1, p.q_down);
  }
  acc(1.0f, c.dkv, c.cn, p.kv_up);
  if (p.kv_norm >= 0) c.gkv_norm.add_to(be_, g(p.kv_norm));
  acc(1.0f, c.dckv, h1, p.kv_down);
  c = MlaContext();
}

}  // namespace primus
