#include "model/linears.h"

#include <cmath>

#include "core/error.h"

namespace primus {

Linears::Linears(ops::Backend& backend, DType activation, const Fp8Options& fp8, int64_t num_layers)
    : be_(backend), act_(activation), opt_(fp8), num_layers_(num_layers) {
  if (opt_.enabled && opt_.amax_history_len < 1)
    fail("fp8_amax_history_len must be at least 1, got {}", opt_.amax_history_len);
}

void Linears::declare(int weight, const std::string& name, int64_t layer) {
  if (!opt_.enabled || layer < opt_.bf16_layers_at_start || layer >= num_layers_ - opt_.bf16_layers_at_end) return;
  Scales s{name, {fp8::DelayedScale(opt_.amax_history_len), fp8::DelayedScale(opt_.amax_history_len),
                  fp8::DelayedScale(opt_.amax_history_len)}};
  state_.emplace(weight, std::move(s));
  order_.push_back(weight);
}

fp8::Granularity Linears::granularity(Operand op) const {
  switch (opt_.recipe) {
    case Fp8Recipe::Delayed:
    case Fp8Recipe::Tensorwise: return fp8::Granularity::Tensor;
    case Fp8Recipe::Blockwise: return op == W ? fp8::Granularity::Block128 : fp8::Granularity::Tile1x128;
    case Fp8Recipe::Mxfp8: return fp8::Granularity::Mx32;
  }
  return fp8::Granularity::Tensor;
}

float Linears::quantize(const Tensor& src, Operand op, int weight, bool reduce_cols, Tensor& dst) const {
  fp8::DelayedScale& d = state_.at(weight).operand[op];
  const bool delayed = opt_.recipe == Fp8Recipe::Delayed;
  const ops::Backend::Fp8Quantized q = be_.quantize_fp8(src, op == Dy ? opt_.backward : opt_.forward,
                                                        granularity(op), reduce_cols, delayed ? d.scale : 0.0f, dst);
  if (delayed) d.record(q.amax);
  return 1.0f / q.scale;
}

void Linears::forward(float alpha, const Tensor& x, const Tensor& W, int weight, float beta, const Tensor& C,
                      Tensor& D, const Tensor& bias) const {
  if (!fp8(weight)) return be_.gemm(false, true, alpha, x, W, beta, C, D, bias);
  Tensor xq = be_.empty(x.shape(), act_), wq = be_.empty(W.shape(), act_);
  const float sx = quantize(x, X, weight, true, xq), sw = quantize(W, Operand::W, weight, true, wq);
  be_.gemm(false, true, alpha * sx * sw, xq, wq, beta, C, D, bias);
}

void Linears::input_grad(float alpha, const Tensor& dy, const Tensor& W, int weight, float beta, const Tensor& C,
                         Tensor& D) const {
  if (!fp8(weight)) return be_.gemm(false, false, alpha, dy, W, beta, C, D, Tensor());
  Tensor dyq = be_.empty(dy.shape(), act_), wq = be_.empty(W.shape(), act_);
  const float sd = quantize(dy, Dy, weight, true, dyq), sw = quantize(W, Operand::W, weight, false, wq);
  be_.gemm(false, false, alpha * sd * sw, dyq, wq, beta, C, D, Tensor());
}

void Linears::weight_grad(float alpha, const Tensor& dy, const Tensor& x, int weight, Tensor& gW) const {
  if (!fp8(weight) || !opt_.wgrad) return be_.gemm(true, false, alpha, dy, x, 1.0f, gW, gW, Tensor());
  Tensor dyq = be_.empty(dy.shape(), act_), xq = be_.empty(x.shape(), act_);
  const float sd = quantize(dy, Dy, weight, false, dyq), sx = quantize(x, X, weight, false, xq);
  be_.gemm(true, false, alpha * sd * sx, dyq, xq, 1.0f, gW, gW, Tensor());
}

std::vector<float> Linears::current_amaxes() const {
  std::vector<float> v;
  v.reserve(order_.size() * 3);
  for (int w : order_)
    for (const auto& d : state_.at(w).operand) v.push_back(d.history[0]);
  return v;
}

void Linears::update_scales(const std::vector<float>& amaxes) {
  PRIMUS_CHECK(amaxes.size() == order_.size() * 3, "update_scales: {} amaxes for {} FP8 linears", amaxes.size(),
               order_.size());
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
  for (int w : order_)
    for (auto& d : state_.at(w).operand) d.history[0] = 0.0f;
}

}  // namespace primus
