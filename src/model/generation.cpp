#include "model/generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/rng.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "model/rope.h"

namespace primus {

using namespace cpu;

KVCacheDecoder::KVCacheDecoder(const LlamaModel<float>& model, int64_t max_positions)
    : model_(model), s_(model.spec()), max_pos_(std::min(max_positions, model.spec().max_position_embeddings)) {
  if (max_pos_ <= 0) fail("a decoder needs room for at least one position");
  const int64_t L = s_.num_layers, KV = s_.kv_size(), D = s_.head_dim();
  k_cache_.resize(size_t(L * max_pos_ * KV));
  v_cache_.resize(size_t(L * max_pos_ * KV));
  cos_.resize(size_t(max_pos_ * D / 2));
  sin_.resize(size_t(max_pos_ * D / 2));
  rope_tables_of(s_, max_pos_, cos_.data(), sin_.data());
}

const std::vector<float>& KVCacheDecoder::step(int32_t token) {
  if (pos_ >= max_pos_) fail("the decoder's cache is full ({} positions)", max_pos_);
  const auto& p = model_.params();
  auto W = [&](const std::string& name) {
    const int id = p.find(name);
    PRIMUS_CHECK(id >= 0, "no parameter {}", name);
    return static_cast<const float*>(p.value(id));
  };
  const int64_t C = s_.hidden_size, F = s_.ffn_hidden_size, Q = s_.qkv_size(), QS = s_.q_size(), KV = s_.kv_size();
  const int64_t H = s_.num_attention_heads, G = s_.query_groups(), D = s_.head_dim(), V = s_.vocab_size;
  x_.resize(C);
  h_.resize(C);
  qkv_.resize(Q);
  attn_.resize(QS);
  gu_.resize(2 * F);
  act_.resize(F);
  scores_.resize(pos_ + 1);
  logits_.resize(V);
  float rstd;
  embedding_forward(&token, W("embedding.word_embeddings.weight"), x_.data(), 1, V, C);
  for (int64_t l = 0; l < s_.num_layers; ++l) {
    const std::string pre = fmt::format("decoder.layers.{}.", l);
    rmsnorm_forward(x_.data(), W(pre + "input_layernorm.weight"), h_.data(), &rstd, 1, C, s_.norm_epsilon);
    const int bias = p.find(pre + "self_attention.linear_qkv.bias");
    linear_forward(h_.data(), W(pre + "self_attention.linear_qkv.weight"), bias >= 0 ? p.value(bias) : nullptr,
                   qkv_.data(), 1, C, Q);
    rope_apply(qkv_.data(), 1, Q, H + G, D, 1, pos_, cos_.data(), sin_.data(), false);
    float* kc = &k_cache_[size_t(l * max_pos_ * KV)];
    float* vc = &v_cache_[size_t(l * max_pos_ * KV)];
    std::copy(qkv_.begin() + QS, qkv_.begin() + QS + KV, kc + pos_ * KV);
    std::copy(qkv_.begin() + QS + KV, qkv_.end(), vc + pos_ * KV);
    const float scale = 1.0f / std::sqrt(float(D));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      const float* q = &qkv_[h * D];
      float mx = -INFINITY;
      for (int64_t t = 0; t <= pos_; ++t) {
        float d = 0;
        for (int64_t k = 0; k < D; ++k) d += q[k] * kc[t * KV + g * D + k];
        scores_[t] = d * scale;
        mx = std::max(mx, scores_[t]);
      }
      float z = 0;
      for (int64_t t = 0; t <= pos_; ++t) z += (scores_[t] = std::exp(scores_[t] - mx));
      float* o = &attn_[h * D];
      std::fill(o, o + D, 0.0f);
      for (int64_t t = 0; t <= pos_; ++t)
        for (int64_t k = 0; k < D; ++k) o[k] += scores_[t] / z * vc[t * KV + g * D + k];
    }
    linear_forward(attn_.data(), W(pre + "self_attention.linear_proj.weight"), static_cast<const float*>(nullptr),
                   x_.data(), 1, QS, C, true);
    rmsnorm_forward(x_.data(), W(pre + "pre_mlp_layernorm.weight"), h_.data(), &rstd, 1, C, s_.norm_epsilon);
    linear_forward(h_.data(), W(pre + "mlp.linear_fc1.weight"), static_cast<const float*>(nullptr), gu_.data(), 1, C,
                   2 * F);
    swiglu_forward(gu_.data(), act_.data(), 1, F);
    linear_forward(act_.data(), W(pre + "mlp.linear_fc2.weight"), static_cast<const float*>(nullptr), x_.data(), 1, F,
                   C, true);
  }
  rmsnorm_forward(x_.data(), W("decoder.final_layernorm.weight"), h_.data(), &rstd, 1, C, s_.norm_epsilon);
  const char* out_name =
      s_.untie_embeddings_and_output_weights ? "output_layer.weight" : "embedding.word_embeddings.weight";
  linear_forward(h_.data(), W(out_name), static_cast<const float*>(nullptr), logits_.data(), 1, C, V);
  pos_ += 1;
  return logits_;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& opt, Rng& rng) {
  const int64_t V = int64_t(logits.size());
  if (opt.temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> prob(V);
  double z = 0;
  for (int64_t i = 0; i < V; ++i) z += (prob[i] = std::exp((logits[i] - mx) / opt.temperature));
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
  // Keep the smallest prefix whose mass reaches top_p, then draw within it.
  double kept = 0;
  int64_t n = 0;
  while (n < V && (n == 0 || kept < opt.top_p * z)) kept += prob[order[n++]];
  double u = rng.uniform() * kept;
  for (int64_t i = 0; i < n; ++i) {
    u -= prob[order[i]];
    if (u <= 0) return order[i];
  }
  return order[n - 1];
}

std::vector<int32_t> KVCacheDecoder::generate(const std::vector<int32_t>& prompt, int64_t max_new,
                                              const SamplingOptions& opt, int32_t stop_token,
                                              const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) fail("generation needs a prompt of at least one token");
  if (int64_t(prompt.size()) > max_pos_)
    fail("the prompt has {} tokens; the model takes at most {}", prompt.size(), max_pos_);
  const std::vector<float>* logits = nullptr;
  for (int32_t t : prompt) logits = &step(t);
  Rng rng(opt.seed);
  std::vector<int32_t> out;
  while (int64_t(out.size()) < max_new) {
    const int32_t next = sample_token(*logits, opt, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (next == stop_token || pos_ >= max_pos_) break;
    logits = &step(next);
  }
  return out;
}

}  // namespace primus
