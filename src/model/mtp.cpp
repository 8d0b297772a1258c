// Multi-token prediction (DeepSeek-V3; Megatron-Core's MultiTokenPredictionBlock), on the rank that
// holds the head. Depth k = 0 .. D-1 (D = mtp_num_layers) predicts the token k + 2 ahead:
//
//   h_0 = decoder.final_layernorm(x)                      the main head's normed output
//   u_k = eh_proj [enorm(embed(tokens shifted by k + 1)), hnorm(h_k)]     [N, 2C] -> [N, C]
//   y_k = transformer_layer(u_k)                          a block of the last decoder layer's kind
//   h_{k+1} = final_layernorm_k(y_k)                      through the shared output layer: loss_k
//
// against the targets shifted by k + 1 (positions past the sequence's end masked; their tokens 0,
// as Megatron's roll_tensor fills them). The objective is main loss + mtp_loss_scaling_factor / D
// * sum_k loss_k, each loss the mean over its own valid targets. Rotary positions stay the rows'
// own: Megatron shifts them with the tokens, a shift the relative rotary embedding does not see
// on any row whose loss counts. The embedding is the model's input embedding (on a last pipeline
// stage without it, a replica kept equal as the tied output layer's is). Under context parallelism
// a rank's rows are two chunks of each sequence (context_parallel.h): the shifted tokens and targets
// come from the whole sequences, gathered over the cp group; everything else is row by row or the
// layer's (context-parallel) attention, and each depth's loss is the whole sequence's mean.
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "core/context_parallel_rows.h"
#include "model/llama.h"
#include "model/llama_held.h"
#include "parallel/process_group.h"

namespace primus {

std::vector<int> LlamaModel::MtpDepth::ids() const {
  std::vector<int> v = {enorm, hnorm, eh_proj};
  for (int id : layer.ids()) v.push_back(id);
  v.push_back(final_norm);
  return v;
}

// After the head, in model_parameter_layout's order (model_spec.cpp).
void LlamaModel::register_mtp() {
  if (spec_.mtp_num_layers == 0) return;
  const int64_t C = spec_.hidden_size, V = spec_.vocab_size;
  if (embedding_ >= 0) {
    mtp_embedding_ = embedding_;
  } else if (!spec_.untie_embeddings_and_output_weights) {
    mtp_embedding_ = output_;  // the tied replica
  } else {  // a last pipeline stage, untied: a replica of the input embedding of its own
    const ShardSpec shard = part_.tp_size > 1 ? ShardSpec{0, {{vocab_start_, vocab_local_}}} : ShardSpec{};
    mtp_embedding_ = params_.add_sharded("embedding.word_embeddings.weight", {V, C}, shard, ParamInit::Normal, true);
  }
  for (int64_t k = 0; k < spec_.mtp_num_layers; ++k) {
    const std::string pre = fmt::format("mtp.layers.{}.", k);
    const int64_t layer = spec_.num_layers + k;
    MtpDepth d;
    d.enorm = params_.add(pre + "enorm.weight", {C}, ParamInit::Ones, false);
    d.hnorm = params_.add(pre + "hnorm.weight", {C}, ParamInit::Ones, false);
    // Replicated over tp (Megatron splits it by output columns and gathers them): each rank's rows.
    d.eh_proj = params_.add(pre + "eh_proj.weight", {C, 2 * C}, ParamInit::Normal, true);
    linears_->declare(d.eh_proj, pre + "eh_proj.weight", layer);
    const std::string lp = spec_.layer_prefix(layer);
    d.layer.attn_norm = params_.add(lp + "input_layernorm.weight", {C}, ParamInit::Ones, false);
    d.layer.attention = attention_parts_->make(params_, layer);
    d.layer.mlp_norm = params_.add(lp + "pre_mlp_layernorm.weight", {C}, ParamInit::Ones, false);
    d.layer.feed_forward = feed_forward_parts_->make(params_, layer);
    d.final_norm = params_.add(pre + "final_layernorm.weight", {C}, ParamInit::Ones, false);
    mtp_.push_back(std::move(d));
  }
  reset_mtp_losses();
}

namespace {

// The microbatch's whole sequences, [batch][len] in position order, and where each of this rank's
// rows sits in them (core/context_parallel_rows.h). Under context parallelism every rank's tokens
// and targets are summed into place over the cp group (a small host all-reduce, as the loss sums).
struct WholeSequences {
  int64_t len = 0;
  std::vector<int32_t> tokens, targets;
  std::vector<int64_t> at;  // row -> index into tokens / targets
};

WholeSequences whole_sequences(const LlamaContext& ctx, const ModelPartition& part) {
  const int64_t B = ctx.batch, N = B * ctx.seq, cp = part.cp_size;
  WholeSequences w;
  w.len = ctx.seq * cp;
  w.at = cp_sequence_rows(B, w.len, int(cp), part.cp_rank);
  if (cp == 1) {
    w.tokens = ctx.tokens, w.targets = ctx.targets;
    return w;
  }
  std::vector<int32_t> all(size_t(2 * cp * N), 0);  // per rank: its tokens, then its targets
  std::copy(ctx.tokens.begin(), ctx.tokens.end(), all.begin() + 2 * part.cp_rank * N);
  std::copy(ctx.targets.begin(), ctx.targets.end(), all.begin() + (2 * part.cp_rank + 1) * N);
  part.cp_group->all_reduce(all);
  w.tokens.resize(size_t(B * w.len));
  w.targets.resize(size_t(B * w.len));
  for (int64_t q = 0; q < cp; ++q) {
    const std::vector<int64_t> at = cp_sequence_rows(B, w.len, int(cp), int(q));
    for (int64_t row = 0; row < N; ++row) {
      w.tokens[size_t(at[size_t(row)])] = all[size_t(2 * q * N + row)];
      w.targets[size_t(at[size_t(row)])] = all[size_t((2 * q + 1) * N + row)];
    }
  }
  return w;
}

}  // namespace

// The tokens and targets k + 1 ahead of each row, in its whole sequence.
void LlamaModel::mtp_begin(LlamaContext& ctx) const {
  if (mtp_.empty()) return;
  const int64_t N = ctx.batch * ctx.seq;
  const WholeSequences w = whole_sequences(ctx, part_);
  ctx.mtp.resize(mtp_.size());
  for (size_t k = 0; k < mtp_.size(); ++k) {
    MtpContext& c = ctx.mtp[k];
    c.shard_tokens.resize(size_t(N));
    Tensor tg = Tensor::empty({N}, DType::I32);
    int32_t* targets = tg.data<int32_t>();
    for (int64_t row = 0; row < N; ++row) {
      const int64_t at = w.at[size_t(row)], ahead = at + int64_t(k) + 1;
      const bool inside = at % w.len + int64_t(k) + 1 < w.len;
      const int32_t token = inside ? w.tokens[size_t(ahead)] : 0;
      targets[row] = inside ? w.targets[size_t(ahead)] : -1;
      c.valid += targets[row] >= 0;
      const int64_t t = token - vocab_start_;
      c.shard_tokens[size_t(row)] = t >= 0 && t < vocab_local_ ? int32_t(t) : -1;
    }
    Tensor tk = Tensor::empty({N}, DType::I32);
    std::copy(c.shard_tokens.begin(), c.shard_tokens.end(), tk.data<int32_t>());
    c.shard_tokens_dev = tk.to(be_.device());
    c.targets_dev = tg.to(be_.device());
  }
}

void LlamaModel::mtp_forward(LlamaContext& ctx) {
  if (mtp_.empty() || ctx.targets.empty()) return;
  const int64_t N = ctx.batch * ctx.seq, C = spec_.hidden_size;
  const PassShape m = ctx.pass_shape();
  Tensor h = ctx.head.normed;
  for (size_t k = 0; k < mtp_.size(); ++k) {
    const MtpDepth& d = mtp_[k];
    MtpContext& c = ctx.mtp[k];
    const Held held(*this, {mtp_embedding_, d.enorm, output_}, -1);
    c.h = h;
    Tensor e = act({N, C});
    be_.embedding_forward(c.shard_tokens_dev, w(mtp_embedding_), e);
    c.e = reduce_partial(e);  // vocabulary-parallel, as the input embedding
    const Tensor en = kit_->norm(c.e, d.enorm, c.rstd_e), hn = kit_->norm(h, d.hnorm, c.rstd_h);
    const int64_t rows = c.e.size(0);
    c.cat = act({rows, 2 * C});  // Megatron's order: the embedding's half first
    copy_block(c.cat, 0, 0, en, 0, 0, rows, C);
    copy_block(c.cat, 0, C, hn, 0, 0, rows, C);
    const Tensor y = block_forward(d.layer, c.block, kit_->linear(c.cat, d.eh_proj), m);
    c.loss = head_forward(c.head, d.final_norm, y, c.targets_dev, true, c.valid);
    mtp_loss_sums_[k] += c.loss;
    h = c.head.normed;
  }
}

// Depth by depth from the last: each head's loss gradient (scaled) plus the next depth's gradient
// of its normed output, through the layer, eh_proj and the norms; returns depth 0's gradient of h_0.
Tensor LlamaModel::mtp_backward_input(LlamaContext& ctx, double dloss) {
  if (mtp_.empty() || ctx.mtp.empty() || !ctx.mtp[0].head.lse.defined()) return Tensor();
  const int64_t C = spec_.hidden_size;
  const double scaled = dloss * spec_.mtp_loss_scaling_factor / double(spec_.mtp_num_layers);
  const PassShape m = ctx.pass_shape(dloss);
  Tensor dh;  // the gradient of depth k's normed output from depth k + 1
  for (size_t k = mtp_.size(); k-- > 0;) {
    const MtpDepth& d = mtp_[k];
    MtpContext& c = ctx.mtp[k];
    const Held held(*this, {mtp_embedding_, d.enorm, output_}, -1);
    const Tensor dy = head_backward_input(c.head, scaled, c.valid, dh);
    c.du = block_backward_input(d.layer, c.block, dy, m);
    const Tensor dcat = kit_->linear_input_grad(c.du, d.eh_proj);
    const int64_t rows = c.du.size(0);
    c.den = act({rows, C});
    c.dhn = act({rows, C});
    copy_block(c.den, 0, 0, dcat, 0, 0, rows, C);
    copy_block(c.dhn, 0, 0, dcat, 0, C, rows, C);
    c.de = act({rows, C});
    be_.rmsnorm_backward_input(c.den, c.e, w(d.enorm), c.rstd_e, Tensor(), c.de);
    dh = act({rows, C});
    be_.rmsnorm_backward_input(c.dhn, c.h, w(d.hnorm), c.rstd_h, Tensor(), dh);
  }
  return dh;
}

// The depths' weights, the shared output layer's and embedding's gradients included (the head
// reports the output layer after its own W pass; the embedding is reported here when untied).
void LlamaModel::mtp_backward_weight(LlamaContext& ctx) {
  if (mtp_.empty() || ctx.mtp.empty() || !ctx.mtp[0].du.defined()) return;
  for (size_t k = mtp_.size(); k-- > 0;) {
    const MtpDepth& d = mtp_[k];
    MtpContext& c = ctx.mtp[k];
    const Held held(*this, {mtp_embedding_, d.enorm, output_}, -1);
    head_backward_weight(c.head);
    block_backward_weight(d.layer, c.block);
    kit_->linear_weight_grad(c.du, c.cat, d.eh_proj);
    Tensor ge = g(d.enorm), gh = g(d.hnorm);
    be_.rmsnorm_backward_weight(c.den, c.e, c.rstd_e, ge);
    be_.rmsnorm_backward_weight(c.dhn, c.h, c.rstd_h, gh);
    Tensor gemb = g(mtp_embedding_);
    if (!frozen_base()) be_.embedding_backward(c.shard_tokens, gather_rows(c.de), gemb);
    const std::vector<int> ids = d.ids();
    c = MtpContext();
    weights_done(ids);
  }
  if (mtp_embedding_ != output_) weights_done({mtp_embedding_});
  ctx.mtp.clear();
}

std::vector<double> LlamaModel::mtp_losses(const LlamaContext& ctx) const {
  std::vector<double> out;
  for (const MtpContext& c : ctx.mtp) out.push_back(c.loss);
  return out;
}

}  // namespace primus
