#include "model/feed_forward_parts.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/host_values.h"
#include "model/router.h"

namespace primus {
namespace {

struct MlpContext final : PartContext {
  Tensor h, gate_up, act;  // the normed input (all rows), fc1's output, SwiGLU's
  Tensor dy, dgate_up;     // B outputs the W pass reads (dy: the output gradient, all rows)
  Tensor dy_local;         // the output gradient on this rank's rows (fc2's bias)
};

class SwiGluMlp final : public BlockPart {
 public:
  SwiGluMlp(const PartKit& kit, ParamStore& params, int64_t layer) : k_(kit) {
    const std::string pre = kit.spec.layer_prefix(layer) + "mlp.";
    const int tp = kit.part.tp_size, r = kit.part.tp_rank;
    const int64_t C = kit.spec.hidden_size, F = kit.spec.ffn_hidden_size, Fl = F / tp;
    F_ = Fl;
    const ShardSpec fc1_shard = tp > 1 ? ShardSpec{0, {{r * Fl, Fl}, {F + r * Fl, Fl}}} : ShardSpec{};
    const ShardSpec fc2_shard = tp > 1 ? ShardSpec{1, {{r * Fl, Fl}}} : ShardSpec{};
    fc1_ = params.add_sharded(pre + "linear_fc1.weight", {2 * F, C}, fc1_shard, ParamInit::Normal, true);
    if (kit.spec.add_bias_linear)
      fc1_b_ = params.add_sharded(pre + "linear_fc1.bias", {2 * F}, fc1_shard, ParamInit::Zeros, false);
    fc2_ = params.add_sharded(pre + "linear_fc2.weight", {C, F}, fc2_shard, ParamInit::ScaledNormal, true);
    if (kit.spec.add_bias_linear)  // replicated over tp, added once after the row-parallel sum
      fc2_b_ = params.add(pre + "linear_fc2.bias", {C}, ParamInit::Zeros, false);
    kit.linears.declare(fc1_, pre + "linear_fc1.weight", layer);
    kit.linears.declare(fc2_, pre + "linear_fc2.weight", layer);
  }

  std::vector<int> param_ids() const override {
    std::vector<int> v;
    for (int id : {fc1_, fc1_b_, fc2_, fc2_b_})
      if (id >= 0) v.push_back(id);
    return v;
  }
  std::unique_ptr<PartContext> new_context() const override { return std::make_unique<MlpContext>(); }

  Tensor forward(PartContext& pc, const Tensor& h, const Tensor& residual, const PassShape&,
                 bool want_output) override {
    MlpContext& c = static_cast<MlpContext&>(pc);
    if (!c.h.defined()) c.h = k_.tp.gather(h);
    if (!c.gate_up.defined()) c.gate_up = k_.linear(c.h, fc1_, fc1_b_);
    if (!c.act.defined()) c.act = swiglu(c.gate_up);
    return want_output ? k_.row_parallel_residual(c.act, fc2_, residual, fc2_b_) : Tensor();  // y = x2 + act W2^T
  }

  void drop(PartContext& pc, Recompute r) const override {
    MlpContext& c = static_cast<MlpContext&>(pc);
    if (r == Recompute::Full)
      c = MlpContext();
    else if (r == Recompute::Selective)  // keep fc1's output
      c.h = c.act = Tensor();
  }

  Tensor backward_input(PartContext& pc, const Tensor& dy, const PassShape&) override {
    MlpContext& c = static_cast<MlpContext&>(pc);
    c.dy = k_.tp.gather(dy);
    if (fc2_b_ >= 0) c.dy_local = dy;
    const Tensor da = k_.linear_input_grad(c.dy, fc2_);
    c.dgate_up = k_.empty({da.size(0), 2 * F_});
    k_.be.glu_backward(da, c.gate_up, c.dgate_up, glu_);
    Tensor dh = k_.linear_input_grad(c.dgate_up, fc1_);
    c.gate_up = Tensor();  // W reads h, act, dy and dgate_up
    return k_.tp.reduce(dh);
  }

  void backward_weight(PartContext& pc) override {
    MlpContext& c = static_cast<MlpContext&>(pc);
    k_.linear_weight_grad(c.dy, c.act, fc2_);
    if (fc2_b_ >= 0) k_.bias_grad(c.dy_local, fc2_b_);
    k_.linear_weight_grad(c.dgate_up, c.h, fc1_);
    if (fc1_b_ >= 0) k_.bias_grad(c.dgate_up, fc1_b_);  // this rank's columns, every row
    c = MlpContext();
  }

  Tensor decode(Tensor&, const Tensor& h, const Tensor& residual, int64_t) const override {
    return k_.row_parallel_residual(swiglu(k_.linear(h, fc1_, fc1_b_)), fc2_, residual, fc2_b_);
  }

 private:
  Tensor swiglu(const Tensor& gate_up) const {
    Tensor a = k_.empty({gate_up.size(0), F_});
    k_.be.glu_forward(gate_up, a, glu_);
    return a;
  }

  const PartKit& k_;
  int64_t F_ = 0;  // this rank's ffn columns
  int fc1_ = -1, fc2_ = -1, fc1_b_ = -1, fc2_b_ = -1;
  ops::Glu glu_ = glu_of(k_.spec);
};

struct MoePartContext final : PartContext {
  MoeContext moe;
  bool routed = false;  // the forward ran (recompute leaves it)
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Mixture of experts

MoeFeedForward::MoeFeedForward(const PartKit& kit, ParamStore& params, int64_t layer,
                               std::shared_ptr<const TokenDispatcher> dispatcher, const TokenShare& share,
                               const TensorParallelRows& expert_tp)
    : k_(kit),
      layer_(kit.spec, kit.be, kit.act,
             register_moe_params(params, kit.spec, layer, kit.part.ep_rank, kit.part.ep_size, expert_tp.size(),
                                 expert_tp.rank()),
             kit.linears, std::move(dispatcher), share, expert_tp),
      stats_{layer, std::vector<int64_t>(size_t(kit.spec.num_experts), 0)} {
  weights_ = [this](int id) { return k_.params.weight(id); };
  grads_ = [this](int id) { return k_.params.grad(id); };
  // The experts' and the shared expert's linears (the router and the shared gate stay in high
  // precision, as in Transformer Engine).
  const MoeParams& p = layer_.params();
  std::vector<int> linears;
  for (const auto* ids : {&p.fc1, &p.fc2})
    for (int id : *ids)
      if (id >= 0) linears.push_back(id);
  for (int id : {p.shared_fc1, p.shared_fc2})
    if (id >= 0) linears.push_back(id);
  for (int id : linears) kit.linears.declare(id, params.infos()[size_t(id)].name, layer);
}

std::unique_ptr<PartContext> MoeFeedForward::new_context() const { return std::make_unique<MoePartContext>(); }

std::vector<double> MoeFeedForward::expert_bias() const {
  const int id = layer_.params().expert_bias;
  if (id < 0) return {};
  return ops::host_values(k_.params.master(id));
}

Tensor MoeFeedForward::forward(PartContext& pc, const Tensor& h, const Tensor& residual, const PassShape& m,
                               bool want_output) {
  MoePartContext& c = static_cast<MoePartContext&>(pc);
  if (c.routed) {
    PRIMUS_CHECK(!want_output, "an MoE block's forward runs once per microbatch");
    return Tensor();
  }
  // seq is this rank's share of each sequence under context parallelism: the router counts the
  // whole sequences (its token share spans the cp ranks).
  Tensor y = layer_.forward(c.moe, h, residual, weights_, expert_bias(), m.batch, m.seq * k_.part.cp_size);
  c.routed = true;
  const MoeStats s = MoeLayer::stats(c.moe);
  for (size_t e = 0; e < s.tokens_per_expert.size(); ++e) stats_.tokens_per_expert[e] += s.tokens_per_expert[e];
  stats_.dropped += s.dropped;
  stats_.aux_loss += s.aux_loss;
  stats_.z_loss += s.z_loss;
  ++stats_.forwards;
  return y;
}

Tensor MoeFeedForward::backward_input(PartContext& pc, const Tensor& dy, const PassShape& m) {
  MoePartContext& c = static_cast<MoePartContext&>(pc);
  c.moe.loss_scale = m.dloss;  // the router losses' share
  return layer_.backward_input(c.moe, dy, weights_);
}

void MoeFeedForward::backward_weight(PartContext& pc) {
  MoePartContext& c = static_cast<MoePartContext&>(pc);
  layer_.backward_weight(c.moe, grads_);
  c = MoePartContext();
}

// The new rows routed by themselves (a capacity factor applies to them alone).
Tensor MoeFeedForward::decode(Tensor&, const Tensor& h, const Tensor& residual, int64_t) const {
  MoeContext mc;
  return layer_.forward(mc, h, residual, weights_, expert_bias(), 1, h.size(0));
}

void MoeFeedForward::reset_stats() {
  std::fill(stats_.tokens_per_expert.begin(), stats_.tokens_per_expert.end(), 0);
  stats_.dropped = stats_.forwards = 0;
  stats_.aux_loss = stats_.z_loss = 0;
}

void MoeFeedForward::update_expert_bias(const std::vector<int64_t>& tokens) {
  const int id = layer_.params().expert_bias;
  if (id < 0) return;
  std::vector<double> bias = expert_bias();
  primus::update_expert_bias(bias, tokens, k_.spec.moe_router_bias_update_rate,
                            k_.spec.moe_router_bias_update_centered);
  Tensor dst = k_.params.master(id);
  dst.copy_from(ops::tensor_from_values(bias, {dst.numel()}, dst.dtype(), dst.device()));
}

// ---------------------------------------------------------------------------------------------
// The builder

FeedForwardParts::FeedForwardParts(const PartKit& kit) : kit_(kit), expert_tp_{&kit.be} {
  const ModelSpec& s = kit.spec;
  const ModelPartition& p = kit.part;
  if (!s.is_moe()) return;
  check_expert_tensor_parallel(s, p.tp_size, p.etp_size);
  if (p.etp_size > 1) expert_tp_ = kit.tp;
  if (p.ep_size > 1) {
    if (!p.ep_group || p.ep_group->size() != p.ep_size)
      fail("expert_model_parallel_size {} needs an ep group of that size", p.ep_size);
    dispatcher_ = std::make_shared<TokenDispatcher>(*p.ep_group, kit.be, s.num_experts,
                                                    parse_token_dispatch(s.moe_token_dispatcher_type));
  }
  // The routers' token share. With whole experts (etp 1) under sequence parallelism each tp rank
  // routes its own rows; under context parallelism each cp rank its own chunks of the sequences:
  // the routing counts are summed over both. Without sequence parallelism, or with the experts
  // split over tp (whose MoE blocks gather the rows first), every tp rank routes all rows alike.
  const bool sp_share = p.sequence_parallel && p.etp_size == 1;
  const bool cp_share = p.cp_size > 1 && p.cp_group;
  if (sp_share || cp_share) {
    const int sp = sp_share ? p.tp_size : 1;
    share_.ranks = moe_routing_ranks(p.sequence_parallel, p.tp_size, p.etp_size, cp_share ? p.cp_size : 1);
    share_.rank = (cp_share ? p.cp_group->rank() : 0) * sp + (sp_share ? p.tp_rank : 0);
    share_.sum = [tp = sp_share ? p.tp_group : nullptr, cp = cp_share ? p.cp_group : nullptr](std::vector<int64_t>& v) {
      if (tp) tp->all_reduce(v);
      if (cp) cp->all_reduce(v);
    };
  }
  check_moe_supported(s, share_.ranks);
}

FeedForwardParts::~FeedForwardParts() = default;

std::unique_ptr<BlockPart> FeedForwardParts::make(ParamStore& params, int64_t layer) {
  if (!kit_.spec.is_moe_layer(layer)) return std::make_unique<SwiGluMlp>(kit_, params, layer);
  auto part = std::make_unique<MoeFeedForward>(kit_, params, layer, dispatcher_, share_, expert_tp_);
  moe_.push_back(part.get());
  return part;
}

}  // namespace primus
