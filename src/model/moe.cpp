#include "model/moe.h"

#include <cmath>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"
#include "kernels/host_values.h"

namespace primus {
namespace {

// f(expert, first permuted row, rows) for every expert that has rows.
template <typename F>
void for_experts(const std::vector<int64_t>& offsets, F&& f) {
  for (size_t e = 0; e + 1 < offsets.size(); ++e)
    if (offsets[e + 1] > offsets[e]) f(int64_t(e), offsets[e], offsets[e + 1] - offsets[e]);
}

}  // namespace

std::vector<int> MoeParams::ids() const {
  std::vector<int> v = {router};
  if (router_b >= 0) v.push_back(router_b);
  for (const auto* ids : {&fc1, &fc1_b, &fc2, &fc2_b})
    for (int id : *ids)
      if (id >= 0) v.push_back(id);
  for (int id : {expert_bias, shared_fc1, shared_fc2, shared_gate})
    if (id >= 0) v.push_back(id);
  return v;
}

ops::Glu glu_of(const ModelSpec& spec) {
  return {spec.quick_geglu ? 1.702 : 1.0, spec.glu_linear_offset, spec.activation_func_clamp_value};
}

// The same names, shapes and order as model_parameter_layout (model_spec.cpp).
bool is_expert_param(const std::string& name) { return name.find(".mlp.experts.local_experts.") != std::string::npos; }

MoeParams register_moe_params(ParamStore& params, const ModelSpec& spec, int64_t layer, int ep_rank, int ep_size,
                              int etp_size, int etp_rank) {
  const std::string p = spec.layer_prefix(layer) + "mlp.";
  const int64_t C = spec.hidden_size, E = spec.num_experts, F = spec.expert_ffn();
  const int64_t Fs = spec.moe_shared_expert_intermediate_size;
  // An SwiGLU's tp shard: fc1's rows of this rank's gate then its up columns, fc2's matching columns.
  auto fc1_shard = [&](int64_t f) {
    const int64_t fl = f / etp_size;
    return etp_size > 1 ? ShardSpec{0, {{etp_rank * fl, fl}, {f + etp_rank * fl, fl}}} : ShardSpec{};
  };
  auto fc2_shard = [&](int64_t f) {
    const int64_t fl = f / etp_size;
    return etp_size > 1 ? ShardSpec{1, {{etp_rank * fl, fl}}} : ShardSpec{};
  };
  MoeParams m;
  m.layer = layer;
  m.router = params.add(p + "router.weight", {E, C}, ParamInit::Normal, true);
  if (spec.add_bias_linear) m.router_b = params.add(p + "router.bias", {E}, ParamInit::Zeros, false);
  // A buffer that the optimizer leaves alone: its gradient stays 0 and it has no weight decay.
  if (spec.moe_router_enable_expert_bias) {
    m.expert_bias = params.add(p + "router.expert_bias", {E}, ParamInit::Zeros, false);
    params.mark_buffer(m.expert_bias);
  }
  const int64_t local = E / ep_size;
  m.fc1.assign(size_t(E), -1);
  m.fc2.assign(size_t(E), -1);
  if (spec.add_bias_linear) {
    m.fc1_b.assign(size_t(E), -1);
    m.fc2_b.assign(size_t(E), -1);
  }
  for (int64_t e = ep_rank * local; e < (ep_rank + 1) * local; ++e) {
    const std::string x = p + fmt::format("experts.local_experts.{}.", e);
    m.fc1[size_t(e)] =
        params.add_sharded(x + "linear_fc1.weight", {2 * F, C}, fc1_shard(F), ParamInit::Normal, true);
    if (spec.add_bias_linear)
      m.fc1_b[size_t(e)] = params.add_sharded(x + "linear_fc1.bias", {2 * F}, fc1_shard(F), ParamInit::Zeros, false);
    m.fc2[size_t(e)] =
        params.add_sharded(x + "linear_fc2.weight", {C, F}, fc2_shard(F), ParamInit::ScaledNormal, true);
    if (spec.add_bias_linear)
      m.fc2_b[size_t(e)] = params.add(x + "linear_fc2.bias", {C}, ParamInit::Zeros, false);
  }
  if (Fs > 0) {
    m.shared_fc1 = params.add_sharded(p + "shared_experts.linear_fc1.weight", {2 * Fs, C}, fc1_shard(Fs),
                                      ParamInit::Normal, true);
    m.shared_fc2 = params.add_sharded(p + "shared_experts.linear_fc2.weight", {C, Fs}, fc2_shard(Fs),
                                      ParamInit::ScaledNormal, true);
    if (spec.moe_shared_expert_gate)
      m.shared_gate = params.add(p + "shared_experts.gate_weight", {1, C}, ParamInit::Normal, true);
  }
  return m;
}

void check_moe_supported(const ModelSpec& spec, int sp_ranks) {
  if (sp_ranks <= 1) return;
  if (spec.moe_router_load_balancing_type == "seq_aux_loss")
    fail("model {}: moe_router_load_balancing_type seq_aux_loss under sequence or context parallelism is not "
         "implemented (a sequence's tokens are on several ranks); use aux_loss, or neither",
         spec.name);
  if (spec.moe_expert_capacity_factor > 0)
    fail("model {}: moe_expert_capacity_factor under sequence or context parallelism is not implemented (dropping "
         "ranks all of an expert's tokens); leave it null (dropless), or use neither",
         spec.name);
}

void check_expert_tensor_parallel(const ModelSpec& spec, int tp, int etp) {
  if (etp != 1 && etp != tp)
    fail("expert_tensor_parallel_size {} must be 1 (experts whole on every tensor-parallel rank) or "
         "tensor_model_parallel_size ({}); other sizes are not implemented",
         etp, tp);
  if (etp > 1 && spec.add_bias_linear)
    fail("expert_tensor_parallel_size {} with add_bias_linear is not built (each expert's fc2 bias would join every "
         "tp rank's partial sum); use expert_tensor_parallel_size 1",
         etp);
  if (etp > 1 && spec.expert_ffn() % etp != 0)
    fail("expert_tensor_parallel_size {} splits each expert's ffn (moe_ffn_hidden_size {}) over the tensor-parallel "
         "ranks: not divisible",
         etp, spec.expert_ffn());
  if (etp > 1 && spec.moe_shared_expert_intermediate_size % etp != 0)
    fail("expert_tensor_parallel_size {} splits the shared expert (moe_shared_expert_intermediate_size {}) over the "
         "tensor-parallel ranks: not divisible",
         etp, spec.moe_shared_expert_intermediate_size);
}

int moe_routing_ranks(bool sequence_parallel, int tp, int etp, int cp) {
  return (sequence_parallel && etp == 1 ? tp : 1) * cp;
}

MoeLayer::MoeLayer(const ModelSpec& spec, ops::Backend& backend, DType activation, MoeParams params,
                   const Linears& linears, std::shared_ptr<const TokenDispatcher> dispatcher, TokenShare share,
                   TensorParallelRows expert_tp)
    : spec_(spec),
      be_(backend),
      lin_(linears),
      act_(activation),
      stat_(ops::stat_dtype(activation)),
      p_(std::move(params)),
      ep_(std::move(dispatcher)),
      share_(std::move(share)),
      etp_(expert_tp) {
  if (!etp_.backend) etp_.backend = &be_;
  if (spec_.moe_pad_expert_input_to_capacity)
    fail("model {}: moe_pad_expert_input_to_capacity is not implemented (dropping without padding is)", spec_.name);
  check_expert_tensor_parallel(spec_, etp_.size(), etp_.size());
}

template <typename F>
void MoeLayer::experts(Linears::Gemm kind, const std::vector<int64_t>& offsets, F&& operands) const {
  std::vector<Tensor> A, B, D;
  std::vector<int> ids;
  for_experts(offsets, [&](int64_t e, int64_t o, int64_t n) {
    auto [a, b, d, id] = operands(e, o, n);
    A.push_back(std::move(a));
    B.push_back(std::move(b));
    D.push_back(std::move(d));
    ids.push_back(id);
  });
  lin_.grouped(kind, A, B, ids, D);
}

Tensor MoeLayer::forward(MoeContext& c, const Tensor& h_local, const Tensor& residual, const Weights& w,
                         const std::vector<double>& expert_bias, int64_t batch, int64_t seq) const {
  c = MoeContext();
  c.h_local = h_local;
  c.h = etp_.gather(h_local);  // split experts under sequence parallelism: all rows on every tp rank
  const Tensor& h = c.h;
  const int64_t N = h.size(0), C = spec_.hidden_size, E = spec_.num_experts, k = spec_.moe_router_topk;
  const int64_t F = spec_.expert_ffn() / etp_.size();
  PRIMUS_CHECK(N * share_.ranks == batch * seq, "MoE block: {} rows for {} x {} over {}", N, batch, seq,
               share_.ranks);
  // Router logits in the stat dtype (fp32 for bf16 runs, as moe_router_dtype fp32).
  Tensor logits = be_.empty({N, E}, stat_);
  be_.gemm(false, true, 1.0f, h, w(p_.router), 0.0f, Tensor(), logits, p_.router_b >= 0 ? w(p_.router_b) : Tensor());
  // A backend without values (the shape-only walk) gives the router's load instead of logits.
  const std::vector<int64_t> load = be_.router_load(p_.layer, N, k, E);
  c.routing = load.empty() ? route(spec_, ops::host_values(logits), expert_bias, batch, seq, share_)
                           : route_by_load(spec_, load, batch, seq, share_);
  const Routing& r = c.routing;

  // Permute: the kept choices grouped by expert, in token order within an expert.
  c.token_offsets.assign(size_t(E + 1), 0);
  std::vector<std::vector<int64_t>> of(static_cast<size_t>(E));
  for (int64_t i = 0; i < N * k; ++i)
    if (r.kept[size_t(i)]) of[size_t(r.expert[size_t(i)])].push_back(i);
  for (int64_t e = 0; e < E; ++e) {
    c.token_offsets[size_t(e + 1)] = c.token_offsets[size_t(e)] + int64_t(of[size_t(e)].size());
    for (int64_t i : of[size_t(e)]) {
      c.rows.push_back(int32_t(i / k));
      c.slot.push_back(i);
      c.weights.push_back(r.weight[size_t(i)]);
    }
  }
  const int64_t Mt = int64_t(c.rows.size());
  // Whole experts add onto the residual; split ones give partial sums, summed over tp first.
  const bool split = etp_.size() > 1;
  if (split) check_same_routing(c);
  Tensor out = split ? be_.zeros({N, C}, act_) : residual.clone();
  Tensor xt;
  if (Mt > 0) {
    xt = empty({Mt, C});
    be_.gather_rows(h, c.rows, input_weights(c), xt);  // moe_apply_probs_on_input: weighted here
  }
  // Expert parallelism: the rows go to their experts' ranks (collective, also with no rows here).
  if (ep_) c.plan = ep_->plan(c.token_offsets);
  c.offsets = ep_ ? c.plan.expert_offsets : c.token_offsets;
  c.xp = ep_ ? ep_->dispatch(c.plan, xt, C, act_) : xt;
  const int64_t M = c.offsets.back();
  if (M > 0) {
    c.gu = empty({M, 2 * F});
    c.act = empty({M, F});
    c.yp = empty({M, C});
    // Two grouped GEMMs over the experts' row slices, one SwiGLU over all rows between.
    experts(Linears::Gemm::Forward, c.offsets, [&](int64_t e, int64_t o, int64_t n) {
      const int id = p_.fc1[size_t(e)];
      return std::tuple{c.xp.slice(0, o, n), w(id), c.gu.slice(0, o, n), id};
    });
    add_expert_biases(c.gu, c.offsets, p_.fc1_b, w);
    be_.glu_forward(c.gu, c.act, glu_);
    experts(Linears::Gemm::Forward, c.offsets, [&](int64_t e, int64_t o, int64_t n) {
      const int id = p_.fc2[size_t(e)];
      return std::tuple{c.act.slice(0, o, n), w(id), c.yp.slice(0, o, n), id};
    });
    add_expert_biases(c.yp, c.offsets, p_.fc2_b, w);
  }
  c.yt = ep_ ? ep_->combine(c.plan, c.yp, C, act_) : c.yp;
  if (Mt > 0) be_.scatter_add_rows(c.yt, c.rows, output_weights(c), out);  // unpermute, weighted
  if (p_.shared_fc1 >= 0) {
    const int64_t Fs = spec_.moe_shared_expert_intermediate_size / etp_.size();
    c.sgu = empty({N, 2 * Fs});
    lin_.forward(1.0f, h, w(p_.shared_fc1), p_.shared_fc1, 0.0f, Tensor(), c.sgu, Tensor());
    c.sact = empty({N, Fs});
    be_.glu_forward(c.sgu, c.sact, glu_);
    if (p_.shared_gate < 0) {
      lin_.forward(1.0f, c.sact, w(p_.shared_fc2), p_.shared_fc2, 1.0f, out, out, Tensor());
    } else {
      c.sout = empty({N, C});
      lin_.forward(1.0f, c.sact, w(p_.shared_fc2), p_.shared_fc2, 0.0f, Tensor(), c.sout, Tensor());
      const std::vector<int32_t> zero(size_t(N), 0);
      std::vector<double> g = be_.row_dots(w(p_.shared_gate), zero, h);  // <gate_weight, h_t>
      for (double& v : g) v = 1.0 / (1.0 + std::exp(-v));
      c.gate = g;
      std::vector<int32_t> all(static_cast<size_t>(N));
      std::iota(all.begin(), all.end(), 0);
      be_.scatter_add_rows(c.sout, all, c.gate, out);
    }
  }
  if (!split) return out;
  Tensor y = etp_.reduce(out);
  be_.add(y, residual, y);
  return y;
}

// Split experts sum the tp ranks' partial outputs row by row, so every tp rank must have made the
// same choices (it does from the same logits; a rank whose GEMM rounds otherwise would not): a
// hash of the permutation, its max and min over tp compared.
void MoeLayer::check_same_routing(const MoeContext& c) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the choices
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  for (size_t i = 0; i < c.slot.size(); ++i) mix(uint64_t(c.slot[i]));
  for (int64_t o : c.token_offsets) mix(uint64_t(o));
  const int64_t x = int64_t(h >> 1);
  std::vector<int64_t> v = {x, -x};
  etp_.group->all_reduce(v, parallel::ReduceOp::Max);
  if (v[0] != -v[1])
    fail("model {}: the tensor-parallel ranks routed a microbatch's tokens differently (their router logits "
         "differ), but split experts (expert_tensor_parallel_size {}) need the same routing on every tp rank; "
         "use expert_tensor_parallel_size 1",
         spec_.name, etp_.size());
}

Tensor MoeLayer::backward_input(MoeContext& c, const Tensor& dy_local, const Weights& w) const {
  PRIMUS_CHECK(c.h.defined(), "MoE backward_input before forward");
  const Tensor dy = etp_.gather(dy_local);
  const int64_t N = c.h.size(0), C = spec_.hidden_size, E = spec_.num_experts, k = spec_.moe_router_topk;
  const int64_t F = spec_.expert_ffn() / etp_.size(), Mt = int64_t(c.rows.size()), M = c.offsets.back();
  const bool gated = p_.shared_fc1 >= 0 && p_.shared_gate >= 0;
  std::vector<int32_t> all(static_cast<size_t>(N));
  std::iota(all.begin(), all.end(), 0);
  // d weight = <dy[row], yp> and d gate = <dy, shared out>: with split experts, over this rank's
  // part of the outputs, so summed over tp (one all-reduce of both).
  // (moe_apply_probs_on_input: the weights' part comes after the experts' backward, below.)
  const bool on_input = spec_.moe_apply_probs_on_input;
  std::vector<double> dots = Mt > 0 && !on_input ? be_.row_dots(dy, c.rows, c.yt) : std::vector<double>();
  if (gated) {
    const std::vector<double> g = be_.row_dots(dy, all, c.sout);
    dots.insert(dots.end(), g.begin(), g.end());
  }
  sum_over_expert_tp(dots);
  std::vector<double> dweight(size_t(N * k), 0.0);
  for (int64_t i = 0; i < Mt && !on_input; ++i) dweight[size_t(c.slot[size_t(i)])] = dots[size_t(i)];

  Tensor dh = be_.zeros({N, C}, act_);
  Tensor dyt;
  if (Mt > 0) {
    dyt = empty({Mt, C});  // d yp = weight * dy[row]
    be_.gather_rows(dy, c.rows, output_weights(c), dyt);
  }
  c.dy = ep_ ? ep_->dispatch(c.plan, dyt, C, act_) : dyt;
  Tensor dxp;
  if (M > 0) {
    Tensor da = empty({M, F});
    c.dgu = empty({M, 2 * F});
    dxp = empty({M, C});
    experts(Linears::Gemm::InputGrad, c.offsets, [&](int64_t e, int64_t o, int64_t n) {
      const int id = p_.fc2[size_t(e)];
      return std::tuple{c.dy.slice(0, o, n), w(id), da.slice(0, o, n), id};
    });
    be_.glu_backward(da, c.gu, c.dgu, glu_);
    experts(Linears::Gemm::InputGrad, c.offsets, [&](int64_t e, int64_t o, int64_t n) {
      const int id = p_.fc1[size_t(e)];
      return std::tuple{c.dgu.slice(0, o, n), w(id), dxp.slice(0, o, n), id};
    });
  }
  const Tensor dxt = ep_ ? ep_->combine(c.plan, dxp, C, act_) : dxp;
  if (Mt > 0) be_.scatter_add_rows(dxt, c.rows, input_weights(c), dh);
  if (on_input && Mt > 0) {  // d weight = <h[row], d(weighted input)>
    std::vector<double> d = be_.row_dots(c.h, c.rows, dxt);
    sum_over_expert_tp(d);
    for (int64_t i = 0; i < Mt; ++i) dweight[size_t(c.slot[size_t(i)])] = d[size_t(i)];
  }
  std::vector<double> dg;  // d(gate logit) per token
  if (p_.shared_fc1 >= 0) {
    const int64_t Fs = spec_.moe_shared_expert_intermediate_size / etp_.size();
    if (!gated) {
      c.dy_shared = dy;
    } else {
      c.dy_shared = empty({N, C});
      be_.gather_rows(dy, all, c.gate, c.dy_shared);
      dg.assign(dots.end() - N, dots.end());
      for (int64_t t = 0; t < N; ++t) dg[size_t(t)] *= c.gate[size_t(t)] * (1 - c.gate[size_t(t)]);
    }
    Tensor dsact = empty({N, Fs});
    lin_.input_grad(1.0f, c.dy_shared, w(p_.shared_fc2), p_.shared_fc2, 0.0f, Tensor(), dsact);
    c.dsgu = empty({N, 2 * Fs});
    be_.glu_backward(dsact, c.sgu, c.dsgu, glu_);
    lin_.input_grad(1.0f, c.dsgu, w(p_.shared_fc1), p_.shared_fc1, 1.0f, dh, dh);
  }
  // The experts' part of dh, summed over tp when they are split (this rank's rows under sequence
  // parallelism). The router's and the gate's parts are whole on every tp rank: added after, on
  // this rank's rows, as are their weight gradients (backward_weight).
  dh = etp_.reduce(dh);
  const int64_t Nl = c.h_local.size(0), first = etp_.first_local_row(Nl);
  // The router: the weights' gradient plus the load-balancing losses, through the logits.
  const std::vector<double> dl = route_backward(spec_, c.routing, dweight, c.loss_scale);
  c.dlogits = ops::tensor_from_values(std::vector<double>(dl.begin() + first * E, dl.begin() + (first + Nl) * E),
                                      {Nl, E}, act_, be_.device());
  be_.gemm(false, false, 1.0f, c.dlogits, w(p_.router), 1.0f, dh, dh, Tensor());
  if (gated) {
    c.dgate.assign(dg.begin() + first, dg.begin() + first + Nl);
    Tensor dgt = ops::tensor_from_values(c.dgate, {Nl, 1}, act_, be_.device());
    be_.gemm(false, false, 1.0f, dgt, w(p_.shared_gate), 1.0f, dh, dh, Tensor());
  }
  c.gu = c.yp = c.yt = c.sgu = c.sout = Tensor();  // B's alone: W reads the linears' inputs and output gradients
  return dh;
}

void MoeLayer::sum_over_expert_tp(std::vector<double>& v) const {
  if (etp_.size() <= 1 || v.empty()) return;
  // In a tensor on the compute device: NCCL stages only small host buffers.
  Tensor t = ops::tensor_from_values(v, {int64_t(v.size())}, DType::F64, be_.device());
  etp_.group->all_reduce(t);
  v = ops::host_values(t);
}

const std::vector<double>& MoeLayer::input_weights(const MoeContext& c) const {
  static const std::vector<double> none;
  return spec_.moe_apply_probs_on_input ? c.weights : none;
}

const std::vector<double>& MoeLayer::output_weights(const MoeContext& c) const {
  static const std::vector<double> none;
  return spec_.moe_apply_probs_on_input ? none : c.weights;
}

// rows [o, o + n) of each expert's slice += that expert's bias (ids: per expert, empty: none).
void MoeLayer::add_expert_biases(Tensor& rows, const std::vector<int64_t>& offsets, const std::vector<int>& ids,
                                 const Weights& w) const {
  if (ids.empty()) return;
  for_experts(offsets, [&](int64_t e, int64_t o, int64_t n) {
    const Tensor b = w(ids[size_t(e)]);
    Tensor spread = empty({n, b.numel()}), slice = rows.slice(0, o, n);
    be_.gather_rows(b.view({1, b.numel()}), std::vector<int32_t>(size_t(n), 0), {}, spread);
    be_.add(slice, spread, slice);
  });
}

void MoeLayer::backward_weight(MoeContext& c, const Weights& grad) const {
  PRIMUS_CHECK(c.dlogits.defined(), "MoE backward_weight before backward_input");
  auto acc = [&](const Tensor& dy, const Tensor& x, int id) {  // dW += dy^T x
    Tensor gw = grad(id);
    be_.gemm(true, false, 1.0f, dy, x, 1.0f, gw, gw, Tensor());
  };
  // dW_e += dy_e^T x_e for every expert, fc2's then fc1's, each as one grouped GEMM.
  experts(Linears::Gemm::WeightGrad, c.offsets, [&](int64_t e, int64_t o, int64_t n) {
    const int id = p_.fc2[size_t(e)];
    return std::tuple{c.dy.slice(0, o, n), c.act.slice(0, o, n), grad(id), id};
  });
  experts(Linears::Gemm::WeightGrad, c.offsets, [&](int64_t e, int64_t o, int64_t n) {
    const int id = p_.fc1[size_t(e)];
    return std::tuple{c.dgu.slice(0, o, n), c.xp.slice(0, o, n), grad(id), id};
  });
  acc(c.dlogits, c.h_local, p_.router);
  if (p_.router_b >= 0) {
    Tensor gb = grad(p_.router_b);
    be_.column_sum_accumulate(c.dlogits, gb);
  }
  // The experts' biases: each one's column sums over its rows of d(fc1 out) and d(fc2 out).
  for (const auto& [ids, dy] : {std::pair{&p_.fc1_b, &c.dgu}, std::pair{&p_.fc2_b, &c.dy}})
    if (!ids->empty())
      for_experts(c.offsets, [&](int64_t e, int64_t o, int64_t n) {
        Tensor gb = grad((*ids)[size_t(e)]);
        be_.column_sum_accumulate(dy->slice(0, o, n), gb);
      });
  if (p_.shared_fc1 >= 0) {
    Tensor g2 = grad(p_.shared_fc2), g1 = grad(p_.shared_fc1);
    lin_.weight_grad(1.0f, c.dy_shared, c.sact, p_.shared_fc2, g2);
    lin_.weight_grad(1.0f, c.dsgu, c.h, p_.shared_fc1, g1);
    if (p_.shared_gate >= 0)
      acc(ops::tensor_from_values(c.dgate, {c.h_local.size(0), 1}, act_, be_.device()), c.h_local, p_.shared_gate);
  }
  const double keep = c.loss_scale;
  c = MoeContext();
  c.loss_scale = keep;
}

MoeStats MoeLayer::stats(const MoeContext& c) {
  MoeStats s;
  s.tokens_per_expert = c.routing.kept_per_expert;
  s.dropped = c.routing.dropped;
  s.aux_loss = c.routing.aux_loss;
  s.z_loss = c.routing.z_loss;
  return s;
}

}  // namespace primus
