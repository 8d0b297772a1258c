#include "model/llama.h"
#include "model/llama_held.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "kernels/softcap.h"
#include "model/context_parallel.h"
#include "model/rope.h"

namespace primus {

DType activation_dtype(Precision p) {
  return p == Precision::Bf16 ? DType::BF16 : p == Precision::Fp64 ? DType::F64 : DType::F32;
}
DType master_dtype(Precision p) { return p == Precision::Fp64 ? DType::F64 : DType::F32; }
const char* precision_name(Precision p) {
  return p == Precision::Bf16 ? "bf16 mixed precision" : p == Precision::Fp64 ? "fp64" : "fp32";
}

void check_tensor_parallel(const ModelSpec& spec, int tp) {
  if (tp < 1) fail("tensor_model_parallel_size must be at least 1, got {}", tp);
  if (tp == 1) return;
  auto need = [&](int64_t value, const char* what) {
    if (value % tp != 0)
      fail("{} ({}) of model {} must be divisible by tensor_model_parallel_size ({})", what, value, spec.name, tp);
  };
  need(spec.num_attention_heads, "num_attention_heads");
  if (!spec.multi_latent_attention) need(spec.query_groups(), "num_query_groups");  // MLA has no groups
  need(spec.ffn_hidden_size, "ffn_hidden_size");
  need(spec.vocab_size, "vocab_size");
}

// The model's own buffers (resident weights): always there.
class LlamaModel::ResidentWeights final : public WeightSource {
 public:
  explicit ResidentWeights(LlamaModel& m) : m_(m) {}
  void acquire(int, int) override {}
  void release(int) override {}
  Tensor weights(int unit) override {
    const WeightUnit& u = m_.units_[unit];
    return m_.work_.slice(0, u.begin, u.end - u.begin);
  }
  Tensor grads(int unit) override {
    const WeightUnit& u = m_.units_[unit];
    return m_.params_.grads().slice(0, u.begin, u.end - u.begin);
  }
  Tensor buffer(int param) override {
    const StoredParam& p = m_.params_.infos()[size_t(param)];
    return m_.params_.values().slice(0, p.offset, p.numel);
  }

 private:
  LlamaModel& m_;
};

// A pass's microbatch dropout key in the linears for the pass's length (model/linears.h).
class LlamaModel::Dropout {
 public:
  Dropout(const LlamaModel& m, const LlamaContext& ctx) : l_(*m.linears_) { l_.set_dropout_key(ctx.dropout_key); }
  ~Dropout() { l_.set_dropout_key(std::nullopt); }
  Dropout(const Dropout&) = delete;
  Dropout& operator=(const Dropout&) = delete;

 private:
  Linears& l_;
};

// The parts' view of the weights: the model's units, wherever the weight source keeps them.
class LlamaModel::Params final : public ParamAccess {
 public:
  explicit Params(const LlamaModel& m) : m_(m) {}
  Tensor weight(int id) const override { return m_.w(id); }
  Tensor grad(int id) const override { return m_.g(id); }
  Tensor master(int id) const override { return m_.source().buffer(id); }

 private:
  const LlamaModel& m_;
};

std::vector<int> LlamaModel::Block::base_ids() const {
  std::vector<int> v = {attn_norm};
  for (int id : attention->param_ids()) v.push_back(id);
  v.push_back(mlp_norm);
  for (int id : feed_forward->param_ids()) v.push_back(id);
  return v;
}

std::vector<int> LlamaModel::Block::ids() const {
  std::vector<int> v = base_ids();
  v.insert(v.end(), adapters.begin(), adapters.end());
  return v;
}

// ---------------------------------------------------------------------------------------------
// Construction: registration in model order (embedding, blocks, head), so that every precision,
// device and layout shares names, shapes and, with one rank, offsets.

LlamaModel::LlamaModel(const ModelSpec& spec, ops::Backend& backend, Precision precision, LlamaOptions options,
                       ModelPartition partition)
    : spec_(spec),
      be_(backend),
      precision_(precision),
      act_(primus::activation_dtype(precision)),
      stat_(ops::stat_dtype(act_)),
      opt_(options),
      part_(std::move(partition)),
      params_(master_dtype(precision)) {
  spec_.validate();
  if (!be_.computes_in(act_))
    fail("the {} backend does not compute in {}: {} needs another backend", be_.name(), dtype_name(act_),
         precision_name(precision_));
  if (opt_.vocab_chunk <= 0) fail("vocab_chunk must be positive, got {}", opt_.vocab_chunk);
  check_partition();
  tp_rows_ = {&be_, part_.tp_size > 1 ? part_.tp_group : nullptr, part_.sequence_parallel};
  param_access_ = std::make_unique<Params>(*this);
  linears_ = std::make_unique<Linears>(be_, act_, opt_.fp8, spec_.num_layers, opt_.lora);
  linears_->set_params(param_access_.get());
  kit_ = std::make_unique<PartKit>(PartKit{spec_, be_, act_, stat_, part_, tp_rows_, *param_access_, *linears_});
  attention_parts_ = std::make_unique<AttentionParts>(*kit_);
  feed_forward_parts_ = std::make_unique<FeedForwardParts>(*kit_);
  register_parameters();
  if (opt_.resident_weights) {
    params_.allocate(be_.device());
    work_ = act_ == params_.dtype() ? params_.values() : be_.zeros({params_.numel()}, act_);
    resident_ = std::make_unique<ResidentWeights>(*this);
    source_ = resident_.get();
  }
}

// The partition's groups and chunks: sizes that match, on the backend's device.
void LlamaModel::check_partition() {
  check_tensor_parallel(spec_, part_.tp_size);
  if (part_.tp_size > 1) {
    if (!part_.tp_group || part_.tp_group->size() != part_.tp_size)
      fail("tensor parallel size {} needs a tp group of that size", part_.tp_size);
    if (part_.tp_group->device() != be_.device())
      fail("the tensor-parallel group {} moves {} buffers but the model computes on the {}",
           part_.tp_group->describe(), device_name(part_.tp_group->device()), device_name(be_.device()));
    part_.tp_rank = part_.tp_group->rank();
  } else {
    part_.tp_rank = 0;
    part_.sequence_parallel = false;  // nothing to split with one rank
  }
  if (part_.cp_size < 1) fail("context parallel size must be at least 1, got {}", part_.cp_size);
  part_.cp_rank = part_.cp_size > 1 && part_.cp_group ? part_.cp_group->rank() : 0;
  const int64_t L = spec_.num_layers;
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
}

// Registration in model order (embedding, blocks, head), so that every precision, device and
// layout shares names, shapes and, with one rank, offsets; then the weight units.
void LlamaModel::register_parameters() {
  const int64_t C = spec_.hidden_size, V = spec_.vocab_size;
  bool embedding = false, head = false;
  for (const auto& ch : part_.chunks) embedding |= ch.has_embedding, head |= ch.has_head;
  vocab_local_ = V / part_.tp_size;
  vocab_start_ = vocab_local_ * part_.tp_rank;
  const ShardSpec vocab_shard = part_.tp_size > 1 ? ShardSpec{0, {{vocab_start_, vocab_local_}}} : ShardSpec{};
  if (embedding)
    embedding_ = params_.add_sharded("embedding.word_embeddings.weight", {V, C}, vocab_shard, ParamInit::Normal, true);
  for (const auto& ch : part_.chunks) {
    const size_t begin = blocks_.size();
    for (int64_t l = ch.first_layer; l < ch.first_layer + ch.num_layers; ++l) {
      const std::string pre = fmt::format("decoder.layers.{}.", l);
      Block b;
      b.attn_norm = params_.add(pre + "input_layernorm.weight", {C}, ParamInit::Ones, false);
      b.attention = attention_parts_->make(params_, l);
      b.mlp_norm = params_.add(pre + "pre_mlp_layernorm.weight", {C}, ParamInit::Ones, false);
      b.feed_forward = feed_forward_parts_->make(params_, l);
      blocks_.push_back(std::move(b));
    }
    chunk_blocks_.push_back({begin, blocks_.size()});
  }
  if (head) {
    final_norm_ = params_.add("decoder.final_layernorm.weight", {C}, ParamInit::Ones, false);
    if (spec_.untie_embeddings_and_output_weights)
      output_ = params_.add_sharded("output_layer.weight", {V, C}, vocab_shard, ParamInit::Normal, true);
    else if (embedding_ >= 0)
      output_ = embedding_;
    else  // a last pipeline stage without the first: a replica of the tied embedding (see trainer)
      output_ = params_.add_sharded("embedding.word_embeddings.weight", {V, C}, vocab_shard, ParamInit::Normal, true);
    linears_->declare_output(output_, params_.infos()[size_t(output_)].name);
    register_mtp();
  }
  // LoRA: the adapters after every frozen tensor, so that the trainable ones are one flat range.
  const std::vector<int> adapters = linears_->add_adapters(params_);
  if (!adapters.empty()) {
    first_trainable_ = adapters.front();
    trainable_begin_ = params_.infos()[size_t(first_trainable_)].offset;
    for (Block& b : blocks_) b.adapters = linears_->adapters_of(b.base_ids());
    for (MtpDepth& d : mtp_) d.layer.adapters = linears_->adapters_of(d.layer.base_ids());
  } else if (opt_.lora.enabled) {
    fail("lora.target_modules names no linear of this model's layers on this rank");
  }
  // Units in parameter order: the embedding, each block, the head (with a tied embedding that this
  // rank also uses as input, the head's output layer is the embedding's unit), the adapters.
  unit_of_.assign(params_.infos().size(), -1);
  const auto add_unit = [&](int first, int last) {
    for (int p = first; p <= last; ++p) unit_of_[p] = int(units_.size());
    const auto& in = params_.infos();
    units_.push_back({first, last, in[first].offset, in[last].offset + in[last].numel});
  };
  if (embedding_ >= 0) add_unit(embedding_, embedding_);
  for (const Block& b : blocks_) {  // a block's parameters are registered together
    const std::vector<int> ids = b.base_ids();
    add_unit(b.attn_norm, *std::max_element(ids.begin(), ids.end()));
  }
  if (head) add_unit(final_norm_, output_ == embedding_ ? final_norm_ : output_);
  for (size_t k = 0; k < mtp_.size(); ++k) {  // a depth's tensors (depth 0's with an embedding replica first)
    const int first = k == 0 && mtp_embedding_ > output_ ? mtp_embedding_ : mtp_[k].enorm;
    add_unit(first, mtp_[k].final_norm);
  }
  if (!adapters.empty()) add_unit(adapters.front(), adapters.back());
  for (size_t p = 0; p < unit_of_.size(); ++p) PRIMUS_CHECK(unit_of_[p] >= 0, "parameter {} in no unit", p);
}

LlamaModel::~LlamaModel() = default;

void LlamaModel::init_weights(uint64_t seed) {
  PRIMUS_CHECK(opt_.resident_weights, "init_weights on a model whose weights live in a weight source");
  params_.init(seed, spec_.init_method_std, spec_.scaled_init_std());
  sync_working_weights();
}

void LlamaModel::sync_working_weights() {
  PRIMUS_CHECK(opt_.resident_weights, "sync_working_weights on a model whose weights live in a weight source");
  if (has_separate_working_weights()) be_.cast(params_.values(), work_);
}

void LlamaModel::set_weight_source(WeightSource* source) {
  if (!source && !resident_) fail("a model without resident weights needs a weight source");
  source_ = source ? source : resident_.get();
}

Tensor LlamaModel::w(int id) const {
  const StoredParam& p = params_.infos()[id];
  const int u = unit_of_[id];
  return source().weights(u).slice(0, p.offset - units_[u].begin, p.numel).view(p.shape);
}

Tensor LlamaModel::g(int id) const {
  const StoredParam& p = params_.infos()[id];
  const int u = unit_of_[id];
  return source().grads(u).slice(0, p.offset - units_[u].begin, p.numel).view(p.shape);
}

void LlamaModel::sum_over_context(double& total, int64_t& valid) const {
  if (part_.cp_size == 1) return;
  std::vector<double> v = {total, double(valid)};
  part_.cp_group->all_reduce(v);
  total = v[0];
  valid = int64_t(v[1]);
}

bool head_keeps_logits(const LlamaOptions& options, Precision precision, int64_t rows, int64_t vocab_local) {
  const DType act = activation_dtype(precision), stat = ops::stat_dtype(act);
  const size_t per = dtype_size(stat) + (act != stat ? dtype_size(act) : 0);  // logits, and a bf16 gradient
  return size_t(rows) * size_t(vocab_local) * per <= options.logits_memory_budget ||
         fp8_head_needs_whole_logits(options.fp8, options.vocab_chunk);
}

bool LlamaModel::head_stores_logits(int64_t rows) const {
  return head_keeps_logits(opt_, precision_, rows, vocab_local_);
}

int64_t LlamaModel::activation_rows(int64_t batch, int64_t seq) const {
  return part_.sequence_parallel ? batch * seq / part_.tp_size : batch * seq;
}

// ---------------------------------------------------------------------------------------------
// Tensor-parallel collectives

// See model/tensor_parallel_rows.h.
Tensor LlamaModel::gather_rows(const Tensor& local) const { return tp_rows_.gather(local); }
Tensor LlamaModel::reduce_partial(Tensor partial) const { return tp_rows_.reduce(std::move(partial)); }

// ---------------------------------------------------------------------------------------------
// Transformer block: norm -> attention -> residual -> norm -> feed-forward -> residual. The parts
// (model/block_part.h) do everything between the norms and the residuals; every tp rank runs the
// same steps, so the collectives inside them match.

Tensor LlamaModel::block_forward(const Block& b, BlockContext& c, const Tensor& x, const PassShape& m) {
  c = BlockContext();
  c.x = x;
  c.attention = b.attention->new_context();
  c.feed_forward = b.feed_forward->new_context();
  Tensor h1 = kit_->norm(x, b.attn_norm, c.rstd1);
  c.x2 = b.attention->forward(*c.attention, h1, x, m, true);
  Tensor h2 = kit_->norm(c.x2, b.mlp_norm, c.rstd2);
  Tensor y = b.feed_forward->forward(*c.feed_forward, h2, c.x2, m, true);
  if (opt_.recompute != Recompute::None) {  // the parts keep what their recompute needs
    c.rstd1 = c.rstd2 = Tensor();
    if (opt_.recompute == Recompute::Full) c.x2 = Tensor();  // only the block input stays
    b.attention->drop(*c.attention, opt_.recompute);
    b.feed_forward->drop(*c.feed_forward, opt_.recompute);
  }
  return y;
}

// After recompute dropped them: the norms and whatever each part let go, in forward order.
void LlamaModel::block_rebuild(const Block& b, BlockContext& c, const PassShape& m) {
  if (c.rstd1.defined()) return;  // nothing was dropped
  const Tensor h1 = kit_->norm(c.x, b.attn_norm, c.rstd1);
  const bool want_x2 = !c.x2.defined();
  Tensor x2 = b.attention->forward(*c.attention, h1, c.x, m, want_x2);
  if (want_x2) c.x2 = x2;
  const Tensor h2 = kit_->norm(c.x2, b.mlp_norm, c.rstd2);
  b.feed_forward->forward(*c.feed_forward, h2, c.x2, m, false);
}

// dy and the returned dx are this rank's rows (under sequence parallelism N / tp); the parts
// gather and reduce around their linears themselves.
Tensor LlamaModel::block_backward_input(const Block& b, BlockContext& c, const Tensor& dy, const PassShape& m) {
  PRIMUS_CHECK(c.x.defined(), "backward_input before forward");
  block_rebuild(b, c, m);
  const int64_t Nl = c.x.size(0), C = spec_.hidden_size;
  const Tensor dh2 = b.feed_forward->backward_input(*c.feed_forward, dy, m);
  Tensor dx2 = act({Nl, C});  // dy through the residual, plus the norm's gradient
  be_.rmsnorm_backward_input(dh2, c.x2, w(b.mlp_norm), c.rstd2, dy, dx2);
  c.gn2.compute(be_, dh2, c.x2, c.rstd2);
  const Tensor dh1 = b.attention->backward_input(*c.attention, dx2, m);
  Tensor dx = act({Nl, C});
  be_.rmsnorm_backward_input(dh1, c.x, w(b.attn_norm), c.rstd1, dx2, dx);
  c.gn1.compute(be_, dh1, c.x, c.rstd1);
  c.x = c.x2 = c.rstd1 = c.rstd2 = Tensor();  // W reads what the parts keep and gn1, gn2
  return dx;
}

void LlamaModel::block_backward_weight(const Block& b, BlockContext& c) {
  PRIMUS_CHECK(c.gn1.defined(), "backward_weight before backward_input");
  b.feed_forward->backward_weight(*c.feed_forward);
  c.gn2.add_to(be_, g(b.mlp_norm));
  b.attention->backward_weight(*c.attention);
  c.gn1.add_to(be_, g(b.attn_norm));
  c = BlockContext();
}

// ---------------------------------------------------------------------------------------------
// Microbatches and chunks

void LlamaModel::begin_microbatch(LlamaContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch,
                                  int64_t seq, const PackedDocuments* docs) const {
  if (batch <= 0 || seq <= 0) fail("empty microbatch: batch {} x sequence {}", batch, seq);
  if (part_.cp_size > 1 && seq % 2 != 0)
    fail("context parallelism gives each rank two equal chunks of every sequence: its {} tokens per sequence are "
         "odd",
         seq);
  if (seq * part_.cp_size > spec_.max_position_embeddings)
    fail("sequence length {} exceeds max_position_embeddings {} of model {}", seq * part_.cp_size,
         spec_.max_position_embeddings, spec_.name);
  const int64_t N = batch * seq, V = spec_.vocab_size;
  if (part_.sequence_parallel && N % part_.tp_size != 0)
    fail("sequence parallel splits the {} tokens of a microbatch over {} tensor-parallel ranks: not divisible", N,
         part_.tp_size);
  ctx = LlamaContext();
  ctx.batch = batch;
  ctx.seq = seq;
  if (tokens) {
    ctx.tokens.assign(tokens, tokens + N);
    ctx.shard_tokens.resize(N);
    for (int64_t i = 0; i < N; ++i) {
      if (tokens[i] < 0 || tokens[i] >= V)
        fail("token id {} at position {} is outside the vocabulary of {} entries", tokens[i], i, V);
      const int64_t t = tokens[i] - vocab_start_;
      ctx.shard_tokens[i] = t >= 0 && t < vocab_local_ ? int32_t(t) : -1;
    }
    Tensor tk = Tensor::empty({N}, DType::I32);
    std::copy(ctx.shard_tokens.begin(), ctx.shard_tokens.end(), tk.data<int32_t>());
    ctx.shard_tokens_dev = tk.to(be_.device());
  }
  if (targets) {
    ctx.targets.assign(targets, targets + N);
    for (int64_t i = 0; i < N; ++i) {
      if (targets[i] >= V) fail("target token id {} at position {} is outside the vocabulary of {}", targets[i], i, V);
      ctx.valid += targets[i] >= 0;
    }
    Tensor tg = Tensor::empty({N}, DType::I32);
    std::copy(targets, targets + N, tg.data<int32_t>());
    ctx.targets_dev = tg.to(be_.device());
  }
  if (docs) ctx.docs = document_rows(*docs, batch, seq, part_.cp_size, part_.cp_rank, be_.device());
  ctx.dropout_key = dropout_key_;
  if (spec_.attention_chunk_size > 0)
    ctx.chunked_docs = document_rows(docs ? *docs : PackedDocuments(), batch, seq, part_.cp_size, part_.cp_rank,
                                     be_.device(), spec_.attention_chunk_size);
  ctx.blocks.resize(blocks_.size());
  if (tokens && targets) mtp_begin(ctx);
}

Tensor LlamaModel::forward_chunk(LlamaContext& ctx, int chunk, const Tensor& input) {
  PRIMUS_CHECK(chunk >= 0 && chunk < num_chunks(), "chunk {} of {}", chunk, num_chunks());
  const auto& ch = part_.chunks[chunk];
  const Dropout dropout(*this, ctx);
  const int64_t N = ctx.batch * ctx.seq, C = spec_.hidden_size;
  const auto [b0, b1] = chunk_blocks_[chunk];
  const int head_unit = ch.has_head ? unit_of_[final_norm_] : -1;
  auto next_unit = [&](size_t l) { return l < b1 ? block_unit(l) : head_unit; };  // forward order
  Tensor x;
  if (ch.has_embedding) {
    if (int64_t(ctx.tokens.size()) != N) fail("the first pipeline stage needs the microbatch's tokens");
    // Vocabulary-parallel: rows of other ranks' tokens are zero here, then summed over tp.
    const Held held(*this, {embedding_}, next_unit(b0));
    Tensor e = act({N, C});
    be_.embedding_forward(ctx.shard_tokens_dev, w(embedding_), e);
    x = ctx.embedded = reduce_partial(e);
  } else {
    const int64_t rows = activation_rows(ctx.batch, ctx.seq);
    if (!input.defined() || input.dim() != 2 || input.size(0) != rows || input.size(1) != C || input.dtype() != act_)
      fail("pipeline chunk {} expects an input activation of {} [{}, {}]", chunk, dtype_name(act_), rows, C);
    x = input;
  }
  for (size_t l = b0; l < b1; ++l) {
    const Held held(*this, {blocks_[l].attn_norm}, next_unit(l + 1));
    x = block_forward(blocks_[l], ctx.blocks[l], x, ctx.pass_shape());
  }
  if (!ch.has_head) return x;
  {
    const Held held(*this, {final_norm_, output_}, -1);
    ctx.loss = head_forward(ctx.head, final_norm_, x, ctx.targets_dev, !ctx.targets.empty(), ctx.valid);
  }
  mtp_forward(ctx);
  return Tensor();
}

Tensor LlamaModel::backward_input_chunk(LlamaContext& ctx, int chunk, const Tensor& dy, double dloss) {
  PRIMUS_CHECK(chunk >= 0 && chunk < num_chunks(), "chunk {} of {}", chunk, num_chunks());
  const auto& ch = part_.chunks[chunk];
  const Dropout dropout(*this, ctx);
  const auto [b0, b1] = chunk_blocks_[chunk];
  auto previous_unit = [&](size_t l) { return l > b0 ? block_unit(l - 1) : -1; };  // backward order
  Tensor dx;
  if (ch.has_head) {
    const Tensor dmtp = mtp_backward_input(ctx, dloss);
    const Held held(*this, {final_norm_, output_}, previous_unit(b1));
    dx = head_backward_input(ctx.head, dloss, ctx.valid, dmtp);
  } else {
    const int64_t rows = activation_rows(ctx.batch, ctx.seq);
    if (!dy.defined() || dy.dim() != 2 || dy.size(0) != rows || dy.size(1) != spec_.hidden_size || dy.dtype() != act_)
      fail("pipeline chunk {} expects an output gradient of {} [{}, {}]", chunk, dtype_name(act_), rows,
           spec_.hidden_size);
    dx = dy;
  }
  for (size_t l = b1; l-- > b0;) {
    const Held held(*this, {blocks_[l].attn_norm}, previous_unit(l));
    dx = block_backward_input(blocks_[l], ctx.blocks[l], dx, ctx.pass_shape(dloss));
  }
  if (!ch.has_embedding) return dx;
  ctx.dembedded = dx;
  ctx.embedded = Tensor();  // block 0's input: B was its last reader
  return Tensor();
}

void LlamaModel::backward_weight_chunk(LlamaContext& ctx, int chunk) {
  PRIMUS_CHECK(chunk >= 0 && chunk < num_chunks(), "chunk {} of {}", chunk, num_chunks());
  const auto& ch = part_.chunks[chunk];
  const Dropout dropout(*this, ctx);
  if (ch.has_head) head_weight_pass(ctx);
  const auto [b0, b1] = chunk_blocks_[chunk];
  for (size_t l = b1; l-- > b0;) {
    block_backward_weight(blocks_[l], ctx.blocks[l]);
    weights_done(blocks_[l].ids());
  }
  if (ch.has_embedding) embedding_weight_pass(ctx);
}

// W of the embedding: under tensor parallelism only this rank's vocabulary rows.
void LlamaModel::embedding_weight_pass(LlamaContext& ctx) {
  PRIMUS_CHECK(ctx.dembedded.defined(), "backward_weight before backward_input");
  Tensor ge = g(embedding_);
  if (!frozen_base()) be_.embedding_backward(ctx.shard_tokens, gather_rows(ctx.dembedded), ge);
  ctx.dembedded = ctx.embedded = Tensor();
  weights_done({embedding_});
}

double LlamaModel::forward(LlamaContext& ctx, const int32_t* tokens, const int32_t* targets, int64_t batch,
                           int64_t seq, const PackedDocuments* docs) {
  PRIMUS_CHECK(num_chunks() == 1 && part_.chunks[0].has_embedding && part_.chunks[0].has_head,
               "forward() runs the whole model: use forward_chunk() on a pipeline stage");
  begin_microbatch(ctx, tokens, targets, batch, seq, docs);
  forward_chunk(ctx, 0, Tensor());
  return ctx.loss;
}

void LlamaModel::backward_input(LlamaContext& ctx, double dloss) { backward_input_chunk(ctx, 0, Tensor(), dloss); }

void LlamaModel::backward_weight(LlamaContext& ctx) { backward_weight_chunk(ctx, 0); }

// B then W block by block: each block's saved activations are freed as soon as its W is done.
void LlamaModel::backward(LlamaContext& ctx, double dloss) {
  PRIMUS_CHECK(num_chunks() == 1 && part_.chunks[0].has_embedding && part_.chunks[0].has_head,
               "backward() runs the whole model: use the chunk passes on a pipeline stage");
  const Dropout dropout(*this, ctx);
  Tensor dx;
  {
    const Tensor dmtp = mtp_backward_input(ctx, dloss);
    const Held held(*this, {final_norm_, output_}, blocks_.empty() ? -1 : block_unit(blocks_.size() - 1));
    dx = head_backward_input(ctx.head, dloss, ctx.valid, dmtp);
  }
  head_weight_pass(ctx);
  for (size_t l = blocks_.size(); l-- > 0;) {
    {
      const Held held(*this, {blocks_[l].attn_norm}, l > 0 ? block_unit(l - 1) : -1);
      dx = block_backward_input(blocks_[l], ctx.blocks[l], dx, ctx.pass_shape(dloss));
    }
    block_backward_weight(blocks_[l], ctx.blocks[l]);
    weights_done(blocks_[l].ids());
  }
  ctx.dembedded = dx;
  embedding_weight_pass(ctx);
}

// ---------------------------------------------------------------------------------------------
// Head: final norm, logits over this rank's vocabulary rows in chunks, cross-entropy combined
// over tp (per-row max, sum of exponentials, target logit). The output layer's GEMMs are a
// linear's (Linears: in FP8 with fp8 output_layer).

Tensor LlamaModel::head_logits(const Tensor& hn, int64_t c0, int64_t width) const {
  Tensor z = stat({hn.size(0), width});
  linears_->forward(1.0f, hn, w(output_).slice(0, c0, width), output_, 0.0f, Tensor(), z, Tensor());
  return z;
}

Tensor LlamaModel::head_chunk_dlogits(const HeadContext& h, int64_t c0, int64_t width) const {
  Tensor z = head_logits(h.hn, c0, width);
  Tensor d = act_ == stat_ ? z : act({z.size(0), width});  // in place when the dtypes agree
  be_.ce_chunk_backward(z, h.lse, h.targets, vocab_start_ + c0, spec_.final_logit_softcapping, d);
  return d;
}

double LlamaModel::head_forward(HeadContext& h, int norm, const Tensor& x, const Tensor& targets, bool has_targets,
                                int64_t& valid) {
  const int64_t C = spec_.hidden_size;
  h = HeadContext();
  h.x = x;
  h.norm = norm;
  h.targets = targets;
  Tensor hn = act({x.size(0), C});
  h.rstd = stat({x.size(0)});
  be_.rmsnorm_forward(x, w(norm), hn, h.rstd, float(spec_.norm_epsilon));
  h.normed = hn;
  h.hn = gather_rows(hn);
  if (!has_targets) return 0;  // inference
  const int64_t N = h.hn.size(0), Vl = vocab_local_;
  const double cap = spec_.final_logit_softcapping;
  h.lse = stat({N});
  double total = 0;
  if (head_stores_logits(N) && part_.tp_size == 1) {  // every column of each row here: one sweep
    const Tensor z = head_logits(h.hn, 0, Vl);
    h.dlogits = act_ == stat_ ? z : act({N, Vl});  // in place when the dtypes agree
    total = be_.ce_forward_backward(z, targets, vocab_start_, cap, h.lse, h.dlogits);
  } else {
    total = head_sharded_loss(h, targets);
  }
  sum_over_context(total, valid);  // the whole sequence's mean
  return valid ? total / double(valid) : 0.0;
}

// The loss sum when a row's logits are not all here at once: vocabulary chunks with an online
// log-sum-exp (memory N * vocab_chunk, never N * V), or shards over tp combined by their max, sum
// of exponentials and target logit. Stored logits get their gradient now; chunks recompute theirs.
double LlamaModel::head_sharded_loss(HeadContext& h, const Tensor& targets) {
  const int64_t N = h.hn.size(0), Vl = vocab_local_;
  const double cap = spec_.final_logit_softcapping;
  Tensor m = stat({N}), s = stat({N}), zt = stat({N});
  be_.ce_init(m, s, zt);
  Tensor stored;
  if (head_stores_logits(N)) {
    stored = head_logits(h.hn, 0, Vl);
    be_.ce_chunk_forward(stored, targets, vocab_start_, cap, m, s, zt);
  } else {
    for (int64_t c0 = 0; c0 < Vl; c0 += opt_.vocab_chunk) {
      const int64_t vc = std::min(opt_.vocab_chunk, Vl - c0);
      be_.ce_chunk_forward(head_logits(h.hn, c0, vc), targets, vocab_start_ + c0, cap, m, s, zt);
    }
  }
  if (part_.tp_size > 1) {
    auto& tp = *part_.tp_group;
    const parallel::CommType t = parallel::comm_type_of(stat_);
    Tensor global_max = m.clone();
    tp.all_reduce(global_max.raw(), N, t, parallel::ReduceOp::Max);
    be_.ce_merge_max(m, s, global_max);
    tp.all_reduce(s.raw(), N, t, parallel::ReduceOp::Sum);
    tp.all_reduce(zt.raw(), N, t, parallel::ReduceOp::Sum);
  }
  const double total = be_.ce_finish(m, s, zt, targets, h.lse);
  if (stored.defined()) {
    h.dlogits = act_ == stat_ ? stored : act({N, Vl});
    be_.ce_chunk_backward(stored, h.lse, targets, vocab_start_, cap, h.dlogits);
  }
  return total;
}

Tensor LlamaModel::head_backward_input(HeadContext& h, double dloss, int64_t valid, const Tensor& dnormed) {
  PRIMUS_CHECK(h.lse.defined(), "head backward without a forward that had targets");
  const int64_t N = h.hn.size(0), C = spec_.hidden_size, Vl = vocab_local_;
  // The scale is a GEMM's float alpha: computed in float (fp64 runs keep double).
  h.grad_scale = !valid ? 0.0 : act_ == DType::F64 ? dloss / double(valid) : float(dloss) / float(valid);
  const float scale = float(h.grad_scale);
  // dhn = scale * dlogits Wout, summed over the chunks (and over tp) in the stat dtype.
  Tensor dhn = be_.zeros({N, C}, stat_);
  const Tensor W = w(output_);
  if (h.dlogits.defined()) {
    linears_->input_grad(scale, h.dlogits, W, output_, 1.0f, dhn, dhn);
  } else {
    for (int64_t c0 = 0; c0 < Vl; c0 += opt_.vocab_chunk) {
      const int64_t vc = std::min(opt_.vocab_chunk, Vl - c0);
      linears_->input_grad(scale, head_chunk_dlogits(h, c0, vc), W.slice(0, c0, vc), output_, 1.0f, dhn, dhn);
    }
  }
  dhn = reduce_partial(dhn);
  if (dnormed.defined()) {  // the MTP's gradient, added in the stat dtype
    Tensor d = dnormed;
    if (dnormed.dtype() != stat_) {
      d = stat(dnormed.shape());
      be_.cast(dnormed, d);
    }
    be_.add(dhn, d, dhn);
  }
  if (stat_ != act_) {
    Tensor d = act(dhn.shape());
    be_.cast(dhn, d);
    dhn = d;
  }
  Tensor dx = act({h.x.size(0), C});
  be_.rmsnorm_backward_input(dhn, h.x, w(h.norm), h.rstd, Tensor(), dx);
  h.gn.compute(be_, dhn, h.x, h.rstd);
  h.x = h.rstd = h.normed = Tensor();  // W reads hn, the logits' gradient (or lse and targets) and gn
  return dx;
}

// W of the MTP depths, then of the head (the output layer's gradient complete before the head
// reports it): in vocabulary chunks they recompute the logits, which reads the weights.
void LlamaModel::head_weight_pass(LlamaContext& ctx) {
  mtp_backward_weight(ctx);
  std::optional<Held> held;
  if (!ctx.head.dlogits.defined()) held.emplace(*this, std::initializer_list<int>{final_norm_, output_}, -1);
  head_backward_weight(ctx.head);
  weights_done({final_norm_, output_});
}

void LlamaModel::head_backward_weight(HeadContext& h) {
  PRIMUS_CHECK(h.gn.defined(), "head backward_weight before backward_input");
  const int64_t Vl = vocab_local_;
  const float scale = float(h.grad_scale);
  h.gn.add_to(be_, g(h.norm));
  Tensor gW = g(output_);
  if (frozen_base()) {  // LoRA: no gradient for the frozen output layer
  } else if (h.dlogits.defined()) {
    linears_->weight_grad(scale, h.dlogits, h.hn, output_, gW);
  } else {
    for (int64_t c0 = 0; c0 < Vl; c0 += opt_.vocab_chunk) {
      const int64_t vc = std::min(opt_.vocab_chunk, Vl - c0);
      Tensor gc = gW.slice(0, c0, vc);
      linears_->weight_grad(scale, head_chunk_dlogits(h, c0, vc), h.hn, output_, gc);
    }
  }
  h = HeadContext();
}

// ---------------------------------------------------------------------------------------------
// Decoding: the forward's steps on the new rows of one sequence, attention reading the cache.

DecodeState LlamaModel::start_decoding(int64_t max_positions) const {
  PRIMUS_CHECK(opt_.resident_weights && part_.cp_size == 1 && part_.tp_size == 1 && part_.ep_size == 1 &&
                   num_chunks() == 1 && part_.chunks[0].has_embedding && part_.chunks[0].has_head,
               "decoding runs on one rank that holds the whole model");
  DecodeState s;
  s.capacity = std::min(max_positions, spec_.max_position_embeddings);
  if (s.capacity <= 0) fail("a decoder needs room for at least one position");
  for (const Block& b : blocks_) s.cache.push_back(act({s.capacity, b.attention->cache_width()}));
  return s;
}

Tensor LlamaModel::block_decode(const Block& b, Tensor& cache, const Tensor& x, int64_t pos0) const {
  Tensor rstd;
  const Tensor x2 = b.attention->decode(cache, kit_->norm(x, b.attn_norm, rstd), x, pos0);
  return b.feed_forward->decode(cache, kit_->norm(x2, b.mlp_norm, rstd), x2, pos0);
}

std::vector<float> LlamaModel::decode(DecodeState& state, const std::vector<int32_t>& tokens) const {
  const int64_t n = int64_t(tokens.size()), C = spec_.hidden_size;
  if (n == 0) fail("decoding needs at least one token");
  if (state.position + n > state.capacity)
    fail("the decoder's cache holds {} positions: {} more tokens after {} do not fit", state.capacity, n,
         state.position);
  LlamaContext ctx;
  begin_microbatch(ctx, tokens.data(), nullptr, 1, n);
  Tensor x = act({n, C});
  be_.embedding_forward(ctx.shard_tokens_dev, w(embedding_), x);
  for (size_t l = 0; l < blocks_.size(); ++l) x = block_decode(blocks_[l], state.cache[l], x, state.position);
  state.position += n;
  // The final norm and the logits of the last row only.
  Tensor hn = act({1, C}), rstd = stat({1});
  be_.rmsnorm_forward(x.slice(0, n - 1, 1), w(final_norm_), hn, rstd, float(spec_.norm_epsilon));
  return full_logits(hn);
}

std::vector<float> LlamaModel::full_logits(const Tensor& hn) const {
  const int64_t rows = hn.size(0), V = spec_.vocab_size;
  Tensor z = head_logits(hn, 0, V);
  if (stat_ != DType::F32) {
    Tensor z32 = be_.empty(z.shape(), DType::F32);
    be_.cast(z, z32);
    z = z32;
  }
  const Tensor host = z.to(Device::CPU);
  std::vector<float> out(host.data<float>(), host.data<float>() + rows * V);
  if (spec_.final_logit_softcapping > 0)  // the logits the loss sees (Grok 2's final_logit_softcapping)
    for (float& x : out) x = ops::softcap(x, float(spec_.final_logit_softcapping));
  return out;
}

Tensor LlamaModel::last_logits(const LlamaContext& ctx) const {
  PRIMUS_CHECK(ctx.head.hn.defined(), "last_logits before forward");
  PRIMUS_CHECK(opt_.resident_weights && part_.tp_size == 1 && part_.cp_size == 1, "last_logits runs on one rank");
  const int64_t B = ctx.batch, S = ctx.seq, V = spec_.vocab_size;
  Tensor out = Tensor::empty({B, V});
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<float> z = full_logits(ctx.head.hn.slice(0, b * S + S - 1, 1));
    std::copy(z.begin(), z.end(), out.data<float>() + b * V);
  }
  return out;
}

}  // namespace primus

namespace primus {

// ---------------------------------------------------------------------------------------------
// Mixture of experts: the MoE parts' statistics and the expert-bias balancing step.

const std::vector<MoeLayerStats>& LlamaModel::moe_stats() const {
  moe_stats_.clear();
  for (const MoeFeedForward* m : feed_forward_parts_->moe()) moe_stats_.push_back(m->stats());
  return moe_stats_;
}

void LlamaModel::reset_moe_stats() {
  for (MoeFeedForward* m : feed_forward_parts_->moe()) m->reset_stats();
}

void LlamaModel::update_expert_biases(const std::vector<std::vector<int64_t>>& tokens) {
  const auto& moe = feed_forward_parts_->moe();
  PRIMUS_CHECK(tokens.size() == moe.size(), "expert counts for {} of {} MoE blocks", tokens.size(), moe.size());
  for (size_t i = 0; i < moe.size(); ++i) moe[i]->update_expert_bias(tokens[i]);
  if (opt_.resident_weights) sync_working_weights();  // (a weight source keeps its buffers in fp32 only)
}

}  // namespace primus
