#include "model/attention_parts.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace primus {
namespace {

// linear_proj [C, heads x out_head] is row-parallel: this rank's heads' input columns.
ShardSpec proj_shard(const PartKit& k, int64_t out_head) {
  const int tp = k.part.tp_size, r = k.part.tp_rank;
  const int64_t hl = k.spec.num_attention_heads / tp;
  return tp > 1 ? ShardSpec{1, {{r * hl * out_head, hl * out_head}}} : ShardSpec{};
}

// Registers a linear's weight and declares it to the linears (model/linears.h).
int add_linear(const PartKit& k, ParamStore& params, const std::string& name, const Shape& shape,
               const ShardSpec& shard, ParamInit init, int64_t layer) {
  const int id = params.add_sharded(name, shape, shard, init, true);
  k.linears.declare(id, name, layer);
  return id;
}

int add_proj(const PartKit& k, ParamStore& params, int64_t layer, int64_t out_head) {
  return add_linear(k, params, k.spec.layer_prefix(layer) + "self_attention.linear_proj.weight",
                    {k.spec.hidden_size, k.spec.attention_out_size()}, proj_shard(k, out_head),
                    ParamInit::ScaledNormal, layer);
}

// ---------------------------------------------------------------------------------------------
// Grouped-query attention

struct GqaContext final : PartContext {
  Tensor h, qkv, attn;    // the normed input (all rows), the rotated qkv, the core's output
  AttentionSaves core;    // the attention core's own
  QkNormContext qk;       // qk_layernorm's
  Tensor dx2, dqkv;       // B outputs the W pass reads (dx2: the output gradient, all rows)
  Tensor dy;              // the output gradient on this rank's rows (linear_proj's bias)
  Tensor dsinks;          // learned sinks: their gradient from B, added in W (stat dtype)
};

// gpt-oss's attention sinks of this rank's heads (kernels/cpu/attention.h): a learned logit per
// head (softmax_type learnable: Megatron's softmax_offset, sharded by heads under tp), or a fixed
// 0 (off-by-one); none for vanilla. The kernels read them in the stat dtype.
class AttentionSinks {
 public:
  AttentionSinks(const PartKit& kit, ParamStore& params, const std::string& prefix, int64_t heads) : k_(kit) {
    const ModelSpec& s = kit.spec;
    if (s.learns_attention_sinks()) {
      const int tp = kit.part.tp_size, r = kit.part.tp_rank;
      id_ = params.add_sharded(prefix + "self_attention.core_attention.softmax_offset", {s.num_attention_heads},
                               tp > 1 ? ShardSpec{0, {{r * heads, heads}}} : ShardSpec{}, ParamInit::Normal, false);
    } else if (s.has_attention_sinks()) {
      fixed_ = kit.be.zeros({heads}, kit.stat);
    }
  }
  int id() const { return id_; }
  // The sinks as the kernels take them (undefined: none).
  Tensor values() const {
    if (id_ < 0) return fixed_;
    const Tensor w = k_.params.weight(id_);
    if (w.dtype() == k_.stat) return w;
    Tensor v = k_.stat_empty({w.numel()});
    k_.be.cast(w, v);
    return v;
  }
  // B: the learned sinks' gradient from the core's out, lse and the output gradient.
  Tensor backward(const Tensor& out, const Tensor& lse, const Tensor& dout, const ops::AttentionShape& s) const {
    if (id_ < 0) return Tensor();
    Tensor d = k_.be.zeros({s.heads}, k_.stat);
    k_.be.attention_sink_backward(out, lse, dout, d, s);
    return d;
  }
  // W: adds B's gradient.
  void backward_weight(const Tensor& dsinks) const {
    if (id_ < 0) return;
    Tensor g = k_.params.grad(id_).view({dsinks.numel()});
    k_.be.add(g, dsinks, g);
  }

 private:
  const PartKit& k_;
  int id_ = -1;
  Tensor fixed_;
};

class GqaAttention final : public BlockPart {
 public:
  // qk_norm: the layer's per-head norm of q and k (qk_layernorm: with weights; qk_l2_norm: none,
  // unit_weight holds the ones it runs with), or null. pos: its rotary embedding and temperature.
  GqaAttention(const PartKit& kit, ParamStore& params, int64_t layer, AttentionCore& core, QkPositions pos,
               const QkNorm* qk_norm, const Tensor& unit_weight)
      : k_(kit),
        core_(core),
        pos_(pos),
        qk_norm_(qk_norm),
        unit_weight_(unit_weight),
        heads_(kit.spec.num_attention_heads / kit.part.tp_size),
        groups_(kit.spec.query_groups() / kit.part.tp_size),
        D_(kit.spec.head_dim()),
        window_(kit.spec.layer_window(layer)),
        chunk_(kit.spec.layer_attention_chunk(layer)) {
    const ModelSpec& s = kit.spec;
    const std::string pre = kit.spec.layer_prefix(layer);
    // Column-parallel linear_qkv: this rank's q heads, then its k groups, then its v groups.
    const int tp = kit.part.tp_size, r = kit.part.tp_rank;
    const int64_t H = s.num_attention_heads, G = s.query_groups(), D = D_;
    const ShardSpec qkv_shard =
        tp > 1 ? ShardSpec{0, {{r * heads_ * D, heads_ * D}, {H * D + r * groups_ * D, groups_ * D},
                               {H * D + G * D + r * groups_ * D, groups_ * D}}}
               : ShardSpec{};
    qkv_w_ = add_linear(kit, params, pre + "self_attention.linear_qkv.weight", {s.qkv_size(), s.hidden_size},
                        qkv_shard, ParamInit::Normal, layer);
    if (s.qkv_bias())
      qkv_b_ = params.add_sharded(pre + "self_attention.linear_qkv.bias", {s.qkv_size()}, qkv_shard, ParamInit::Zeros,
                                  false);
    if (qk_norm_ && s.qk_layernorm) {  // one weight for all q heads, one for all k groups; tp-partial gradients
      q_norm_ = params.add(pre + "self_attention.q_layernorm.weight", {D}, ParamInit::Ones, false);
      k_norm_ = params.add(pre + "self_attention.k_layernorm.weight", {D}, ParamInit::Ones, false);
      params.mark_tp_partial_grads(q_norm_);
      params.mark_tp_partial_grads(k_norm_);
    }
    sinks_ = std::make_unique<AttentionSinks>(kit, params, pre, heads_);
    proj_w_ = add_proj(kit, params, layer, D);
    if (s.add_bias_linear)  // replicated over tp, added once after the row-parallel sum
      proj_b_ = params.add(pre + "self_attention.linear_proj.bias", {s.hidden_size}, ParamInit::Zeros, false);
  }

  std::vector<int> param_ids() const override {
    std::vector<int> v = {qkv_w_};
    for (int id : {qkv_b_, q_norm_, k_norm_, sinks_->id()})
      if (id >= 0) v.push_back(id);
    v.push_back(proj_w_);
    if (proj_b_ >= 0) v.push_back(proj_b_);
    return v;
  }
  std::unique_ptr<PartContext> new_context() const override { return std::make_unique<GqaContext>(); }

  Tensor forward(PartContext& pc, const Tensor& h, const Tensor& residual, const PassShape& m,
                 bool want_output) override {
    GqaContext& c = static_cast<GqaContext&>(pc);
    if (!c.h.defined()) c.h = k_.tp.gather(h);
    if (!c.qkv.defined()) {
      c.qkv = k_.linear(c.h, qkv_w_, qkv_b_);
      if (qk_norm_) qk_norm_->forward(c.qkv, w(q_norm_), w(k_norm_), c.qk);
      pos_.apply(c.qkv, heads_, groups_, D_, m.seq, 0, false, m.positions());
    }
    if (!c.attn.defined()) {
      c.attn = k_.empty({c.qkv.size(0), heads_ * D_});
      core_.forward(c.qkv, c.attn, c.core, shape(m), docs(m));
    }
    return want_output ? k_.row_parallel_residual(c.attn, proj_w_, residual, proj_b_) : Tensor();
  }

  void drop(PartContext& pc, Recompute r) const override {
    GqaContext& c = static_cast<GqaContext&>(pc);
    if (r == Recompute::Full) {
      c = GqaContext();
    } else if (r == Recompute::Selective) {  // keep the projections' outputs (qkv, qk-norm's rows)
      c.h = c.attn = Tensor();
      c.core = AttentionSaves();
    }
  }

  Tensor backward_input(PartContext& pc, const Tensor& dy, const PassShape& m) override {
    GqaContext& c = static_cast<GqaContext&>(pc);
    c.dx2 = k_.tp.gather(dy);
    if (proj_b_ >= 0) c.dy = dy;
    const Tensor dattn = k_.linear_input_grad(c.dx2, proj_w_);
    c.dqkv = k_.empty({c.qkv.size(0), c.qkv.size(1)});
    const ops::AttentionShape s = shape(m);
    core_.backward(c.qkv, c.attn, c.core, dattn, c.dqkv, s, docs(m));
    c.dsinks = sinks_->backward(c.attn, c.core.lse, dattn, s);
    pos_.apply(c.dqkv, heads_, groups_, D_, m.seq, 0, true, m.positions());
    if (qk_norm_) qk_norm_->backward_input(c.dqkv, w(q_norm_), w(k_norm_), c.qk, q_norm_ >= 0);
    Tensor dh = k_.linear_input_grad(c.dqkv, qkv_w_);
    // W reads h, attn, dx2 and dqkv (the linears' inputs and output gradients), dy and the sinks'
    // and qk-norm's weight gradients: the rest was B's alone.
    c.qkv = Tensor();
    c.core = AttentionSaves();
    return k_.tp.reduce(dh);
  }

  void backward_weight(PartContext& pc) override {
    GqaContext& c = static_cast<GqaContext&>(pc);
    k_.linear_weight_grad(c.dx2, c.attn, proj_w_);
    if (proj_b_ >= 0) k_.bias_grad(c.dy, proj_b_);
    k_.linear_weight_grad(c.dqkv, c.h, qkv_w_);
    if (qkv_b_ >= 0) {
      Tensor gb = k_.params.grad(qkv_b_);
      k_.be.column_sum_accumulate(c.dqkv, gb);
    }
    if (q_norm_ >= 0) {
      Tensor gq = k_.params.grad(q_norm_), gk = k_.params.grad(k_norm_);
      qk_norm_->backward_weight(c.qk, gq, gk);
    }
    if (c.dsinks.defined()) sinks_->backward_weight(c.dsinks);
    c = GqaContext();
  }

  int64_t cache_width() const override { return (heads_ + 2 * groups_) * D_; }

  Tensor decode(Tensor& cache, const Tensor& h, const Tensor& residual, int64_t pos0) const override {
    const int64_t n = h.size(0);
    Tensor qkv = k_.linear(h, qkv_w_, qkv_b_);
    if (qk_norm_) {
      QkNormContext unused;
      qk_norm_->forward(qkv, w(q_norm_), w(k_norm_), unused);
    }
    pos_.apply(qkv, heads_, groups_, D_, n, pos0, false);
    cache.slice(0, pos0, n).copy_from(qkv);
    Tensor attn = k_.empty({n, heads_ * D_});
    // Rows pos0 .. pos0 + n - 1, each run of them within one attention chunk (chunk_ > 0) decoded
    // over its chunk's rows of the cache alone.
    for (int64_t t = pos0; t < pos0 + n;) {
      const int64_t from = chunk_ > 0 ? t / chunk_ * chunk_ : 0;
      const int64_t end = chunk_ > 0 ? std::min(pos0 + n, from + chunk_) : pos0 + n;
      ops::AttentionShape s{1, end - from, heads_, groups_, D_};
      s.window = window_;
      s.sinks = sinks_->values();
      Tensor out = attn.slice(0, t - pos0, end - t);
      k_.be.attention_decode(cache.slice(0, from, end - from), t - from, out, s);
      t = end;
    }
    return k_.row_parallel_residual(attn, proj_w_, residual, proj_b_);
  }

 private:
  // The q/k norm's weights: the layer's (qk_layernorm) or ones (qk_l2_norm).
  Tensor w(int id) const { return id >= 0 ? k_.params.weight(id) : unit_weight_; }
  // The attention's documents: the chunked layers' (Llama 4) or the packed documents.
  const DocumentRows* docs(const PassShape& m) const {
    // A pass that forgot the chunk rows would attend across chunks without a word: refuse it.
    PRIMUS_CHECK(chunk_ == 0 || (m.chunked_docs && m.chunked_docs->separates_attention()),
                 "a chunked attention layer's pass has no chunk rows (PassShape::chunked_docs)");
    return chunk_ > 0 ? m.chunked_docs : m.docs;
  }
  // This rank's attention of m: its heads, the layer's window and the sinks.
  ops::AttentionShape shape(const PassShape& m) const {
    ops::AttentionShape s{m.batch, m.seq, heads_, groups_, D_};
    s.window = window_;
    s.sinks = sinks_->values();
    return s;
  }

  const PartKit& k_;
  AttentionCore& core_;
  QkPositions pos_;
  const QkNorm* qk_norm_;
  Tensor unit_weight_;
  int64_t heads_, groups_, D_;  // this rank's
  int64_t window_;              // this layer's sliding window (-1: none)
  int64_t chunk_;               // this layer's attention chunk (0: none)
  std::unique_ptr<AttentionSinks> sinks_;
  int qkv_w_ = -1, qkv_b_ = -1, q_norm_ = -1, k_norm_ = -1, proj_w_ = -1, proj_b_ = -1;
};

// ---------------------------------------------------------------------------------------------
// Multi-latent attention

struct MlaPartContext final : PartContext {
  Tensor h, qkv, attn;   // the normed input (all rows), the packed qkv, linear_proj's input
  MlaContext mla;        // the projections' saves (and the core's padded output)
  AttentionSaves core;
  Tensor dx2;
};

class MlaAttention final : public BlockPart {
 public:
  MlaAttention(const PartKit& kit, ParamStore& params, int64_t layer, AttentionCore& core, const Mla& mla)
      : k_(kit), core_(core), mla_(mla) {
    p_ = register_mla_params(params, kit.spec, layer, kit.part.tp_size, kit.part.tp_rank);
    for (int id : {p_.q_proj, p_.q_down, p_.q_up, p_.kv_down, p_.kv_up})
      if (id >= 0) kit.linears.declare(id, params.infos()[size_t(id)].name, layer);
    proj_w_ = add_proj(kit, params, layer, kit.spec.v_head_dim);
    weights_ = [this](int id) { return k_.params.weight(id); };
    grads_ = [this](int id) { return k_.params.grad(id); };
  }

  std::vector<int> param_ids() const override {
    std::vector<int> v = p_.ids();
    v.push_back(proj_w_);
    return v;
  }
  std::unique_ptr<PartContext> new_context() const override { return std::make_unique<MlaPartContext>(); }

  Tensor forward(PartContext& pc, const Tensor& h, const Tensor& residual, const PassShape& m,
                 bool want_output) override {
    MlaPartContext& c = static_cast<MlaPartContext&>(pc);
    if (!c.h.defined()) c.h = k_.tp.gather(h);
    if (!c.qkv.defined()) c.qkv = mla_.forward(p_, c.mla, c.h, m.seq, 0, weights_, m.positions());
    if (!c.attn.defined()) {
      const ops::AttentionShape s = mla_.shape(m.batch, m.seq);
      c.mla.out = k_.empty({c.qkv.size(0), s.heads * s.head_dim});
      core_.forward(c.qkv, c.mla.out, c.core, s, m.docs);
      c.attn = mla_.values(c.mla.out);
    }
    return want_output ? k_.row_parallel_residual(c.attn, proj_w_, residual) : Tensor();
  }

  void drop(PartContext& pc, Recompute r) const override {
    MlaPartContext& c = static_cast<MlaPartContext&>(pc);
    if (r == Recompute::Full) {
      c = MlaPartContext();
    } else if (r == Recompute::Selective) {  // keep the projections' outputs and saves
      c.h = c.attn = c.mla.out = Tensor();
      c.core = AttentionSaves();
    }
  }

  Tensor backward_input(PartContext& pc, const Tensor& dy, const PassShape& m) override {
    MlaPartContext& c = static_cast<MlaPartContext&>(pc);
    c.dx2 = k_.tp.gather(dy);
    const Tensor dout = mla_.values_grad(k_.linear_input_grad(c.dx2, proj_w_));
    Tensor dqkv = k_.empty({c.qkv.size(0), mla_.packed_width()});
    core_.backward(c.qkv, c.mla.out, c.core, dout, dqkv, mla_.shape(m.batch, m.seq), m.docs);
    c.mla.out = c.qkv = Tensor();
    c.core = AttentionSaves();
    // This rank's heads' part of dh, as after a column-parallel linear.
    return k_.tp.reduce(mla_.backward_input(p_, c.mla, dqkv, m.seq, weights_, m.positions()));
  }

  void backward_weight(PartContext& pc) override {
    MlaPartContext& c = static_cast<MlaPartContext&>(pc);
    k_.linear_weight_grad(c.dx2, c.attn, proj_w_);
    mla_.backward_weight(p_, c.mla, c.h, grads_);
    c = MlaPartContext();
  }

  int64_t cache_width() const override { return mla_.packed_width(); }  // the packed heads

  Tensor decode(Tensor& cache, const Tensor& h, const Tensor& residual, int64_t pos0) const override {
    const int64_t n = h.size(0);
    MlaContext unused;
    cache.slice(0, pos0, n).copy_from(mla_.forward(p_, unused, h, n, pos0, weights_));
    const ops::AttentionShape s = mla_.shape(1, pos0 + n);
    Tensor out = k_.empty({n, s.heads * s.head_dim});
    k_.be.attention_decode(cache, pos0, out, s);
    return k_.row_parallel_residual(mla_.values(out), proj_w_, residual);
  }

 private:
  const PartKit& k_;
  AttentionCore& core_;
  const Mla& mla_;
  MlaParams p_;
  int proj_w_ = -1;
  Mla::Weights weights_, grads_;
};

}  // namespace

AttentionParts::AttentionParts(const PartKit& kit) : kit_(kit) {
  const ModelSpec& s = kit.spec;
  const ModelPartition& p = kit.part;
  if (p.cp_size > 1 && p.cp_comm == CpComm::A2A) check_all_to_all_heads(s, p.tp_size, p.cp_size);
  if (p.cp_size > 1 && (s.window_size >= 0 || s.has_attention_sinks()))
    fail("model '{}': window_size and softmax_type {} (gpt-oss's attention) are not supported with "
         "context_parallel_size {}: the ring and all-to-all attention cores have neither; use context_parallel_size 1",
         s.name, s.softmax_type, p.cp_size);
  core_ = make_attention_core(kit.be, kit.act, p.cp_size, p.cp_group, p.cp_comm);
  if (s.multi_latent_attention) {
    mla_ = std::make_unique<Mla>(kit.be, kit.act, s, kit.linears, p.tp_size, p.cp_size, p.cp_rank);
    return;
  }
  const int64_t half = s.rotary_dim() / 2, P = s.max_position_embeddings;
  Tensor cos = Tensor::empty({P, half}, kit.stat), sin = Tensor::empty({P, half}, kit.stat);
  if (kit.stat == DType::F64)
    rope_tables_of(s, P, cos.data<double>(), sin.data<double>());
  else
    rope_tables_of(s, P, cos.data<float>(), sin.data<float>());
  rope_ = std::make_unique<Rotary>(kit.be, cos, sin, s.rotary_dim(), p.cp_size, p.cp_rank, s.head_dim());
  if (s.attn_temperature_tuning)
    temperature_ = std::make_unique<QueryTemperature>(kit.be, s.floor_scale, s.attn_scale, p.cp_size, p.cp_rank);
  if (s.qk_layernorm || s.qk_l2_norm)
    qk_norm_ = std::make_unique<QkNorm>(kit.be, kit.act, s.num_attention_heads / p.tp_size,
                                        s.query_groups() / p.tp_size, s.head_dim(), float(s.norm_epsilon));
  if (s.qk_l2_norm) {  // the norm without weights: ones
    const bool f64 = kit.act == DType::F64;
    Tensor ones = Tensor::empty({s.head_dim()}, f64 ? DType::F64 : DType::F32);
    for (int64_t i = 0; i < s.head_dim(); ++i)
      f64 ? void(ones.data<double>()[i] = 1.0) : void(ones.data<float>()[i] = 1.0f);
    unit_weight_ = ones.to(kit.be.device());
    if (unit_weight_.dtype() != kit.act) {
      Tensor w = kit.be.empty({s.head_dim()}, kit.act);
      kit.be.cast(unit_weight_, w);
      unit_weight_ = w;
    }
  }
}

AttentionParts::~AttentionParts() = default;

std::unique_ptr<BlockPart> AttentionParts::make(ParamStore& params, int64_t layer) {
  if (mla_) return std::make_unique<MlaAttention>(kit_, params, layer, *core_, *mla_);
  // Llama 4: the NoPE layers (no_rope_freq) have neither rotary embedding nor qk_l2_norm, and
  // the queries' temperature (attn_temperature_tuning) instead.
  const ModelSpec& s = kit_.spec;
  const bool rope = s.layer_uses_rope(layer);
  const QkPositions pos(rope ? rope_.get() : nullptr, rope ? nullptr : temperature_.get());
  const QkNorm* norm = s.qk_layernorm || (s.qk_l2_norm && rope) ? qk_norm_.get() : nullptr;
  return std::make_unique<GqaAttention>(kit_, params, layer, *core_, pos, norm, unit_weight_);
}

}  // namespace primus
