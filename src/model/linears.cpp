#include "model/linears.h"

#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "core/rng.h"
#include "model/block_part.h"
#include "model/param_store.h"

namespace primus {
namespace {

// Megatron-Core's module names of the linears LoRA may target, by LoraTarget.
constexpr const char* kTargetModules[] = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"};

// The target a weight named "<...>.<module>.weight" is, if any.
std::optional<LoraTarget> lora_target(const std::string& name) {
  for (size_t t = 0; t < std::size(kTargetModules); ++t)
    if (name.ends_with(std::string(".") + kTargetModules[t] + ".weight")) return LoraTarget(t);
  return std::nullopt;
}

// The adapter names of base weight `name` when LoRA targets it.
std::optional<std::pair<std::string, std::string>> adapter_names(const std::string& name, const LoraOptions& lora) {
  const std::optional<LoraTarget> t = lora_target(name);
  if (!lora.enabled || !t || !lora.applies_to(*t)) return std::nullopt;
  const std::string pre = name.substr(0, name.size() - std::string(".weight").size()) + ".adapter.";
  return std::make_pair(pre + "linear_in.weight", pre + "linear_out.weight");
}

// FNV-1a of a weight's name: the same on every build and platform (its dropout masks' salt).
uint64_t name_hash(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

ParamInit param_init(LoraInit i) {
  switch (i) {
    case LoraInit::Xavier: return ParamInit::XavierNormal;
    case LoraInit::Normal: return ParamInit::AdapterNormal;
    case LoraInit::Kaiming: return ParamInit::KaimingUniform;
    case LoraInit::Zero: return ParamInit::Zeros;
  }
  return ParamInit::Zeros;
}

}  // namespace

uint64_t lora_dropout_key(uint64_t seed, int64_t first_sample) {
  return splitmix64(splitmix64(seed ^ 0x4c6f5241ull) ^ uint64_t(first_sample));
}

Linears::Linears(ops::Backend& backend, DType activation, const Fp8Options& fp8, int64_t num_layers,
                 const LoraOptions& lora)
    : be_(backend), act_(activation), opt_(fp8), num_layers_(num_layers), lora_(lora) {
  if (opt_.enabled && opt_.amax_history_len < 1)
    fail("fp8_amax_history_len must be at least 1, got {}", opt_.amax_history_len);
  PRIMUS_CHECK(!lora_.enabled || (lora_.dim > 0 && lora_.dropout >= 0.0 && lora_.dropout < 1.0),
               "LoRA needs dim > 0 and dropout in [0, 1) (the config refuses the rest)");
}

bool fp8_head_needs_whole_logits(const Fp8Options& fp8, int64_t vocab_chunk) {
  if (!fp8.enabled || !fp8.output_layer) return false;
  switch (fp8.recipe) {
    case Fp8Recipe::Delayed: return false;
    case Fp8Recipe::Tensorwise: return true;
    case Fp8Recipe::Blockwise: return vocab_chunk % 128 != 0;
    case Fp8Recipe::Mxfp8: return vocab_chunk % 32 != 0;
  }
  return true;
}

void Linears::declare(int weight, const std::string& name, int64_t layer) {
  declared_.push_back({weight, name});
  // first_last_layers_bf16 counts decoder layers; the multi-token-prediction depths (layers
  // num_layers + k) run in FP8 whenever it is on, as in Megatron's global FP8 context.
  const bool mtp = layer >= num_layers_;
  if (opt_.enabled && (mtp || (layer >= opt_.bf16_layers_at_start && layer < num_layers_ - opt_.bf16_layers_at_end)))
    cover(weight, name);
}

void Linears::declare_output(int weight, const std::string& name) {
  declared_.push_back({weight, name});
  if (opt_.enabled && opt_.output_layer) cover(weight, name);
}

std::string Linears::describe_fp8() const {
  if (!opt_.enabled) return {};
  const bool hybrid = opt_.forward != opt_.backward;
  std::string scaling;
  switch (opt_.recipe) {
    case Fp8Recipe::Delayed:
      scaling = fmt::format("amax history {}, {}, margin {}", opt_.amax_history_len,
                            fp8::amax_algo_name(opt_.amax_compute_algo), opt_.margin);
      break;
    case Fp8Recipe::Tensorwise: scaling = "current scaling, one scale per tensor"; break;
    case Fp8Recipe::Blockwise: scaling = "1 x 128 tiles and 128 x 128 weight blocks, power-of-two scales"; break;
    case Fp8Recipe::Mxfp8: scaling = "1 x 32 blocks, E8M0 scales"; break;
  }
  std::string out;
  if (opt_.bf16_layers_at_start > 0 || opt_.bf16_layers_at_end > 0)
    out += fmt::format(", the first {} and last {} decoder layers' kept out", opt_.bf16_layers_at_start,
                       opt_.bf16_layers_at_end);
  out += opt_.output_layer ? ", the output layer's included (fp8_output_layer)" : ", the output layer's kept out";
  return fmt::format("FP8 {}: {} ({}); {} of this rank's {} linears in FP8{}; weight gradients {}",
                     hybrid ? "hybrid (E4M3 forward, E5M2 gradients)" : "e4m3", fp8_recipe_name(opt_.recipe), scaling,
                     order_.size(), declared_.size(), out,
                     opt_.wgrad ? "in FP8 too" : "in the activation dtype (fp8_wgrad false)");
}

void Linears::cover(int weight, const std::string& name) {
  Scales s{name,
           {fp8::DelayedScale(opt_.amax_history_len), fp8::DelayedScale(opt_.amax_history_len),
            fp8::DelayedScale(opt_.amax_history_len)},
           int64_t(order_.size())};
  amax_acc_ = Tensor();  // sized by the linears covered
  state_.emplace(weight, std::move(s));
  order_.push_back(weight);
}

fp8::Granularity fp8_granularity(Fp8Recipe recipe, bool weight) {
  switch (recipe) {
    case Fp8Recipe::Delayed:
    case Fp8Recipe::Tensorwise: return fp8::Granularity::Tensor;
    case Fp8Recipe::Blockwise: return weight ? fp8::Granularity::Block128 : fp8::Granularity::Tile1x128;
    case Fp8Recipe::Mxfp8: return fp8::Granularity::Mx32;
  }
  return fp8::Granularity::Tensor;
}

fp8::Granularity Linears::granularity(Operand op) const { return fp8_granularity(opt_.recipe, op == W); }

Linears::Quantized Linears::quantize(const Tensor& src, Operand op, int weight, bool reduce_cols, Tensor& dst) const {
  const Scales& s = state_.at(weight);
  const bool delayed = opt_.recipe == Fp8Recipe::Delayed;
  // Only delayed scaling keeps the amax: folded into its accumulator where the backend computes.
  ops::Backend::Fp8AmaxOut amax{Tensor(), 0, false};
  if (delayed) amax = {amax_accumulator(), 3 * s.slot + op, true};
  const ops::Backend::Fp8Quantized q = be_.quantize_fp8(src, format(op), granularity(op), reduce_cols,
                                                        delayed ? s.operand[op].scale : 0.0f, dst, amax);
  return {1.0f / q.scale, {format(op), granularity(op), q.block_scales}};
}

Linears::Operands Linears::operands(Gemm kind, const Tensor& a, const Tensor& b, int weight) const {
  if (!fp8(weight) || (kind == Gemm::WeightGrad && !opt_.wgrad)) return {a, b, 1.0f};
  // Which operand each is, and whether its GEMM reduces over its columns: x W^T over the input
  // features (x's and W's columns), dy W over the output features (dy's columns, W's rows), dy^T x
  // over the tokens (both operands' rows).
  struct Roles {
    Operand a, b;
    bool a_cols, b_cols;
  };
  const Roles r = kind == Gemm::Forward     ? Roles{X, W, true, true}
                  : kind == Gemm::InputGrad ? Roles{Dy, W, true, false}
                                            : Roles{Dy, X, false, false};
  Operands o{be_.empty(a.shape(), act_), be_.empty(b.shape(), act_), 1.0f};
  const Quantized qa = quantize(a, r.a, weight, r.a_cols, o.a);
  const Quantized qb = quantize(b, r.b, weight, r.b_cols, o.b);
  o.alpha = qa.inverse_scale * qb.inverse_scale;
  o.fp8 = ops::Backend::Fp8Pair{qa.operand, qb.operand};
  return o;
}

void Linears::gemm(const Operands& o, bool trans_a, bool trans_b, float alpha, float beta, const Tensor& C, Tensor& D,
                   const Tensor& bias) const {
  if (o.fp8)
    be_.gemm_fp8(*o.fp8, trans_a, trans_b, alpha * o.alpha, o.a, o.b, beta, C, D, bias);
  else
    be_.gemm(trans_a, trans_b, alpha * o.alpha, o.a, o.b, beta, C, D, bias);
}

std::vector<std::pair<std::string, Shape>> lora_adapter_layout(const std::vector<ParamInfo>& layout,
                                                               const LoraOptions& lora) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const ParamInfo& p : layout)
    if (const auto names = adapter_names(p.name, lora); names && p.shape.size() == 2) {
      out.push_back({names->first, {lora.dim, p.shape[1]}});
      out.push_back({names->second, {p.shape[0], lora.dim}});
    }
  return out;
}

std::vector<int> Linears::add_adapters(ParamStore& params) {
  std::vector<int> ids;
  if (!lora_.enabled) return ids;
  const int64_t r = lora_.dim;
  const ParamInit a_init = param_init(lora_.a_init), b_init = param_init(lora_.b_init);
  for (const Declared& d : declared_) {
    const auto names = adapter_names(d.name, lora_);
    if (!names) continue;
    const StoredParam base = params.infos()[size_t(d.weight)];  // a copy: add() grows the table
    const int64_t out = base.global_shape[0], in = base.global_shape[1];
    Adapter ad;
    if (base.shard.pieces.empty()) {  // whole on every rank
      ad.a = params.add(names->first, {r, in}, a_init, true);
      ad.b = params.add(names->second, {out, r}, b_init, true);
    } else if (base.shard.dim == 1) {  // row-parallel: A by the base's columns, B whole
      ad.a = params.add_sharded(names->first, {r, in}, base.shard, a_init, true);
      ad.b = params.add(names->second, {out, r}, b_init, true);
      params.mark_tp_partial_grads(ad.b);
    } else {  // column-parallel: B by the base's rows (its pieces: q/k/v, gate/up), A whole
      ad.a = params.add(names->first, {r, in}, a_init, true);
      ad.b = params.add_sharded(names->second, {out, r}, base.shard, b_init, true);
      params.mark_tp_partial_grads(ad.a);
    }
    ad.salt = name_hash(d.name);
    adapters_[d.weight] = ad;
    ids.push_back(ad.a);
    ids.push_back(ad.b);
  }
  return ids;
}

const Linears::Adapter* Linears::adapter(int weight) const {
  const auto it = adapters_.find(weight);
  return it == adapters_.end() ? nullptr : &it->second;
}

std::vector<int> Linears::adapters_of(const std::vector<int>& weights) const {
  std::vector<int> out;
  for (int w : weights)
    if (const Adapter* ad = adapter(w)) out.insert(out.end(), {ad->a, ad->b});
  return out;
}

Tensor Linears::dropped(const Tensor& t, const Adapter& ad) const {
  Tensor out = be_.empty(t.shape(), t.dtype());
  be_.dropout(t, out, lora_.dropout, splitmix64(*dropout_key_ ^ ad.salt));
  return out;
}

void Linears::add_dropped(Tensor& t, const Adapter& ad, Tensor& D) const {
  be_.dropout(t, t, lora_.dropout, splitmix64(*dropout_key_ ^ ad.salt));
  be_.add(D, t, D);
}

void Linears::adapter_gemm(Gemm kind, float alpha, const Tensor& a, const Tensor& b, const Adapter& ad,
                           Tensor& D) const {
  const int64_t rows = a.size(0);
  if (rows == 0) return;
  PRIMUS_CHECK(params_, "LoRA adapters without the model's parameters (Linears::set_params)");
  const Tensor A = params_->weight(ad.a), B = params_->weight(ad.b);
  const float s = alpha * float(lora_.scale());
  // Dropout (the top of linears.h): pre drops x and the input gradient's term, post the output
  // term and dy; the same mask in the forward and the backward.
  const bool drop = dropout_key_ && lora_.dropout > 0.0;
  const bool pre = drop && lora_.dropout_position == LoraDropoutPosition::Pre, post = drop && !pre;
  Tensor low = be_.empty({rows, lora_.dim}, act_);
  switch (kind) {
    case Gemm::Forward: {  // a = x: D += s (x' A^T) B^T, or D += drop(s (x A^T) B^T)
      be_.gemm(false, true, 1.0f, pre ? dropped(a, ad) : a, A, 0.0f, Tensor(), low, Tensor());
      if (!post) {
        be_.gemm(false, true, s, low, B, 1.0f, D, D, Tensor());
        break;
      }
      Tensor t = be_.empty(D.shape(), D.dtype());
      be_.gemm(false, true, s, low, B, 0.0f, Tensor(), t, Tensor());
      add_dropped(t, ad, D);
      break;
    }
    case Gemm::InputGrad: {  // a = dy: D += s (dy' B) A, or D += drop(s (dy B) A)
      be_.gemm(false, false, 1.0f, post ? dropped(a, ad) : a, B, 0.0f, Tensor(), low, Tensor());
      if (!pre) {
        be_.gemm(false, false, s, low, A, 1.0f, D, D, Tensor());
        break;
      }
      Tensor t = be_.empty(D.shape(), D.dtype());
      be_.gemm(false, false, s, low, A, 0.0f, Tensor(), t, Tensor());
      add_dropped(t, ad, D);
      break;
    }
    case Gemm::WeightGrad: {  // a = dy, b = x: gA += s (dy B)^T x, gB += s dy^T (x A^T) (dy', x' dropped)
      Tensor gA = params_->grad(ad.a), gB = params_->grad(ad.b);
      const Tensor dy = post ? dropped(a, ad) : a, x = pre ? dropped(b, ad) : b;
      be_.gemm(false, false, 1.0f, dy, B, 0.0f, Tensor(), low, Tensor());
      be_.gemm(true, false, s, low, x, 1.0f, gA, gA, Tensor());
      be_.gemm(false, true, 1.0f, x, A, 0.0f, Tensor(), low, Tensor());
      be_.gemm(true, false, s, dy, low, 1.0f, gB, gB, Tensor());
      break;
    }
  }
}

void Linears::forward(float alpha, const Tensor& x, const Tensor& W, int weight, float beta, const Tensor& C,
                      Tensor& D, const Tensor& bias) const {
  gemm(operands(Gemm::Forward, x, W, weight), false, true, alpha, beta, C, D, bias);
  if (const Adapter* ad = adapter(weight)) adapter_gemm(Gemm::Forward, alpha, x, Tensor(), *ad, D);
}

void Linears::input_grad(float alpha, const Tensor& dy, const Tensor& W, int weight, float beta, const Tensor& C,
                         Tensor& D) const {
  gemm(operands(Gemm::InputGrad, dy, W, weight), false, false, alpha, beta, C, D, Tensor());
  if (const Adapter* ad = adapter(weight)) adapter_gemm(Gemm::InputGrad, alpha, dy, Tensor(), *ad, D);
}

// Under LoRA the base weights are frozen: only the adapters' gradients are computed.
void Linears::weight_grad(float alpha, const Tensor& dy, const Tensor& x, int weight, Tensor& gW) const {
  if (const Adapter* ad = adapter(weight)) adapter_gemm(Gemm::WeightGrad, alpha, dy, x, *ad, gW);
  if (lora_.enabled) return;
  gemm(operands(Gemm::WeightGrad, dy, x, weight), true, false, alpha, 1.0f, gW, gW, Tensor());
}

void Linears::grouped(Gemm kind, const std::vector<Tensor>& A, const std::vector<Tensor>& B,
                      const std::vector<int>& weights, std::vector<Tensor>& D) const {
  PRIMUS_CHECK(A.size() == B.size() && A.size() == D.size() && A.size() == weights.size(),
               "grouped linears: {} A, {} B, {} D, {} weights", A.size(), B.size(), D.size(), weights.size());
  if (A.empty()) return;
  // The problems with FP8 operands run as one FP8 grouped GEMM (each with its operands' formats
  // and block scales), the others as one grouped GEMM; their D's are distinct tensors.
  struct Group {
    std::vector<Tensor> a, b, d;
    std::vector<float> alpha;
    std::vector<ops::Backend::Fp8Pair> pairs;
  } plain, fp8;
  for (size_t i = 0; i < A.size(); ++i) {
    Operands o = operands(kind, A[i], B[i], weights[i]);
    Group& g = o.fp8 ? fp8 : plain;
    if (o.fp8) g.pairs.push_back(*o.fp8);
    g.a.push_back(std::move(o.a)), g.b.push_back(std::move(o.b)), g.d.push_back(D[i]), g.alpha.push_back(o.alpha);
  }
  const bool wgrad = kind == Gemm::WeightGrad, ta = wgrad, tb = kind == Gemm::Forward;
  const float beta = wgrad ? 1.0f : 0.0f;
  if (!(wgrad && lora_.enabled)) {
    if (!plain.a.empty()) be_.grouped_gemm(ta, tb, plain.alpha, plain.a, plain.b, beta, plain.d);
    if (!fp8.a.empty()) be_.grouped_gemm_fp8(fp8.pairs, ta, tb, fp8.alpha, fp8.a, fp8.b, beta, fp8.d);
  }
  for (size_t i = 0; i < A.size(); ++i)
    if (const Adapter* ad = adapter(weights[i])) adapter_gemm(kind, 1.0f, A[i], B[i], *ad, D[i]);
}

const Tensor& Linears::amax_accumulator() const {
  if (!amax_acc_.defined()) amax_acc_ = be_.zeros({int64_t(order_.size()) * 3}, DType::F32);
  return amax_acc_;
}

void Linears::fold_pending() const {
  if (!amax_acc_.defined() || amax_acc_.device() == Device::Meta) {  // the shape-only walk holds no values
    amax_acc_ = Tensor();
    return;
  }
  const Tensor host = amax_acc_.to(Device::CPU);  // one copy (and wait) for every linear's amaxes
  const float* a = host.data<float>();
  for (int w : order_) {
    Scales& s = state_.at(w);
    for (int op = 0; op < 3; ++op) s.operand[op].record(a[3 * s.slot + op]);
  }
  amax_acc_ = Tensor();
}

std::vector<float> Linears::current_amaxes() const {
  fold_pending();
  std::vector<float> v;
  v.reserve(order_.size() * 3);
  for (int w : order_)
    for (const auto& d : state_.at(w).operand) v.push_back(d.history[0]);
  return v;
}

void Linears::update_scales(const std::vector<float>& amaxes) {
  PRIMUS_CHECK(amaxes.size() == order_.size() * 3, "update_scales: {} amaxes for {} FP8 linears", amaxes.size(),
               order_.size());
  amax_acc_ = Tensor();  // amaxes holds what it had (current_amaxes), reduced over the ranks
  size_t i = 0;
  for (int w : order_)
    for (int op = 0; op < 3; ++op) {
      fp8::DelayedScale& d = state_.at(w).operand[op];
      d.history[0] = amaxes[i++];
      const float max = fp8::max_finite(op == Dy ? opt_.backward : opt_.forward);
      d.update(opt_.amax_compute_algo, std::ldexp(max, -opt_.margin));
    }
}

std::vector<std::string> Linears::state_names() const {
  std::vector<std::string> names;
  for (int w : order_) names.push_back(state_.at(w).name + ".fp8_scaling");
  return names;
}

std::map<std::string, std::vector<float>> Linears::state() const {
  fold_pending();
  std::map<std::string, std::vector<float>> out;
  for (int w : order_) {
    std::vector<float>& v = out[state_.at(w).name + ".fp8_scaling"];
    for (const auto& d : state_.at(w).operand) {
      v.insert(v.end(), d.history.begin(), d.history.end());
      v.push_back(d.scale);
    }
  }
  return out;
}

std::vector<std::string> Linears::load_state(const std::map<std::string, std::vector<float>>& saved) {
  const size_t per = size_t(opt_.amax_history_len) + 1;
  fold_pending();  // a fresh linear keeps what it recorded, as before a load
  std::vector<std::string> fresh;
  for (int w : order_) {
    const std::string name = state_.at(w).name + ".fp8_scaling";
    auto it = saved.find(name);
    if (it == saved.end() || it->second.size() != 3 * per) {
      fresh.push_back(name);
      continue;
    }
    size_t i = 0;
    for (auto& d : state_.at(w).operand) {
      std::copy(it->second.begin() + long(i), it->second.begin() + long(i + per - 1), d.history.begin());
      d.scale = it->second[i + per - 1];
      i += per;
    }
  }
  return fresh;
}

void Linears::clear_current_amaxes() {
  amax_acc_ = Tensor();
  for (int w : order_)
    for (auto& d : state_.at(w).operand) d.history[0] = 0.0f;
}

}  // namespace primus
