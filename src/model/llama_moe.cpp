// LlamaModel's side of the mixture of experts (the block itself is model/moe.h): running an MoE
// block in place of the MLP, its statistics, and the expert-bias balancing step.
#include <algorithm>

#include "kernels/host_values.h"
#include "model/llama.h"
#include "model/router.h"

namespace primus {

std::vector<double> LlamaModel::expert_bias_of(const MoeLayer& m) const {
  const int id = m.params().expert_bias;
  if (id < 0) return {};
  return ops::host_values(source().buffer(id));  // the master, not a bf16 copy
}

Tensor LlamaModel::moe_forward(const Block& b, BlockContext& c, int64_t batch, int64_t seq) {
  const MoeLayer& m = moe_[size_t(b.moe)];
  c.moe = std::make_shared<MoeContext>();
  // seq is this rank's share of each sequence under context parallelism: the router counts the
  // whole sequences (its token share spans the cp ranks).
  Tensor y = m.forward(*c.moe, c.h2, c.x2, [&](int id) { return w(id); }, expert_bias_of(m), batch,
                       seq * part_.cp_size);
  const MoeStats s = MoeLayer::stats(*c.moe);
  MoeLayerStats& acc = moe_stats_[size_t(b.moe)];
  for (size_t e = 0; e < s.tokens_per_expert.size(); ++e) acc.tokens_per_expert[e] += s.tokens_per_expert[e];
  acc.dropped += s.dropped;
  acc.aux_loss += s.aux_loss;
  acc.z_loss += s.z_loss;
  ++acc.forwards;
  return y;
}

void LlamaModel::reset_moe_stats() {
  for (auto& s : moe_stats_) {
    std::fill(s.tokens_per_expert.begin(), s.tokens_per_expert.end(), 0);
    s.dropped = s.forwards = 0;
    s.aux_loss = s.z_loss = 0;
  }
}

void LlamaModel::update_expert_biases(const std::vector<std::vector<int64_t>>& tokens) {
  PRIMUS_CHECK(tokens.size() == moe_.size(), "expert counts for {} of {} MoE blocks", tokens.size(), moe_.size());
  for (size_t i = 0; i < moe_.size(); ++i) {
    const int id = moe_[i].params().expert_bias;
    if (id < 0) continue;
    std::vector<double> bias = expert_bias_of(moe_[i]);
    update_expert_bias(bias, tokens[i], spec_.moe_router_bias_update_rate);
    Tensor dst = source().buffer(id);
    dst.copy_from(ops::tensor_from_values(bias, {dst.numel()}, dst.dtype(), dst.device()));
  }
  if (opt_.resident_weights) sync_working_weights();  // (a weight source keeps its buffers in fp32 only)
}

}  // namespace primus
