#include "model/llama_mixed.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "model/rope.h"

namespace primus {

std::vector<int> MixedLlamaModel::Layer::ids() const {
  std::vector<int> v = {attn_norm, qkv_w, proj_w, mlp_norm, fc1_w, fc2_w};
  if (qkv_b >= 0) v.push_back(qkv_b);
  return v;
}

// Registration mirrors LlamaModel<float> with one rank and one chunk, tensor for tensor, so the
// two share checkpoints and, from the same seed, initial weights.
MixedLlamaModel::MixedLlamaModel(const ModelSpec& spec, ops::Backend& backend, MixedLlamaOptions options)
    : spec_(spec), be_(backend), opt_(options) {
  spec_.validate();
  if (opt_.vocab_chunk <= 0) fail("vocab_chunk must be positive, got {}", opt_.vocab_chunk);
  const int64_t C = spec_.hidden_size, V = spec_.vocab_size, F = spec_.ffn_hidden_size, Q = spec_.qkv_size();
  embedding_ = params_.add("embedding.word_embeddings.weight", {V, C}, ParamInit::Normal, true);
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    const std::string pre = fmt::format("decoder.layers.{}.", l);
    Layer y;
    y.attn_norm = params_.add(pre + "input_layernorm.weight", {C}, ParamInit::Ones, false);
    y.qkv_w = params_.add(pre + "self_attention.linear_qkv.weight", {Q, C}, ParamInit::Normal, true);
    if (spec_.add_qkv_bias) y.qkv_b = params_.add(pre + "self_attention.linear_qkv.bias", {Q}, ParamInit::Zeros, false);
    y.proj_w = params_.add(pre + "self_attention.linear_proj.weight", {C, spec_.q_size()}, ParamInit::ScaledNormal, true);
    y.mlp_norm = params_.add(pre + "pre_mlp_layernorm.weight", {C}, ParamInit::Ones, false);
    y.fc1_w = params_.add(pre + "mlp.linear_fc1.weight", {2 * F, C}, ParamInit::Normal, true);
    y.fc2_w = params_.add(pre + "mlp.linear_fc2.weight", {C, F}, ParamInit::ScaledNormal, true);
    layers_.push_back(y);
  }
  final_norm_ = params_.add("decoder.final_layernorm.weight", {C}, ParamInit::Ones, false);
  output_ = spec_.untie_embeddings_and_output_weights
                ? params_.add("output_layer.weight", {V, C}, ParamInit::Normal, true)
                : embedding_;
  params_.allocate(be_.device());
  work_ = be_.zeros({params_.numel()}, DType::BF16);

  const int64_t half = spec_.head_dim() / 2, P = spec_.max_position_embeddings;
  Tensor cos = Tensor::empty({P, half}), sin = Tensor::empty({P, half});
  rope_tables_of(spec_, P, cos.data<float>(), sin.data<float>());
  rope_cos_ = cos.to(be_.device());
  rope_sin_ = sin.to(be_.device());
}

void MixedLlamaModel::init_weights(uint64_t seed) {
  params_.init(seed, spec_.init_method_std, spec_.scaled_init_std());
  sync_working_weights();
}

void MixedLlamaModel::sync_working_weights() { be_.cast(params_.values(), work_); }

Tensor MixedLlamaModel::w(int id) const {
  const StoredParam& p = params_.infos()[id];
  return work_.slice(0, p.offset, p.numel).view(p.shape);
}

Tensor MixedLlamaModel::g(int id) const { return params_.grad_tensor(id); }

ops::AttentionShape MixedLlamaModel::attention_shape(int64_t batch, int64_t seq) const {
  return {batch, seq, spec_.num_attention_heads, spec_.query_groups(), spec_.head_dim()};
}

bool MixedLlamaModel::head_stores_logits(int64_t rows) const {
  return size_t(rows) * size_t(spec_.vocab_size) * 6 <= opt_.logits_memory_budget;
}

// ---------------------------------------------------------------------------------------------
// Transformer block. N rows (batch * seq) of C; the steps and the saved tensors are LlamaModel's.

void MixedLlamaModel::block_rebuild(const Layer& l, MixedBlockContext& c, int64_t batch, int64_t seq) {
  const int64_t N = batch * seq, C = spec_.hidden_size, F = spec_.ffn_hidden_size, Q = spec_.qkv_size(),
                QS = spec_.q_size(), H = spec_.num_attention_heads, G = spec_.query_groups();
  const float eps = float(spec_.norm_epsilon);
  if (!c.h1.defined()) {
    c.h1 = act({N, C});
    c.rstd1 = stat({N});
    be_.rmsnorm_forward(c.x, w(l.attn_norm), c.h1, c.rstd1, eps);
  }
  if (!c.qkv.defined()) {
    c.qkv = act({N, Q});
    be_.gemm(false, true, 1.0f, c.h1, w(l.qkv_w), 0.0f, Tensor(), c.qkv, l.qkv_b >= 0 ? w(l.qkv_b) : Tensor());
    // q heads and k groups are adjacent in the row: rotate them in one sweep.
    be_.rope_apply(c.qkv, H + G, spec_.head_dim(), seq, rope_cos_, rope_sin_, false);
  }
  if (!c.attn.defined()) {
    c.attn = act({N, QS});
    c.lse = stat({batch, H, seq});
    be_.attention_forward(c.qkv, c.attn, c.lse, attention_shape(batch, seq));
  }
  if (!c.x2.defined()) {  // x2 = x + attn Wo^T
    c.x2 = act({N, C});
    be_.gemm(false, true, 1.0f, c.attn, w(l.proj_w), 1.0f, c.x, c.x2, Tensor());
  }
  if (!c.h2.defined()) {
    c.h2 = act({N, C});
    c.rstd2 = stat({N});
    be_.rmsnorm_forward(c.x2, w(l.mlp_norm), c.h2, c.rstd2, eps);
  }
  if (!c.gate_up.defined()) {
    c.gate_up = act({N, 2 * F});
    be_.gemm(false, true, 1.0f, c.h2, w(l.fc1_w), 0.0f, Tensor(), c.gate_up, Tensor());
  }
  if (!c.act.defined()) {
    c.act = act({N, F});
    be_.swiglu_forward(c.gate_up, c.act);
  }
}

Tensor MixedLlamaModel::block_forward(const Layer& l, MixedBlockContext& c, const Tensor& x, int64_t batch,
                                      int64_t seq) {
  c = MixedBlockContext();
  c.x = x;
  block_rebuild(l, c, batch, seq);
  Tensor y = act({batch * seq, spec_.hidden_size});  // y = x2 + act W2^T
  be_.gemm(false, true, 1.0f, c.act, w(l.fc2_w), 1.0f, c.x2, y, Tensor());
  if (opt_.recompute == Recompute::Selective) {
    c.h1 = c.rstd1 = c.attn = c.lse = c.h2 = c.rstd2 = c.act = Tensor();  // keep x, qkv, x2, gate_up
  } else if (opt_.recompute == Recompute::Full) {
    Tensor keep = c.x;
    c = MixedBlockContext();
    c.x = keep;
  }
  return y;
}

Tensor MixedLlamaModel::block_backward_input(const Layer& l, MixedBlockContext& c, const Tensor& dy, int64_t batch,
                                             int64_t seq) {
  PRIMUS_CHECK(c.x.defined(), "backward_input before forward");
  block_rebuild(l, c, batch, seq);
  const int64_t N = batch * seq, C = spec_.hidden_size, F = spec_.ffn_hidden_size, Q = spec_.qkv_size(),
                QS = spec_.q_size(), H = spec_.num_attention_heads, G = spec_.query_groups();
  c.dy = dy;
  Tensor da = act({N, F});
  be_.gemm(false, false, 1.0f, dy, w(l.fc2_w), 0.0f, Tensor(), da, Tensor());
  c.dgate_up = act({N, 2 * F});
  be_.swiglu_backward(da, c.gate_up, c.dgate_up);
  c.dh2 = act({N, C});
  be_.gemm(false, false, 1.0f, c.dgate_up, w(l.fc1_w), 0.0f, Tensor(), c.dh2, Tensor());
  c.dx2 = act({N, C});  // dy through the residual, plus the norm's gradient
  be_.rmsnorm_backward_input(c.dh2, c.x2, w(l.mlp_norm), c.rstd2, dy, c.dx2);
  Tensor dattn = act({N, QS});
  be_.gemm(false, false, 1.0f, c.dx2, w(l.proj_w), 0.0f, Tensor(), dattn, Tensor());
  c.dqkv = act({N, Q});
  be_.attention_backward(c.qkv, c.attn, c.lse, dattn, c.dqkv, attention_shape(batch, seq));
  be_.rope_apply(c.dqkv, H + G, spec_.head_dim(), seq, rope_cos_, rope_sin_, true);
  c.dh1 = act({N, C});
  be_.gemm(false, false, 1.0f, c.dqkv, w(l.qkv_w), 0.0f, Tensor(), c.dh1, Tensor());
  Tensor dx = act({N, C});
  be_.rmsnorm_backward_input(c.dh1, c.x, w(l.attn_norm), c.rstd1, c.dx2, dx);
  c.qkv = c.lse = c.gate_up = Tensor();  // W needs the linears' inputs, output gradients and the norms' inputs
  return dx;
}

void MixedLlamaModel::block_backward_weight(const Layer& l, MixedBlockContext& c) {
  PRIMUS_CHECK(c.dy.defined(), "backward_weight before backward_input");
  auto acc = [&](const Tensor& dy, const Tensor& x, int id) {  // dW += dy^T x
    Tensor gw = g(id);
    be_.gemm(true, false, 1.0f, dy, x, 1.0f, gw, gw, Tensor());
  };
  acc(c.dy, c.act, l.fc2_w);
  acc(c.dgate_up, c.h2, l.fc1_w);
  Tensor gn2 = g(l.mlp_norm);
  be_.rmsnorm_backward_weight(c.dh2, c.x2, c.rstd2, gn2);
  acc(c.dx2, c.attn, l.proj_w);
  acc(c.dqkv, c.h1, l.qkv_w);
  if (l.qkv_b >= 0) {
    Tensor gb = g(l.qkv_b);
    be_.column_sum_accumulate(c.dqkv, gb);
  }
  Tensor gn1 = g(l.attn_norm);
  be_.rmsnorm_backward_weight(c.dh1, c.x, c.rstd1, gn1);
  c = MixedBlockContext();
}

// ---------------------------------------------------------------------------------------------
// Head: final norm, logits in vocabulary chunks, cross-entropy

Tensor MixedLlamaModel::head_logits(const Tensor& hn, int64_t c0, int64_t width) const {
  Tensor z = stat({hn.size(0), width});
  be_.gemm(false, true, 1.0f, hn, w(output_).slice(0, c0, width), 0.0f, Tensor(), z, Tensor());
  return z;
}

float MixedLlamaModel::head_forward(MixedContext& ctx, const Tensor& x) {
  auto& h = ctx.head;
  const int64_t N = x.size(0), C = spec_.hidden_size, V = spec_.vocab_size;
  h = MixedContext::Head();
  h.x = x;
  h.hn = act({N, C});
  h.rstd = stat({N});
  be_.rmsnorm_forward(x, w(final_norm_), h.hn, h.rstd, float(spec_.norm_epsilon));
  Tensor m = stat({N}), s = stat({N}), zt = stat({N});
  be_.ce_init(m, s, zt);
  h.lse = stat({N});
  if (head_stores_logits(N)) {
    Tensor z = head_logits(h.hn, 0, V);
    be_.ce_chunk_forward(z, ctx.targets_dev, 0, m, s, zt);
    const double total = be_.ce_finish(m, s, zt, ctx.targets_dev, h.lse);
    h.dlogits = act({N, V});
    be_.ce_chunk_backward(z, h.lse, ctx.targets_dev, 0, h.dlogits);
    return ctx.valid ? float(total / double(ctx.valid)) : 0.0f;
  }
  for (int64_t c0 = 0; c0 < V; c0 += opt_.vocab_chunk) {
    const int64_t vc = std::min(opt_.vocab_chunk, V - c0);
    be_.ce_chunk_forward(head_logits(h.hn, c0, vc), ctx.targets_dev, c0, m, s, zt);
  }
  const double total = be_.ce_finish(m, s, zt, ctx.targets_dev, h.lse);
  return ctx.valid ? float(total / double(ctx.valid)) : 0.0f;
}

Tensor MixedLlamaModel::head_backward_input(MixedContext& ctx, float dloss) {
  auto& h = ctx.head;
  PRIMUS_CHECK(h.lse.defined(), "head backward without a forward that had targets");
  const int64_t N = h.x.size(0), C = spec_.hidden_size, V = spec_.vocab_size;
  h.grad_scale = ctx.valid ? dloss / float(ctx.valid) : 0.0f;
  // dhn = s * dlogits Wout, summed over the chunks in fp32.
  Tensor dhn = be_.zeros({N, C}, DType::F32);
  const Tensor W = w(output_);
  if (h.dlogits.defined()) {
    be_.gemm(false, false, h.grad_scale, h.dlogits, W, 1.0f, dhn, dhn, Tensor());
  } else {
    for (int64_t c0 = 0; c0 < V; c0 += opt_.vocab_chunk) {
      const int64_t vc = std::min(opt_.vocab_chunk, V - c0);
      Tensor d = act({N, vc});
      be_.ce_chunk_backward(head_logits(h.hn, c0, vc), h.lse, ctx.targets_dev, c0, d);
      be_.gemm(false, false, h.grad_scale, d, W.slice(0, c0, vc), 1.0f, dhn, dhn, Tensor());
    }
  }
  h.dhn = act({N, C});
  be_.cast(dhn, h.dhn);
  Tensor dx = act({N, C});
  be_.rmsnorm_backward_input(h.dhn, h.x, w(final_norm_), h.rstd, Tensor(), dx);
  return dx;
}

void MixedLlamaModel::head_backward_weight(MixedContext& ctx) {
  auto& h = ctx.head;
  PRIMUS_CHECK(h.dhn.defined(), "head backward_weight before backward_input");
  const int64_t N = h.x.size(0), V = spec_.vocab_size;
  Tensor gn = g(final_norm_);
  be_.rmsnorm_backward_weight(h.dhn, h.x, h.rstd, gn);
  Tensor gW = g(output_);
  if (h.dlogits.defined()) {
    be_.gemm(true, false, h.grad_scale, h.dlogits, h.hn, 1.0f, gW, gW, Tensor());
  } else {
    for (int64_t c0 = 0; c0 < V; c0 += opt_.vocab_chunk) {
      const int64_t vc = std::min(opt_.vocab_chunk, V - c0);
      Tensor d = act({N, vc});
      be_.ce_chunk_backward(head_logits(h.hn, c0, vc), h.lse, ctx.targets_dev, c0, d);
      Tensor gc = gW.slice(0, c0, vc);
      be_.gemm(true, false, h.grad_scale, d, h.hn, 1.0f, gc, gc, Tensor());
    }
  }
  h = MixedContext::Head();
  weights_done({final_norm_, output_});
}

// ---------------------------------------------------------------------------------------------
// Whole model

float MixedLlamaModel::forward(MixedContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch,
                               int64_t seq) {
  if (batch <= 0 || seq <= 0) fail("empty microbatch: batch {} x sequence {}", batch, seq);
  if (seq > spec_.max_position_embeddings)
    fail("sequence length {} exceeds max_position_embeddings {} of model {}", seq, spec_.max_position_embeddings,
         spec_.name);
  if (!targets) fail("the mixed-precision model trains and evaluates: it needs targets");
  const int64_t N = batch * seq, C = spec_.hidden_size, V = spec_.vocab_size;
  ctx = MixedContext();
  ctx.batch = batch;
  ctx.seq = seq;
  ctx.tokens.assign(tokens, tokens + N);
  ctx.targets.assign(targets, targets + N);
  for (int64_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      fail("token id {} at position {} is outside the vocabulary of {} entries", tokens[i], i, V);
    if (targets[i] >= V) fail("target token id {} at position {} is outside the vocabulary of {}", targets[i], i, V);
    ctx.valid += targets[i] >= 0;
  }
  Tensor tk = Tensor::empty({N}, DType::I32), tg = Tensor::empty({N}, DType::I32);
  std::copy(tokens, tokens + N, tk.data<int32_t>());
  std::copy(targets, targets + N, tg.data<int32_t>());
  ctx.tokens_dev = be_.device() == Device::CPU ? tk : tk.to(be_.device());
  ctx.targets_dev = be_.device() == Device::CPU ? tg : tg.to(be_.device());

  Tensor x = act({N, C});
  be_.embedding_forward(ctx.tokens_dev, w(embedding_), x);
  ctx.embedded = x;
  ctx.blocks.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) x = block_forward(layers_[l], ctx.blocks[l], x, batch, seq);
  ctx.loss = head_forward(ctx, x);
  return ctx.loss;
}

void MixedLlamaModel::embedding_weight_pass(MixedContext& ctx) {
  PRIMUS_CHECK(ctx.dembedded.defined(), "backward_weight before backward_input");
  Tensor ge = g(embedding_);
  be_.embedding_backward(ctx.tokens, ctx.dembedded, ge);
  ctx.dembedded = ctx.embedded = Tensor();
  weights_done({embedding_});
}

void MixedLlamaModel::backward_input(MixedContext& ctx, float dloss) {
  Tensor dx = head_backward_input(ctx, dloss);
  for (size_t l = layers_.size(); l-- > 0;)
    dx = block_backward_input(layers_[l], ctx.blocks[l], dx, ctx.batch, ctx.seq);
  ctx.dembedded = dx;
}

void MixedLlamaModel::backward_weight(MixedContext& ctx) {
  head_backward_weight(ctx);
  for (size_t l = layers_.size(); l-- > 0;) {
    block_backward_weight(layers_[l], ctx.blocks[l]);
    weights_done(layers_[l].ids());
  }
  embedding_weight_pass(ctx);
}

void MixedLlamaModel::backward(MixedContext& ctx, float dloss) {
  Tensor dx = head_backward_input(ctx, dloss);
  head_backward_weight(ctx);
  for (size_t l = layers_.size(); l-- > 0;) {
    dx = block_backward_input(layers_[l], ctx.blocks[l], dx, ctx.batch, ctx.seq);
    block_backward_weight(layers_[l], ctx.blocks[l]);
    weights_done(layers_[l].ids());
  }
  ctx.dembedded = dx;
  embedding_weight_pass(ctx);
}

}  // namespace primus
