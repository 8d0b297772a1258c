#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"
#include "model/rope.h"

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
// Tensor-parallel collectives on [rows, C] activations

void check_tensor_parallel(const ModelSpec& spec, int tp) {
  if (tp < 1) fail("tensor_model_parallel_size must be at least 1, got {}", tp);
  if (tp == 1) return;
  auto need = [&](int64_t value, const char* what) {
    if (value % tp != 0)
      fail("{} ({}) of model {} must be divisible by tensor_model_parallel_size ({})", what, value, spec.name, tp);
  };
  need(spec.num_attention_heads, "num_attention_heads");
  need(spec.query_groups(), "num_query_groups");
  need(spec.ffn_hidden_size, "ffn_hidden_size");
  need(spec.vocab_size, "vocab_size");
}

namespace {
template <typename T>
constexpr parallel::CommType comm_t = parallel::comm_type_of_t<T>::value;

// Sequence parallel: each tp rank holds rows [r N/tp, (r+1) N/tp); a column-parallel linear needs
// them all. Identity without sequence parallel (every rank holds every row).
template <typename T>
Tensor gather_rows(const ModelPartition& p, const Tensor& local) {
  if (p.tp_size == 1 || !p.sequence_parallel) return local;
  const int64_t n = local.size(0), c = local.size(1);
  Tensor full = new_tensor<T>({n * p.tp_size, c});
  p.tp_group->all_gather(ptr<T>(local), ptr<T>(full), n * c, comm_t<T>);
  return full;
}

// The partial outputs of a row-parallel linear ([N, C] on every rank) summed over tp: all of it
// on every rank, or under sequence parallelism this rank's rows only.
template <typename T>
Tensor reduce_partial(const ModelPartition& p, Tensor partial) {
  if (p.tp_size == 1) return partial;
  if (!p.sequence_parallel) {
    p.tp_group->all_reduce(ptr<T>(partial), partial.numel(), comm_t<T>, parallel::ReduceOp::Sum);
    return partial;
  }
  const int64_t n = partial.size(0) / p.tp_size, c = partial.size(1);
  Tensor local = new_tensor<T>({n, c});
  p.tp_group->reduce_scatter(ptr<T>(partial), ptr<T>(local), n * c, comm_t<T>, parallel::ReduceOp::Sum);
  return local;
}

template <typename T>
void add_into(Tensor& y, const Tensor& x) {
  T* a = ptr<T>(y);
  const T* b = ptr<T>(x);
  const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static) if(n >= (1 << 16))
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

// residual + in W^T for a row-parallel weight W [C, in]: with one rank the GEMM accumulates into
// a copy of the residual; with tp ranks the partial products are summed first.
template <typename T>
Tensor row_parallel_residual(const ModelPartition& p, const Tensor& in, const T* w, const Tensor& residual,
                             int64_t rows, int64_t in_features, int64_t out_features) {
  if (p.tp_size == 1) {
    Tensor y = residual.clone();
    linear_forward(ptr<T>(in), w, static_cast<const T*>(nullptr), ptr<T>(y), rows, in_features, out_features, true);
    return y;
  }
  Tensor partial = new_tensor<T>({rows, out_features});
  linear_forward(ptr<T>(in), w, static_cast<const T*>(nullptr), ptr<T>(partial), rows, in_features, out_features);
  Tensor y = reduce_partial<T>(p, partial);
  add_into<T>(y, residual);
  return y;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Transformer block

template <typename T>
TransformerBlock<T>::TransformerBlock(const ModelSpec& spec, int64_t layer, ParamStore<T>& p, Recompute recompute,
                                      const ModelPartition& part)
    : spec_(spec), p_(p), recompute_(recompute), part_(part) {
  const std::string pre = fmt::format("decoder.layers.{}.", layer);
  const int64_t C = spec.hidden_size, F = spec.ffn_hidden_size, Q = spec.qkv_size(), D = spec.head_dim();
  const int64_t H = spec.num_attention_heads, G = spec.query_groups();
  const int tp = part.tp_size, r = part.tp_rank;
  heads_ = H / tp;
  groups_ = G / tp;
  const int64_t Fl = F / tp;
  // Column-parallel QKV: this rank's q heads, then its k groups, then its v groups.
  ShardSpec qkv_shard, proj_shard, fc1_shard, fc2_shard;
  if (tp > 1) {
    qkv_shard = {0, {{r * heads_ * D, heads_ * D}, {H * D + r * groups_ * D, groups_ * D},
                     {H * D + G * D + r * groups_ * D, groups_ * D}}};
    proj_shard = {1, {{r * heads_ * D, heads_ * D}}};
    fc1_shard = {0, {{r * Fl, Fl}, {F + r * Fl, Fl}}};  // its gate rows, then its up rows
    fc2_shard = {1, {{r * Fl, Fl}}};
  }
  attn_norm_ = p.add(pre + "input_layernorm.weight", {C}, ParamInit::Ones, false);
  qkv_w_ = p.add_sharded(pre + "self_attention.linear_qkv.weight", {Q, C}, qkv_shard, ParamInit::Normal, true);
  if (spec.add_qkv_bias)
    qkv_b_ = p.add_sharded(pre + "self_attention.linear_qkv.bias", {Q}, qkv_shard, ParamInit::Zeros, false);
  proj_w_ = p.add_sharded(pre + "self_attention.linear_proj.weight", {C, spec.q_size()}, proj_shard,
                          ParamInit::ScaledNormal, true);
  mlp_norm_ = p.add(pre + "pre_mlp_layernorm.weight", {C}, ParamInit::Ones, false);
  fc1_w_ = p.add_sharded(pre + "mlp.linear_fc1.weight", {2 * F, C}, fc1_shard, ParamInit::Normal, true);
  fc2_w_ = p.add_sharded(pre + "mlp.linear_fc2.weight", {C, F}, fc2_shard, ParamInit::ScaledNormal, true);
}

template <typename T>
AttentionShape TransformerBlock<T>::attention_shape(int64_t batch, int64_t seq) const {
  return AttentionShape{batch, seq, heads_, groups_, spec_.head_dim()};
}

// The forward's steps, each filling its part of ctx from earlier parts; rebuild() reruns some.
// Nl rows are this rank's (x, norms, residuals), N all rows (the linears and attention); they
// differ only under sequence parallelism. Q, QS and F are this rank's widths.
namespace {
template <typename T>
struct BlockSteps {
  const ModelSpec& s;
  const ModelPartition& part;
  ParamStore<T>& p;
  int attn_norm, qkv_w, qkv_b, proj_w, mlp_norm, fc1_w, fc2_w;
  int64_t heads, groups, Nl, N;
  int64_t Q() const { return (heads + 2 * groups) * s.head_dim(); }
  int64_t QS() const { return heads * s.head_dim(); }
  int64_t F() const { return s.ffn_hidden_size / part.tp_size; }

  void norm1(BlockContext<T>& c) {
    Tensor h = new_tensor<T>({Nl, s.hidden_size});
    c.rstd1 = new_tensor<T>({Nl});
    rmsnorm_forward(ptr<T>(c.x), p.value(attn_norm), ptr<T>(h), ptr<T>(c.rstd1), Nl, s.hidden_size, s.norm_epsilon);
    c.h1 = gather_rows<T>(part, h);
  }
  void qkv(BlockContext<T>& c, int64_t seq, const T* cos, const T* sin) {
    c.qkv = new_tensor<T>({N, Q()});
    linear_forward(ptr<T>(c.h1), p.value(qkv_w), qkv_b >= 0 ? p.value(qkv_b) : static_cast<const T*>(nullptr),
                   ptr<T>(c.qkv), N, s.hidden_size, Q());
    // q heads and k heads are adjacent in the row: rotate them in one sweep.
    rope_apply(ptr<T>(c.qkv), N, Q(), heads + groups, s.head_dim(), seq, 0, cos, sin, false);
  }
  void attention(BlockContext<T>& c, const AttentionShape& shape) {
    c.attn = new_tensor<T>({N, QS()});
    c.lse = new_tensor<T>({shape.batch, shape.heads, shape.seq});
    attention_forward(ptr<T>(c.qkv), ptr<T>(c.attn), ptr<T>(c.lse), shape);
  }
  void proj(BlockContext<T>& c) {  // x2 = x + attn Wo^T
    c.x2 = row_parallel_residual<T>(part, c.attn, p.value(proj_w), c.x, N, QS(), s.hidden_size);
  }
  void norm2(BlockContext<T>& c) {
    Tensor h = new_tensor<T>({Nl, s.hidden_size});
    c.rstd2 = new_tensor<T>({Nl});
    rmsnorm_forward(ptr<T>(c.x2), p.value(mlp_norm), ptr<T>(h), ptr<T>(c.rstd2), Nl, s.hidden_size, s.norm_epsilon);
    c.h2 = gather_rows<T>(part, h);
  }
  void fc1(BlockContext<T>& c) {
    c.gate_up = new_tensor<T>({N, 2 * F()});
    linear_forward(ptr<T>(c.h2), p.value(fc1_w), static_cast<const T*>(nullptr), ptr<T>(c.gate_up), N,
                   s.hidden_size, 2 * F());
  }
  void swiglu(BlockContext<T>& c) {
    c.act = new_tensor<T>({N, F()});
    swiglu_forward(ptr<T>(c.gate_up), ptr<T>(c.act), N, F());
  }
  Tensor fc2(BlockContext<T>& c) {  // y = x2 + act W2^T
    return row_parallel_residual<T>(part, c.act, p.value(fc2_w), c.x2, N, F(), s.hidden_size);
  }
};
}  // namespace

#define STEPS                                                                                                    \
  BlockSteps<T> {                                                                                                \
    spec_, part_, p_, attn_norm_, qkv_w_, qkv_b_, proj_w_, mlp_norm_, fc1_w_, fc2_w_, heads_, groups_,           \
        ctx.x.size(0), batch * seq                                                                               \
  }

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
// full recompute, the dropped parts after selective recompute, nothing otherwise. Every tp rank
// runs the same steps, so the collectives inside them match.
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

// Under tensor parallelism the column-parallel linears' input gradients (dh1, dh2) are partial
// sums, reduced over tp before the norms; under sequence parallelism the output gradients of the
// row-parallel linears (dy, dx2) are first gathered to all rows.
template <typename T>
Tensor TransformerBlock<T>::backward_input(BlockContext<T>& ctx, const Tensor& dy, int64_t batch, int64_t seq,
                                           const T* cos, const T* sin) {
  PRIMUS_CHECK(ctx.x.defined(), "backward_input before forward");
  rebuild(ctx, batch, seq, cos, sin);
  const auto st = STEPS;
  const int64_t N = st.N, Nl = st.Nl, C = spec_.hidden_size, F = st.F(), Q = st.Q(), QS = st.QS();
  ctx.dy = gather_rows<T>(part_, dy);
  Tensor da = new_tensor<T>({N, F});
  linear_backward_input(ptr<T>(ctx.dy), p_.value(fc2_w_), ptr<T>(da), N, F, C);
  ctx.dgate_up = new_tensor<T>({N, 2 * F});
  swiglu_backward(ptr<T>(da), ptr<T>(ctx.gate_up), ptr<T>(ctx.dgate_up), N, F);
  Tensor dh2 = new_tensor<T>({N, C});
  linear_backward_input(ptr<T>(ctx.dgate_up), p_.value(fc1_w_), ptr<T>(dh2), N, C, 2 * F);
  ctx.dh2 = reduce_partial<T>(part_, dh2);
  Tensor dx2 = dy.clone();  // residual path
  rmsnorm_backward_input(ptr<T>(ctx.dh2), ptr<T>(ctx.x2), p_.value(mlp_norm_), ptr<T>(ctx.rstd2), ptr<T>(dx2), Nl, C,
                         true);
  ctx.dx2 = gather_rows<T>(part_, dx2);
  Tensor dattn = new_tensor<T>({N, QS});
  linear_backward_input(ptr<T>(ctx.dx2), p_.value(proj_w_), ptr<T>(dattn), N, QS, C);
  ctx.dqkv = new_tensor<T>({N, Q});
  attention_backward(ptr<T>(ctx.qkv), ptr<T>(ctx.attn), ptr<T>(ctx.lse), ptr<T>(dattn), ptr<T>(ctx.dqkv),
                     attention_shape(batch, seq));
  rope_apply(ptr<T>(ctx.dqkv), N, Q, heads_ + groups_, spec_.head_dim(), seq, 0, cos, sin, true);
  Tensor dh1 = new_tensor<T>({N, C});
  linear_backward_input(ptr<T>(ctx.dqkv), p_.value(qkv_w_), ptr<T>(dh1), N, C, Q);
  ctx.dh1 = reduce_partial<T>(part_, dh1);
  Tensor dx = dx2.clone();
  rmsnorm_backward_input(ptr<T>(ctx.dh1), ptr<T>(ctx.x), p_.value(attn_norm_), ptr<T>(ctx.rstd1), ptr<T>(dx), Nl, C,
                         true);
  // The W pass needs the linears' inputs and output gradients, and the norms' inputs.
  ctx.qkv = ctx.lse = ctx.gate_up = Tensor();
  return dx;
}

template <typename T>
void TransformerBlock<T>::backward_weight(BlockContext<T>& ctx) {
  PRIMUS_CHECK(ctx.dy.defined(), "backward_weight before backward_input");
  const int64_t Nl = ctx.x.size(0), N = ctx.dy.size(0), C = spec_.hidden_size, F = spec_.ffn_hidden_size / part_.tp_size,
                Q = (heads_ + 2 * groups_) * spec_.head_dim(), QS = heads_ * spec_.head_dim();
  linear_backward_weight(ptr<T>(ctx.dy), ptr<T>(ctx.act), p_.grad(fc2_w_), static_cast<T*>(nullptr), N, F, C);
  linear_backward_weight(ptr<T>(ctx.dgate_up), ptr<T>(ctx.h2), p_.grad(fc1_w_), static_cast<T*>(nullptr), N, C,
                         2 * F);
  rmsnorm_backward_weight(ptr<T>(ctx.dh2), ptr<T>(ctx.x2), ptr<T>(ctx.rstd2), p_.grad(mlp_norm_), Nl, C);
  linear_backward_weight(ptr<T>(ctx.dx2), ptr<T>(ctx.attn), p_.grad(proj_w_), static_cast<T*>(nullptr), N, QS,
                         C);
  linear_backward_weight(ptr<T>(ctx.dqkv), ptr<T>(ctx.h1), p_.grad(qkv_w_),
                         qkv_b_ >= 0 ? p_.grad(qkv_b_) : static_cast<T*>(nullptr), N, C, Q);
  rmsnorm_backward_weight(ptr<T>(ctx.dh1), ptr<T>(ctx.x), ptr<T>(ctx.rstd1), p_.grad(attn_norm_), Nl, C);
  ctx.clear();
}

template <typename T>
std::vector<int> TransformerBlock<T>::param_ids() const {
  std::vector<int> ids = {attn_norm_, qkv_w_, proj_w_, mlp_norm_, fc1_w_, fc2_w_};
  if (qkv_b_ >= 0) ids.push_back(qkv_b_);
  return ids;
}

// ---------------------------------------------------------------------------------------------
// Whole model

template <typename T>
LlamaModel<T>::LlamaModel(const ModelSpec& spec, LlamaOptions options, ModelPartition partition)
    : spec_(spec), opt_(options), part_(std::move(partition)) {
  spec_.validate();
  const int64_t C = spec_.hidden_size, V = spec_.vocab_size, L = spec_.num_layers;
  check_tensor_parallel(spec_, part_.tp_size);
  if (part_.tp_size > 1) {
    if (!part_.tp_group || part_.tp_group->size() != part_.tp_size)
      fail("tensor parallel size {} needs a tp group of that size", part_.tp_size);
    part_.tp_rank = part_.tp_group->rank();
  } else {
    part_.tp_rank = 0;
    part_.sequence_parallel = false;  // nothing to split with one rank
  }
  if (part_.chunks.empty()) part_.chunks.push_back({0, L, true, true});
  int embeddings = 0, heads = 0;
  for (const auto& ch : part_.chunks) {
    if (ch.first_layer < 0 || ch.num_layers < 0 || ch.first_layer + ch.num_layers > L)
      fail("model chunk with layers [{}, {}) is outside the {} layers of {}", ch.first_layer,
           ch.first_layer + ch.num_layers, L, spec_.name);
    embeddings += ch.has_embedding;
    heads += ch.has_head;
  }
  if (embeddings > 1 || heads > 1) fail("a rank can hold the embedding and the output layer at most once");

  vocab_local_ = V / part_.tp_size;
  vocab_start_ = vocab_local_ * part_.tp_rank;
  const ShardSpec vocab_shard =
      part_.tp_size > 1 ? ShardSpec{0, {{vocab_start_, vocab_local_}}} : ShardSpec{};
  if (embeddings)
    embedding_ = params_.add_sharded("embedding.word_embeddings.weight", {V, C}, vocab_shard, ParamInit::Normal, true);
  for (const auto& ch : part_.chunks) {
    const size_t begin = blocks_.size();
    for (int64_t l = ch.first_layer; l < ch.first_layer + ch.num_layers; ++l)
      blocks_.push_back(std::make_unique<TransformerBlock<T>>(spec_, l, params_, opt_.recompute, part_));
    chunk_blocks_.push_back({begin, blocks_.size()});
  }
  if (heads) {
    final_norm_ = params_.add("decoder.final_layernorm.weight", {C}, ParamInit::Ones, false);
    if (spec_.untie_embeddings_and_output_weights)
      output_ = params_.add_sharded("output_layer.weight", {V, C}, vocab_shard, ParamInit::Normal, true);
    else if (embedding_ >= 0)
      output_ = embedding_;
    else  // a last pipeline stage without the first: a replica of the tied embedding (see trainer)
      output_ = params_.add_sharded("embedding.word_embeddings.weight", {V, C}, vocab_shard, ParamInit::Normal, true);
  }
  params_.allocate();

  const int64_t half = spec_.head_dim() / 2, P = spec_.max_position_embeddings;
  rope_cos_ = new_tensor<T>({P, half});
  rope_sin_ = new_tensor<T>({P, half});
  rope_tables_of(spec_, P, ptr<T>(rope_cos_), ptr<T>(rope_sin_));
}

template <typename T>
void LlamaModel<T>::init_weights(uint64_t seed) {
  // Megatron: N(0, std) everywhere, output projections of each block scaled by 1/sqrt(2 layers).
  params_.init(seed, spec_.init_method_std, spec_.scaled_init_std());
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
  return size_t(rows) * size_t(vocab_local_) * sizeof(T) <= opt_.logits_memory_budget;
}

template <typename T>
void LlamaModel<T>::begin_microbatch(LlamaContext<T>& ctx, const int32_t* tokens, const int32_t* targets,
                                     int64_t batch, int64_t seq) {
  if (batch <= 0 || seq <= 0) fail("empty microbatch: batch {} x sequence {}", batch, seq);
  if (seq > spec_.max_position_embeddings)
    fail("sequence length {} exceeds max_position_embeddings {} of model {}", seq, spec_.max_position_embeddings,
         spec_.name);
  const int64_t N = batch * seq;
  if (part_.sequence_parallel && N % part_.tp_size != 0)
    fail("sequence parallel splits the {} tokens of a microbatch over {} tensor-parallel ranks: not divisible", N,
         part_.tp_size);
  ctx = LlamaContext<T>();
  ctx.batch = batch;
  ctx.seq = seq;
  if (tokens) ctx.tokens.assign(tokens, tokens + N);
  if (targets) ctx.targets.assign(targets, targets + N);
  ctx.blocks.resize(blocks_.size());
}

template <typename T>
int64_t LlamaModel<T>::activation_rows(int64_t batch, int64_t seq) const {
  return part_.sequence_parallel ? batch * seq / part_.tp_size : batch * seq;
}

template <typename T>
Tensor LlamaModel<T>::forward_chunk(LlamaContext<T>& ctx, int chunk, const Tensor& input) {
  PRIMUS_CHECK(chunk >= 0 && chunk < num_chunks(), "chunk {} of {}", chunk, num_chunks());
  const auto& ch = part_.chunks[chunk];
  const int64_t N = ctx.batch * ctx.seq, C = spec_.hidden_size, V = spec_.vocab_size;
  Tensor x;
  if (ch.has_embedding) {
    if (int64_t(ctx.tokens.size()) != N) fail("the first pipeline stage needs the microbatch's tokens");
    for (int64_t i = 0; i < N; ++i)
      if (ctx.tokens[i] < 0 || ctx.tokens[i] >= V)
        fail("token id {} at position {} is outside the vocabulary of {} entries", ctx.tokens[i], i, V);
    Tensor e = new_tensor<T>({N, C});
    if (part_.tp_size == 1) {
      embedding_forward(ctx.tokens.data(), params_.value(embedding_), ptr<T>(e), N, V, C);
    } else {  // vocabulary-parallel: rows of other ranks' tokens are zero, then summed over tp
      const T* table = params_.value(embedding_);
      T* out = ptr<T>(e);
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < N; ++i) {
        const int64_t t = ctx.tokens[i] - vocab_start_;
        if (t >= 0 && t < vocab_local_)
          std::copy(table + t * C, table + (t + 1) * C, out + i * C);
        else
          std::fill(out + i * C, out + (i + 1) * C, T(0));
      }
      e = reduce_partial<T>(part_, e);
    }
    x = ctx.embedded = e;
  } else {
    const int64_t rows = activation_rows(ctx.batch, ctx.seq);
    if (!input.defined() || input.dim() != 2 || input.size(0) != rows || input.size(1) != C)
      fail("pipeline chunk {} expects an input activation of [{}, {}]", chunk, rows, C);
    x = input;
  }
  const auto [b0, b1] = chunk_blocks_[chunk];
  for (size_t l = b0; l < b1; ++l)
    x = blocks_[l]->forward(ctx.blocks[l], x, ctx.batch, ctx.seq, ptr<T>(rope_cos_), ptr<T>(rope_sin_));
  if (!ch.has_head) return x;
  ctx.loss = head_forward(ctx.head, x, ctx.targets.empty() ? nullptr : ctx.targets.data());
  return Tensor();
}

template <typename T>
Tensor LlamaModel<T>::backward_input_chunk(LlamaContext<T>& ctx, int chunk, const Tensor& dy, T dloss) {
  PRIMUS_CHECK(chunk >= 0 && chunk < num_chunks(), "chunk {} of {}", chunk, num_chunks());
  const auto& ch = part_.chunks[chunk];
  Tensor dx;
  if (ch.has_head) {
    dx = head_backward_input(ctx.head, dloss);
  } else {
    const int64_t rows = activation_rows(ctx.batch, ctx.seq);
    if (!dy.defined() || dy.dim() != 2 || dy.size(0) != rows || dy.size(1) != spec_.hidden_size)
      fail("pipeline chunk {} expects an output gradient of [{}, {}]", chunk, rows, spec_.hidden_size);
    dx = dy;
  }
  const auto [b0, b1] = chunk_blocks_[chunk];
  for (size_t l = b1; l-- > b0;)
    dx = blocks_[l]->backward_input(ctx.blocks[l], dx, ctx.batch, ctx.seq, ptr<T>(rope_cos_), ptr<T>(rope_sin_));
  if (!ch.has_embedding) return dx;
  ctx.dembedded = dx;
  return Tensor();
}

template <typename T>
void LlamaModel<T>::backward_weight_chunk(LlamaContext<T>& ctx, int chunk) {
  PRIMUS_CHECK(chunk >= 0 && chunk < num_chunks(), "chunk {} of {}", chunk, num_chunks());
  const auto& ch = part_.chunks[chunk];
  if (ch.has_head) head_backward_weight(ctx.head);
  const auto [b0, b1] = chunk_blocks_[chunk];
  for (size_t l = b1; l-- > b0;) {
    blocks_[l]->backward_weight(ctx.blocks[l]);
    weights_done(blocks_[l]->param_ids());
  }
  if (ch.has_embedding) embedding_weight_pass(ctx);
}

// W of the embedding: under tensor parallelism only this rank's vocabulary rows.
template <typename T>
void LlamaModel<T>::embedding_weight_pass(LlamaContext<T>& ctx) {
  PRIMUS_CHECK(ctx.dembedded.defined(), "backward_weight before backward_input");
  const Tensor d = gather_rows<T>(part_, ctx.dembedded);
  const int64_t N = ctx.batch * ctx.seq, C = spec_.hidden_size;
  if (part_.tp_size == 1) {
    embedding_backward_weight(ctx.tokens.data(), ptr<T>(d), params_.grad(embedding_), N, spec_.vocab_size, C);
  } else {  // this rank's vocabulary rows only; threads own column blocks so repeated tokens never race
    T* g = params_.grad(embedding_);
    const T* src = ptr<T>(d);
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < C; j0 += 64)
      for (int64_t i = 0; i < N; ++i) {
        const int64_t t = ctx.tokens[i] - vocab_start_;
        if (t < 0 || t >= vocab_local_) continue;
        for (int64_t j = j0; j < std::min(C, j0 + 64); ++j) g[t * C + j] += src[i * C + j];
      }
  }
  ctx.dembedded = ctx.embedded = Tensor();
  weights_done({embedding_});
}

template <typename T>
T LlamaModel<T>::forward(LlamaContext<T>& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch,
                         int64_t seq) {
  PRIMUS_CHECK(num_chunks() == 1 && part_.chunks[0].has_embedding && part_.chunks[0].has_head,
               "forward() runs the whole model: use forward_chunk() on a pipeline stage");
  begin_microbatch(ctx, tokens, targets, batch, seq);
  forward_chunk(ctx, 0, Tensor());
  return ctx.loss;
}

// Per row of logits (this rank's vocabulary columns): the max, the sum of exp(z - max) and the
// target's logit when the target is one of this rank's columns. Combined over tp, they give the
// log-sum-exp of the whole row.
template <typename T>
T LlamaModel<T>::head_forward(HeadContext<T>& h, const Tensor& x, const int32_t* targets) {
  const int64_t Nl = x.size(0), C = spec_.hidden_size, V = spec_.vocab_size, Vl = vocab_local_, v0 = vocab_start_;
  h = HeadContext<T>();
  h.x = x;
  Tensor hn = new_tensor<T>({Nl, C});
  h.rstd = new_tensor<T>({Nl});
  rmsnorm_forward(ptr<T>(x), params_.value(final_norm_), ptr<T>(hn), ptr<T>(h.rstd), Nl, C, spec_.norm_epsilon);
  h.hn = gather_rows<T>(part_, hn);
  if (!targets) return T(0);  // inference: keep hn for last_logits()
  const int64_t N = h.hn.size(0);
  h.targets = targets;
  for (int64_t i = 0; i < N; ++i) {
    if (targets[i] >= V) fail("target token id {} at position {} is outside the vocabulary of {}", targets[i], i, V);
    h.valid += targets[i] >= 0;
  }
  h.lse = new_tensor<T>({N});
  T* lse = ptr<T>(h.lse);
  const T* W = output_weight();
  const T* hn_all = ptr<T>(h.hn);
  std::vector<T> m(N, -std::numeric_limits<T>::infinity()), s(N, T(0)), zt(N, T(0));
  auto local_target = [&](int64_t i) -> int64_t {
    const int64_t t = int64_t(targets[i]) - v0;
    return targets[i] >= 0 && t >= 0 && t < Vl ? t : -1;
  };

  if (head_stores_logits(N)) {
    // One GEMM for all logits; each row becomes exp(z - max) now, softmax - onehot below.
    h.dlogits = new_tensor<T>({N, Vl});
    T* z = ptr<T>(h.dlogits);
    gemm<T>(false, true, N, Vl, C, T(1), hn_all, C, W, C, T(0), z, Vl);
#pragma omp parallel for schedule(static) if(N * Vl >= (1 << 15))
    for (int64_t i = 0; i < N; ++i) {
      T* zi = z + i * Vl;
      T mx = zi[0];
#pragma omp simd reduction(max : mx)
      for (int64_t j = 1; j < Vl; ++j) mx = std::max(mx, zi[j]);
      const int64_t t = local_target(i);
      if (t >= 0) zt[i] = zi[t];
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < Vl; ++j) sum += (zi[j] = fast_exp(zi[j] - mx));
      m[i] = mx;
      s[i] = sum;
    }
  } else {
    // Vocabulary chunks with an online log-sum-exp: memory N * vocab_chunk, never N * V.
    const int64_t VC = std::min(opt_.vocab_chunk, Vl);
    Tensor zbuf = new_tensor<T>({N, VC});
    T* z = ptr<T>(zbuf);
    for (int64_t c0 = 0; c0 < Vl; c0 += VC) {
      const int64_t vc = std::min(VC, Vl - c0);
      gemm<T>(false, true, N, vc, C, T(1), hn_all, C, W + c0 * C, C, T(0), z, vc);
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
        const int64_t t = local_target(i);
        if (t >= c0 && t < c0 + vc) zt[i] = zi[t - c0];
      }
    }
  }
  std::vector<T> gm = m;  // the row max over all of tp
  if (part_.tp_size > 1) {
    auto& g = *part_.tp_group;
    g.all_reduce(gm.data(), N, comm_t<T>, parallel::ReduceOp::Max);
    for (int64_t i = 0; i < N; ++i) s[i] *= std::exp(m[i] - gm[i]);
    g.all_reduce(s.data(), N, comm_t<T>, parallel::ReduceOp::Sum);
    g.all_reduce(zt.data(), N, comm_t<T>, parallel::ReduceOp::Sum);
  }
  double total = 0;
  for (int64_t i = 0; i < N; ++i) {
    lse[i] = gm[i] + std::log(s[i]);
    if (targets[i] >= 0) total += double(lse[i] - zt[i]);
  }
  if (h.dlogits.defined()) {
    T* z = ptr<T>(h.dlogits);
#pragma omp parallel for schedule(static) if(N * Vl >= (1 << 15))
    for (int64_t i = 0; i < N; ++i) {
      T* zi = z + i * Vl;
      if (targets[i] < 0) {
        std::fill(zi, zi + Vl, T(0));
        continue;
      }
      const T f = std::exp(m[i] - lse[i]);  // exp(z - m) * f = softmax
#pragma omp simd
      for (int64_t j = 0; j < Vl; ++j) zi[j] *= f;
      const int64_t t = local_target(i);
      if (t >= 0) zi[t] -= T(1);
    }
  }
  return h.valid ? T(total / double(h.valid)) : T(0);
}

// Chunked mode: recomputes one chunk's logits (local columns c0..c0+vc) as softmax - onehot.
template <typename T>
static void chunk_dlogits(const HeadContext<T>& h, const T* W, T* z, int64_t c0, int64_t vc, int64_t v0, int64_t N,
                          int64_t C) {
  gemm<T>(false, true, N, vc, C, T(1), ptr<T>(h.hn), C, W + c0 * C, C, T(0), z, vc);
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
    const int64_t tl = int64_t(t) - v0 - c0;
    if (tl >= 0 && tl < vc) zi[tl] -= T(1);
  }
}

template <typename T>
Tensor LlamaModel<T>::head_backward_input(HeadContext<T>& h, T dloss) {
  PRIMUS_CHECK(h.lse.defined(), "head backward without a forward that had targets");
  const int64_t Nl = h.x.size(0), N = h.hn.size(0), C = spec_.hidden_size, Vl = vocab_local_;
  h.grad_scale = h.valid ? dloss / T(h.valid) : T(0);
  Tensor dhn = new_tensor<T>({N, C});
  const T* W = output_weight();
  if (h.dlogits.defined()) {
    gemm<T>(false, false, N, C, Vl, h.grad_scale, ptr<T>(h.dlogits), Vl, W, C, T(0), ptr<T>(dhn), C);
  } else {
    dhn.zero_();
    const int64_t VC = std::min(opt_.vocab_chunk, Vl);
    Tensor zbuf = new_tensor<T>({N, VC});
    for (int64_t c0 = 0; c0 < Vl; c0 += VC) {
      const int64_t vc = std::min(VC, Vl - c0);
      chunk_dlogits(h, W, ptr<T>(zbuf), c0, vc, vocab_start_, N, C);
      gemm<T>(false, false, N, C, vc, h.grad_scale, ptr<T>(zbuf), vc, W + c0 * C, C, T(1), ptr<T>(dhn), C);
    }
  }
  h.dhn = reduce_partial<T>(part_, dhn);
  Tensor dx = new_tensor<T>({Nl, C});
  rmsnorm_backward_input(ptr<T>(h.dhn), ptr<T>(h.x), params_.value(final_norm_), ptr<T>(h.rstd), ptr<T>(dx), Nl, C,
                         false);
  return dx;
}

template <typename T>
void LlamaModel<T>::head_backward_weight(HeadContext<T>& h) {
  PRIMUS_CHECK(h.dhn.defined(), "head backward_weight before backward_input");
  const int64_t Nl = h.x.size(0), N = h.hn.size(0), C = spec_.hidden_size, Vl = vocab_local_;
  rmsnorm_backward_weight(ptr<T>(h.dhn), ptr<T>(h.x), ptr<T>(h.rstd), params_.grad(final_norm_), Nl, C);
  T* gW = output_weight_grad();
  if (h.dlogits.defined()) {
    gemm<T>(true, false, Vl, C, N, h.grad_scale, ptr<T>(h.dlogits), Vl, ptr<T>(h.hn), C, T(1), gW, C);
  } else {
    const int64_t VC = std::min(opt_.vocab_chunk, Vl);
    Tensor zbuf = new_tensor<T>({N, VC});
    for (int64_t c0 = 0; c0 < Vl; c0 += VC) {
      const int64_t vc = std::min(VC, Vl - c0);
      chunk_dlogits(h, output_weight(), ptr<T>(zbuf), c0, vc, vocab_start_, N, C);
      gemm<T>(true, false, vc, C, N, h.grad_scale, ptr<T>(zbuf), vc, ptr<T>(h.hn), C, T(1), gW + c0 * C, C);
    }
  }
  h = HeadContext<T>();
  weights_done({final_norm_, output_});
}

template <typename T>
void LlamaModel<T>::backward_input(LlamaContext<T>& ctx, T dloss) {
  backward_input_chunk(ctx, 0, Tensor(), dloss);
}

template <typename T>
void LlamaModel<T>::backward_weight(LlamaContext<T>& ctx) {
  backward_weight_chunk(ctx, 0);
}

// B then W block by block: each block's saved activations are freed as soon as its W is done.
template <typename T>
void LlamaModel<T>::backward(LlamaContext<T>& ctx, T dloss) {
  PRIMUS_CHECK(num_chunks() == 1 && part_.chunks[0].has_embedding && part_.chunks[0].has_head,
               "backward() runs the whole model: use the chunk passes on a pipeline stage");
  Tensor dx = head_backward_input(ctx.head, dloss);
  head_backward_weight(ctx.head);
  for (size_t l = blocks_.size(); l-- > 0;) {
    dx = blocks_[l]->backward_input(ctx.blocks[l], dx, ctx.batch, ctx.seq, ptr<T>(rope_cos_), ptr<T>(rope_sin_));
    blocks_[l]->backward_weight(ctx.blocks[l]);
    weights_done(blocks_[l]->param_ids());
  }
  ctx.dembedded = dx;
  embedding_weight_pass(ctx);
}

template <typename T>
Tensor LlamaModel<T>::last_logits(LlamaContext<T>& ctx) const {
  PRIMUS_CHECK(ctx.head.hn.defined(), "last_logits before forward");
  PRIMUS_CHECK(part_.tp_size == 1, "last_logits runs on one rank");
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
