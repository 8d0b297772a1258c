#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"

namespace primus {

using namespace cpu;

Recompute parse_recompute(const std::string& s) {
  if (s.empty() || s == "none" || s == "null") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  fail("recompute_granularity '{}' is not one of: full, selective (or leave it unset)", s);
}

template <typename T>
static T* ptr(const Tensor& t) {
  return t.data<T>();
}

template <typename T>
static Tensor new_tensor(const Shape& shape) {
  return Tensor::empty(shape, dtype_of<T>::value);
}

// ---------------------------------------------------------------------------------------------
// Transformer block

template <typename T>
TransformerBlock<T>::TransformerBlock(const ModelSpec& spec, int64_t layer, ParamStore<T>& p, Recompute recompute)
    : spec_(spec), p_(p), recompute_(recompute) {
  const std::string pre = fmt::format("decoder.layers.{}.", layer);
  const int64_t C = spec.hidden_size, F = spec.ffn_hidden_size, Q = spec.qkv_size();
  attn_norm_ = p.add(pre + "input_layernorm.weight", {C}, ParamInit::Ones, false);
  qkv_w_ = p.add(pre + "self_attention.linear_qkv.weight", {Q, C}, ParamInit::Normal, true);
  if (spec.add_qkv_bias) qkv_b_ = p.add(pre + "self_attention.linear_qkv.bias", {Q}, ParamInit::Zeros, false);
  proj_w_ = p.add(pre + "self_attention.linear_proj.weight", {C, spec.q_size()}, ParamInit::ScaledNormal, true);
  mlp_norm_ = p.add(pre + "pre_mlp_layernorm.weight", {C}, ParamInit::Ones, false);
  fc1_w_ = p.add(pre + "mlp.linear_fc1.weight", {2 * F, C}, ParamInit::Normal, true);
  fc2_w_ = p.add(pre + "mlp.linear_fc2.weight", {C, F}, ParamInit::ScaledNormal, true);
}

template <typename T>
AttentionShape TransformerBlock<T>::attention_shape(int64_t batch, int64_t seq) const {
  return AttentionShape{batch, seq, spec_.num_attention_heads, spec_.query_groups(), spec_.head_dim()};
}

// The forward's steps, each filling its part of ctx from earlier parts; rebuild() reruns some.
namespace {
template <typename T>
struct BlockSteps {
  const ModelSpec& s;
  ParamStore<T>& p;
  int attn_norm, qkv_w, qkv_b, proj_w, mlp_norm, fc1_w, fc2_w;
  int64_t N;

  void norm1(BlockContext<T>& c) {
    c.h1 = new_tensor<T>({N, s.hidden_size});
    c.rstd1 = new_tensor<T>({N});
    rmsnorm_forward(ptr<T>(c.x), p.value(attn_norm), ptr<T>(c.h1), ptr<T>(c.rstd1), N, s.hidden_size,
                    s.norm_epsilon);
  }
  void qkv(BlockContext<T>& c, int64_t seq, const T* cos, const T* sin) {
    const int64_t Q = s.qkv_size();
    c.qkv = new_tensor<T>({N, Q});
    linear_forward(ptr<T>(c.h1), p.value(qkv_w), qkv_b >= 0 ? p.value(qkv_b) : static_cast<const T*>(nullptr),
                   ptr<T>(c.qkv), N, s.hidden_size, Q);
    // q heads and k heads are adjacent in the row: rotate them in one sweep.
    rope_apply(ptr<T>(c.qkv), N, Q, s.num_attention_heads + s.query_groups(), s.head_dim(), seq, 0, cos, sin,
               false);
  }
  void attention(BlockContext<T>& c, const AttentionShape& shape) {
    c.attn = new_tensor<T>({N, s.q_size()});
    c.lse = new_tensor<T>({shape.batch, shape.heads, shape.seq});
    attention_forward(ptr<T>(c.qkv), ptr<T>(c.attn), ptr<T>(c.lse), shape);
  }
  void proj(BlockContext<T>& c) {  // x2 = x + attn Wo^T
    c.x2 = c.x.clone();
    linear_forward(ptr<T>(c.attn), p.value(proj_w), static_cast<const T*>(nullptr), ptr<T>(c.x2), N, s.q_size(),
                   s.hidden_size, true);
  }
  void norm2(BlockContext<T>& c) {
    c.h2 = new_tensor<T>({N, s.hidden_size});
    c.rstd2 = new_tensor<T>({N});
    rmsnorm_forward(ptr<T>(c.x2), p.value(mlp_norm), ptr<T>(c.h2), ptr<T>(c.rstd2), N, s.hidden_size,
                    s.norm_epsilon);
  }
  void fc1(BlockContext<T>& c) {
    c.gate_up = new_tensor<T>({N, 2 * s.ffn_hidden_size});
    linear_forward(ptr<T>(c.h2), p.value(fc1_w), static_cast<const T*>(nullptr), ptr<T>(c.gate_up), N,
                   s.hidden_size, 2 * s.ffn_hidden_size);
  }
  void swiglu(BlockContext<T>& c) {
    c.act = new_tensor<T>({N, s.ffn_hidden_size});
    swiglu_forward(ptr<T>(c.gate_up), ptr<T>(c.act), N, s.ffn_hidden_size);
  }
  Tensor fc2(BlockContext<T>& c) {  // y = x2 + act W2^T
    Tensor y = c.x2.clone();
    linear_forward(ptr<T>(c.act), p.value(fc2_w), static_cast<const T*>(nullptr), ptr<T>(y), N,
                   s.ffn_hidden_size, s.hidden_size, true);
    return y;
  }
};
}  // namespace

#define STEPS BlockSteps<T>{spec_, p_, attn_norm_, qkv_w_, qkv_b_, proj_w_, mlp_norm_, fc1_w_, fc2_w_, batch * seq}

template <typename T>
Tensor TransformerBlock<T>::forward(BlockContext<T>& ctx, const Tensor& x, int64_t batch, int64_t seq, const T* cos,
                                    const T* sin) {
  ctx.clear();
  ctx.x = x;
  rebuild(ctx, batch, seq, cos, sin);  // from an empty context: the whole forward
  Tensor y = STEPS.fc2(ctx);
  if (recompute_ == Recompute::Selective) {
    // Keep x, qkv, x2 and gate_up; the rest is cheap to recompute from them.
    ctx.h1 = ctx.rstd1 = ctx.attn = ctx.lse = ctx.h2 = ctx.rstd2 = ctx.act = Tensor();
  } else if (recompute_ == Recompute::Full) {
    Tensor keep = ctx.x;
    ctx.clear();
    ctx.x = keep;
  }
  return y;
}

// Computes whatever the context lacks, in dependency order: everything after a forward with
// full recompute, the dropped parts after selective recompute, nothing otherwise.
template <typename T>
void TransformerBlock<T>::rebuild(BlockContext<T>& ctx, int64_t batch, int64_t seq, const T* cos, const T* sin) {
  auto st = STEPS;
  if (!ctx.h1.defined()) st.norm1(ctx);
  if (!ctx.qkv.defined()) st.qkv(ctx, seq, cos, sin);
  if (!ctx.attn.defined()) st.attention(ctx, attention_shape(batch, seq));
  if (!ctx.x2.defined()) st.proj(ctx);
  if (!ctx.h2.defined()) st.norm2(ctx);
  if (!ctx.gate_up.defined()) st.fc1(ctx);
  if (!ctx.act.defined()) st.swiglu(ctx);
}

template <typename T>
Tensor TransformerBlock<T>::backward_input(BlockContext<T>& ctx, const Tensor& dy, int64_t batch, int64_t seq,
                                           const T* cos, const T* sin) {
  PRIMUS_CHECK(ctx.x.defined(), "backward_input before forward");
  rebuild(ctx, batch, seq, cos, sin);
  const int64_t N = batch * seq, C = spec_.hidden_size, F = spec_.ffn_hidden_size, Q = spec_.qkv_size(),
                QS = spec_.q_size();
  ctx.dy = dy;
  Tensor da = new_tensor<T>({N, F});
  linear_backward_input(ptr<T>(dy), p_.value(fc2_w_), ptr<T>(da), N, F, C);
  ctx.dgate_up = new_tensor<T>({N, 2 * F});
  swiglu_backward(ptr<T>(da), ptr<T>(ctx.gate_up), ptr<T>(ctx.dgate_up), N, F);
  ctx.dh2 = new_tensor<T>({N, C});
  linear_backward_input(ptr<T>(ctx.dgate_up), p_.value(fc1_w_), ptr<T>(ctx.dh2), N, C, 2 * F);
  ctx.dx2 = dy.clone();  // residual path
  rmsnorm_backward_input(ptr<T>(ctx.dh2), ptr<T>(ctx.x2), p_.value(mlp_norm_), ptr<T>(ctx.rstd2),
                         ptr<T>(ctx.dx2), N, C, true);
  Tensor dattn = new_tensor<T>({N, QS});
  linear_backward_input(ptr<T>(ctx.dx2), p_.value(proj_w_), ptr<T>(dattn), N, QS, C);
  ctx.dqkv = new_tensor<T>({N, Q});
  attention_backward(ptr<T>(ctx.qkv), ptr<T>(ctx.attn), ptr<T>(ctx.lse), ptr<T>(dattn), ptr<T>(ctx.dqkv),
                     attention_shape(batch, seq));
  rope_apply(ptr<T>(ctx.dqkv), N, Q, spec_.num_attention_heads + spec_.query_groups(), spec_.head_dim(), seq, 0,
             cos, sin, true);
  ctx.dh1 = new_tensor<T>({N, C});
  linear_backward_input(ptr<T>(ctx.dqkv), p_.value(qkv_w_), ptr<T>(ctx.dh1), N, C, Q);
  Tensor dx = ctx.dx2.clone();
  rmsnorm_backward_input(ptr<T>(ctx.dh1), ptr<T>(ctx.x), p_.value(attn_norm_), ptr<T>(ctx.rstd1),
                         ptr<T>(dx), N, C, true);
  // The W pass needs the linears' inputs and output gradients, and the norms' inputs.
  ctx.qkv = ctx.lse = ctx.gate_up = Tensor();
  return dx;
}

template <typename T>
void TransformerBlock<T>::backward_weight(BlockContext<T>& ctx) {
  PRIMUS_CHECK(ctx.dy.defined(), "backward_weight before backward_input");
  const int64_t N = ctx.x.size(0), C = spec_.hidden_size, F = spec_.ffn_hidden_size, Q = spec_.qkv_size(),
                QS = spec_.q_size();
  linear_backward_weight(ptr<T>(ctx.dy), ptr<T>(ctx.act), p_.grad(fc2_w_), static_cast<T*>(nullptr), N, F, C);
  linear_backward_weight(ptr<T>(ctx.dgate_up), ptr<T>(ctx.h2), p_.grad(fc1_w_), static_cast<T*>(nullptr), N, C,
                         2 * F);
  rmsnorm_backward_weight(ptr<T>(ctx.dh2), ptr<T>(ctx.x2), ptr<T>(ctx.rstd2), p_.grad(mlp_norm_), N, C);
  linear_backward_weight(ptr<T>(ctx.dx2), ptr<T>(ctx.attn), p_.grad(proj_w_), static_cast<T*>(nullptr), N, QS,
                         C);
  linear_backward_weight(ptr<T>(ctx.dqkv), ptr<T>(ctx.h1), p_.grad(qkv_w_),
                         qkv_b_ >= 0 ? p_.grad(qkv_b_) : static_cast<T*>(nullptr), N, C, Q);
  rmsnorm_backward_weight(ptr<T>(ctx.dh1), ptr<T>(ctx.x), ptr<T>(ctx.rstd1), p_.grad(attn_norm_), N, C);
  ctx.clear();
}

// ---------------------------------------------------------------------------------------------
// Whole model

template <typename T>
LlamaModel<T>::LlamaModel(const ModelSpec& spec, LlamaOptions options) : spec_(spec), opt_(options) {
  spec_.validate();
  const int64_t C = spec_.hidden_size, V = spec_.vocab_size;
  embedding_ = params_.add("embedding.word_embeddings.weight", {V, C}, ParamInit::Normal, true);
  for (int64_t l = 0; l < spec_.num_layers; ++l)
    blocks_.push_back(std::make_unique<TransformerBlock<T>>(spec_, l, params_, opt_.recompute));
  final_norm_ = params_.add("decoder.final_layernorm.weight", {C}, ParamInit::Ones, false);
  output_ = spec_.untie_embeddings_and_output_weights
                ? params_.add("output_layer.weight", {V, C}, ParamInit::Normal, true)
                : embedding_;
  params_.allocate();

  const int64_t half = spec_.head_dim() / 2, P = spec_.max_position_embeddings;
  rope_cos_ = new_tensor<T>({P, half});
  rope_sin_ = new_tensor<T>({P, half});
  RopeScaling sc;
  if (spec_.use_rope_scaling) {
    sc.factor = spec_.rope_scaling_factor;
    sc.low_freq_factor = spec_.rope_low_freq_factor;
    sc.high_freq_factor = spec_.rope_high_freq_factor;
    sc.original_max_position = spec_.rope_original_max_position_embeddings;
  }
  rope_tables(ptr<T>(rope_cos_), ptr<T>(rope_sin_), P, spec_.head_dim(), spec_.rotary_base, sc);
}

template <typename T>
void LlamaModel<T>::init_weights(uint64_t seed) {
  // Megatron: N(0, std) everywhere, output projections of each block scaled by 1/sqrt(2 layers).
  params_.init(seed, spec_.init_method_std, spec_.init_method_std / std::sqrt(2.0 * double(spec_.num_layers)));
}

template <typename T>
const T* LlamaModel<T>::output_weight() const {
  return params_.value(output_);
}
template <typename T>
T* LlamaModel<T>::output_weight_grad() const {
  return params_.grad(output_);
}

template <typename T>
bool LlamaModel<T>::head_stores_logits(int64_t rows) const {
  return size_t(rows) * size_t(spec_.vocab_size) * sizeof(T) <= opt_.logits_memory_budget;
}

template <typename T>
T LlamaModel<T>::forward(LlamaContext<T>& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch,
                         int64_t seq) {
  if (batch <= 0 || seq <= 0) fail("empty microbatch: batch {} x sequence {}", batch, seq);
  if (seq > spec_.max_position_embeddings)
    fail("sequence length {} exceeds max_position_embeddings {} of model {}", seq, spec_.max_position_embeddings,
         spec_.name);
  const int64_t N = batch * seq, C = spec_.hidden_size;
  ctx.batch = batch;
  ctx.seq = seq;
  ctx.tokens.assign(tokens, tokens + N);
  if (targets)
    ctx.targets.assign(targets, targets + N);
  else
    ctx.targets.clear();
  ctx.embedded = new_tensor<T>({N, C});
  embedding_forward(ctx.tokens.data(), params_.value(embedding_), ptr<T>(ctx.embedded), N, spec_.vocab_size, C);
  ctx.blocks.resize(blocks_.size());
  Tensor x = ctx.embedded;
  for (size_t l = 0; l < blocks_.size(); ++l)
    x = blocks_[l]->forward(ctx.blocks[l], x, batch, seq, ptr<T>(rope_cos_), ptr<T>(rope_sin_));
  return head_forward(ctx.head, x, targets ? ctx.targets.data() : nullptr);
}

template <typename T>
T LlamaModel<T>::head_forward(HeadContext<T>& h, const Tensor& x, const int32_t* targets) {
  const int64_t N = x.size(0), C = spec_.hidden_size, V = spec_.vocab_size;
  h = HeadContext<T>();
  h.x = x;
  h.hn = new_tensor<T>({N, C});
  h.rstd = new_tensor<T>({N});
  rmsnorm_forward(ptr<T>(x), params_.value(final_norm_), ptr<T>(h.hn), ptr<T>(h.rstd), N, C, spec_.norm_epsilon);
  if (!targets) return T(0);  // inference: keep hn for last_logits()
  h.targets = targets;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] >= V) fail("target token id {} at position {} is outside the vocabulary of {}", targets[i], i, V);
    h.valid += targets[i] >= 0;
  }
  h.lse = new_tensor<T>({N});
  std::vector<T> row_loss(N, T(0));
  T* lse = ptr<T>(h.lse);
  const T* W = output_weight();
  const T* hn = ptr<T>(h.hn);

  if (head_stores_logits(N)) {
    // One GEMM for all logits, then each row becomes its unscaled gradient softmax - onehot.
    h.dlogits = new_tensor<T>({N, V});
    T* z = ptr<T>(h.dlogits);
    gemm<T>(false, true, N, V, C, T(1), hn, C, W, C, T(0), z, V);
#pragma omp parallel for schedule(static) if(N * V >= (1 << 15))
    for (int64_t i = 0; i < N; ++i) {
      T* zi = z + i * V;
      T mx = zi[0];
#pragma omp simd reduction(max : mx)
      for (int64_t j = 1; j < V; ++j) mx = std::max(mx, zi[j]);
      const int32_t t = targets[i];
      const T zt = t >= 0 ? zi[t] : T(0);
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) sum += (zi[j] = fast_exp(zi[j] - mx));
      const T l = mx + std::log(sum);
      lse[i] = l;
      if (t < 0) {
        std::fill(zi, zi + V, T(0));
        continue;
      }
      row_loss[i] = l - zt;
      const T inv = T(1) / sum;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) zi[j] *= inv;
      zi[t] -= T(1);
    }
  } else {
    // Vocabulary chunks with an online log-sum-exp: memory N * vocab_chunk, never N * V.
    const int64_t VC = std::min(opt_.vocab_chunk, V);
    Tensor zbuf = new_tensor<T>({N, VC});
    T* z = ptr<T>(zbuf);
    std::vector<T> m(N, -std::numeric_limits<T>::infinity()), s(N, T(0)), zt(N, T(0));
    for (int64_t v0 = 0; v0 < V; v0 += VC) {
      const int64_t vc = std::min(VC, V - v0);
      gemm<T>(false, true, N, vc, C, T(1), hn, C, W + v0 * C, C, T(0), z, vc);
#pragma omp parallel for schedule(static) if(N * vc >= (1 << 15))
      for (int64_t i = 0; i < N; ++i) {
        const T* zi = z + i * vc;
        T mx = m[i];
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < vc; ++j) mx = std::max(mx, zi[j]);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < vc; ++j) sum += fast_exp(zi[j] - mx);
        s[i] = s[i] * fast_exp(m[i] - mx) + sum;
        m[i] = mx;
        const int32_t t = targets[i];
        if (t >= v0 && t < v0 + vc) zt[i] = zi[t - v0];
      }
    }
    for (int64_t i = 0; i < N; ++i) {
      lse[i] = m[i] + std::log(s[i]);
      if (targets[i] >= 0) row_loss[i] = lse[i] - zt[i];
    }
  }
  double total = 0;
  for (int64_t i = 0; i < N; ++i) total += double(row_loss[i]);
  return h.valid ? T(total / double(h.valid)) : T(0);
}

// Chunked mode: recomputes one chunk's logits and turns them into softmax - onehot.
template <typename T>
static void chunk_dlogits(const HeadContext<T>& h, const T* W, T* z, int64_t v0, int64_t vc, int64_t N, int64_t C) {
  gemm<T>(false, true, N, vc, C, T(1), ptr<T>(h.hn), C, W + v0 * C, C, T(0), z, vc);
  const T* lse = ptr<T>(h.lse);
#pragma omp parallel for schedule(static) if(N * vc >= (1 << 15))
  for (int64_t i = 0; i < N; ++i) {
    T* zi = z + i * vc;
    const int32_t t = h.targets[i];
    if (t < 0) {
      std::fill(zi, zi + vc, T(0));
      continue;
    }
#pragma omp simd
    for (int64_t j = 0; j < vc; ++j) zi[j] = fast_exp(zi[j] - lse[i]);
    if (t >= v0 && t < v0 + vc) zi[t - v0] -= T(1);
  }
}

template <typename T>
Tensor LlamaModel<T>::head_backward_input(HeadContext<T>& h, T dloss) {
  PRIMUS_CHECK(h.lse.defined(), "head backward without a forward that had targets");
  const int64_t N = h.x.size(0), C = spec_.hidden_size, V = spec_.vocab_size;
  h.grad_scale = h.valid ? dloss / T(h.valid) : T(0);
  h.dhn = new_tensor<T>({N, C});
  const T* W = output_weight();
  if (h.dlogits.defined()) {
    gemm<T>(false, false, N, C, V, h.grad_scale, ptr<T>(h.dlogits), V, W, C, T(0), ptr<T>(h.dhn), C);
  } else {
    h.dhn.zero_();
    const int64_t VC = std::min(opt_.vocab_chunk, V);
    Tensor zbuf = new_tensor<T>({N, VC});
    for (int64_t v0 = 0; v0 < V; v0 += VC) {
      const int64_t vc = std::min(VC, V - v0);
      chunk_dlogits(h, W, ptr<T>(zbuf), v0, vc, N, C);
      gemm<T>(false, false, N, C, vc, h.grad_scale, ptr<T>(zbuf), vc, W + v0 * C, C, T(1), ptr<T>(h.dhn), C);
    }
  }
  Tensor dx = new_tensor<T>({N, C});
  rmsnorm_backward_input(ptr<T>(h.dhn), ptr<T>(h.x), params_.value(final_norm_), ptr<T>(h.rstd),
                         ptr<T>(dx), N, C, false);
  return dx;
}

template <typename T>
void LlamaModel<T>::head_backward_weight(HeadContext<T>& h) {
  PRIMUS_CHECK(h.dhn.defined(), "head backward_weight before backward_input");
  const int64_t N = h.x.size(0), C = spec_.hidden_size, V = spec_.vocab_size;
  rmsnorm_backward_weight(ptr<T>(h.dhn), ptr<T>(h.x), ptr<T>(h.rstd), params_.grad(final_norm_), N, C);
  T* gW = output_weight_grad();
  if (h.dlogits.defined()) {
    gemm<T>(true, false, V, C, N, h.grad_scale, ptr<T>(h.dlogits), V, ptr<T>(h.hn), C, T(1), gW, C);
  } else {
    const int64_t VC = std::min(opt_.vocab_chunk, V);
    Tensor zbuf = new_tensor<T>({N, VC});
    for (int64_t v0 = 0; v0 < V; v0 += VC) {
      const int64_t vc = std::min(VC, V - v0);
      chunk_dlogits(h, output_weight(), ptr<T>(zbuf), v0, vc, N, C);
      gemm<T>(true, false, vc, C, N, h.grad_scale, ptr<T>(zbuf), vc, ptr<T>(h.hn), C, T(1), gW + v0 * C, C);
    }
  }
  h = HeadContext<T>();
}

template <typename T>
void LlamaModel<T>::backward_input(LlamaContext<T>& ctx, T dloss) {
  Tensor dx = head_backward_input(ctx.head, dloss);
  for (size_t l = blocks_.size(); l-- > 0;)
    dx = blocks_[l]->backward_input(ctx.blocks[l], dx, ctx.batch, ctx.seq, ptr<T>(rope_cos_), ptr<T>(rope_sin_));
  ctx.dembedded = dx;
}

template <typename T>
void LlamaModel<T>::backward_weight(LlamaContext<T>& ctx) {
  PRIMUS_CHECK(ctx.dembedded.defined(), "backward_weight before backward_input");
  head_backward_weight(ctx.head);
  for (size_t l = blocks_.size(); l-- > 0;) blocks_[l]->backward_weight(ctx.blocks[l]);
  embedding_backward_weight(ctx.tokens.data(), ptr<T>(ctx.dembedded), params_.grad(embedding_),
                            ctx.batch * ctx.seq, spec_.vocab_size, spec_.hidden_size);
  ctx.dembedded = ctx.embedded = Tensor();
}

template <typename T>
void LlamaModel<T>::backward(LlamaContext<T>& ctx, T dloss) {
  Tensor dx = head_backward_input(ctx.head, dloss);
  head_backward_weight(ctx.head);
  for (size_t l = blocks_.size(); l-- > 0;) {
    dx = blocks_[l]->backward_input(ctx.blocks[l], dx, ctx.batch, ctx.seq, ptr<T>(rope_cos_), ptr<T>(rope_sin_));
    blocks_[l]->backward_weight(ctx.blocks[l]);
  }
  embedding_backward_weight(ctx.tokens.data(), ptr<T>(dx), params_.grad(embedding_), ctx.batch * ctx.seq,
                            spec_.vocab_size, spec_.hidden_size);
  ctx.embedded = Tensor();
}

template <typename T>
Tensor LlamaModel<T>::last_logits(LlamaContext<T>& ctx) const {
  PRIMUS_CHECK(ctx.head.hn.defined(), "last_logits before forward");
  const int64_t B = ctx.batch, S = ctx.seq, C = spec_.hidden_size, V = spec_.vocab_size;
  Tensor logits = new_tensor<T>({B, V});
  // Row b*S + S-1 of hn for each sequence: a strided GEMM over B rows.
  gemm<T>(false, true, B, V, C, T(1), ptr<T>(ctx.head.hn) + (S - 1) * C, S * C, output_weight(), C, T(0),
          ptr<T>(logits), V);
  return logits;
}

template class TransformerBlock<float>;
template class TransformerBlock<double>;
template class LlamaModel<float>;
template class LlamaModel<double>;

}  // namespace primus
