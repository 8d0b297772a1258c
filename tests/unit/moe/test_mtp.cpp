// Multi-token prediction (mtp_num_layers, docs/model_math.md#multi-token-prediction): gradients of
// the whole objective against finite differences in double (every tensor, the MTP ones included),
// the loss against a reference built from plain models, the layout's names, bf16 and recompute,
// and a tiny MLA + MoE model with MTP learning.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/grad_check.h"
#include "core/rng.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/reference_backend.h"
#include "model/llama.h"

using namespace primus;

namespace {

ModelSpec tiny_dense(int64_t depths) {
  ModelSpec s;
  s.name = "tiny-mtp";
  s.num_layers = 2;
  s.hidden_size = 8;
  s.ffn_hidden_size = 12;
  s.num_attention_heads = 2;
  s.vocab_size = 7;
  s.max_position_embeddings = 8;
  s.init_method_std = 0.4;
  s.untie_embeddings_and_output_weights = true;
  s.mtp_num_layers = depths;
  s.mtp_loss_scaling_factor = 0.3;
  return s;
}

// DeepSeek-V3's kind: MLA, a dense first layer, MoE (shared expert, sigmoid routing) after it.
ModelSpec tiny_mla_moe(int64_t depths) {
  ModelSpec s = tiny_dense(depths);
  s.multi_latent_attention = true;
  s.q_lora_rank = 5;
  s.kv_lora_rank = 6;
  s.qk_head_dim = 3;
  s.qk_pos_emb_head_dim = 4;
  s.v_head_dim = 5;
  s.qk_layernorm = true;
  s.num_experts = 4;
  s.moe_ffn_hidden_size = 6;
  s.moe_router_topk = 2;
  s.moe_layer_pattern = {0, 1};
  s.moe_shared_expert_intermediate_size = 6;
  s.moe_router_score_function = "sigmoid";
  s.moe_router_enable_expert_bias = true;
  s.moe_aux_loss_coeff = 0.1;
  return s;
}

struct Batch {
  int64_t b, s;
  std::vector<int32_t> tokens, targets;
};

Batch make_batch(int64_t b, int64_t s, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  Batch x{b, s, std::vector<int32_t>(size_t(b * s)), std::vector<int32_t>(size_t(b * s))};
  for (auto& t : x.tokens) t = int32_t(rng.next_u64() % uint64_t(vocab));
  for (auto& t : x.targets) t = int32_t(rng.next_u64() % uint64_t(vocab));
  x.targets[3] = -1;  // a masked target: masked in every depth that reaches it
  return x;
}

// What the backward differentiates: the main loss, the scaled MTP losses, the router losses.
double objective(LlamaModel& m, const Batch& x) {
  m.reset_moe_stats();
  LlamaContext c;
  double loss = m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s);
  const ModelSpec& s = m.spec();
  for (double l : m.mtp_losses(c)) loss += s.mtp_loss_scaling_factor / double(s.mtp_num_layers) * l;
  for (const auto& st : m.moe_stats()) loss += st.aux_loss + st.z_loss;
  return loss;
}

void check_grads(const ModelSpec& spec) {
  LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp64);
  m.init_weights(5);
  const Batch x = make_batch(2, 5, spec.vocab_size, 9);
  m.params().zero_grad();
  LlamaContext ctx;
  m.forward(ctx, x.tokens.data(), x.targets.data(), x.b, x.s);
  ASSERT_EQ(m.mtp_losses(ctx).size(), size_t(spec.mtp_num_layers));
  m.backward(ctx, 1.0);
  const double* g = m.params().grads().data<double>();
  const std::vector<double> analytic(g, g + m.params().numel());
  double* values = m.params().values().data<double>();
  int mtp_checked = 0;
  for (const auto& info : m.params().infos()) {
    if (info.name.find("expert_bias") != std::string::npos) continue;  // a buffer
    for (int64_t i = 0; i < info.numel; ++i) {
      const double num = test::numeric_grad(values + info.offset + i, [&] { return objective(m, x); });
      ASSERT_NEAR(analytic[size_t(info.offset + i)], num, 1e-8 + 1e-6 * std::fabs(num))
          << info.name << "[" << i << "]";
      mtp_checked += info.name.starts_with("mtp.");
    }
  }
  EXPECT_GT(mtp_checked, 0);
}

// Copies the tensors of `from` named `from_name` into `to`'s `to_name` (fp64 models on the CPU).
void copy_param(const LlamaModel& from, const std::string& from_name, LlamaModel& to, const std::string& to_name) {
  const auto& a = from.params().infos()[size_t(from.params().find(from_name))];
  const int j = to.params().find(to_name);
  ASSERT_GE(j, 0) << to_name;
  const auto& b = to.params().infos()[size_t(j)];
  ASSERT_EQ(a.numel, b.numel) << from_name;
  const double* src = from.params().values().data<double>() + a.offset;
  std::copy(src, src + a.numel, to.params().values().data<double>() + b.offset);
}

// Host rows of an fp64 tensor.
std::vector<double> host(const Tensor& t) {
  const Tensor h = t.to(Device::CPU);
  return std::vector<double>(h.data<double>(), h.data<double>() + h.numel());
}

// x / rms(x) * w per row of C.
std::vector<double> rmsnorm(const std::vector<double>& x, const double* w, int64_t C, double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / size_t(C); ++r) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[r * C + c] * x[r * C + c];
    const double rstd = 1.0 / std::sqrt(ss / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = x[r * C + c] * rstd * w[c];
  }
  return y;
}

}  // namespace

TEST(Mtp, OneDepthGradientsMatchFiniteDifferences) { check_grads(tiny_dense(1)); }
TEST(Mtp, TwoDepthsGradientsMatchFiniteDifferences) { check_grads(tiny_dense(2)); }
TEST(Mtp, MlaMoeGradientsMatchFiniteDifferences) { check_grads(tiny_mla_moe(1)); }

TEST(Mtp, TiedEmbeddingGradientsMatchFiniteDifferences) {
  ModelSpec s = tiny_dense(1);
  s.untie_embeddings_and_output_weights = false;
  check_grads(s);
}

// The loss, depth by depth, from plain models: the main model without MTP gives the main loss and
// the final normed hidden states h_0; depth k's layer and head are a one-layer model without an
// embedding, fed eh_proj [enorm(embedding of the tokens k + 1 ahead), hnorm(h_k)] computed here,
// against the targets k + 1 ahead; its normed output is h_{k+1}.
TEST(Mtp, LossEqualsMainPlusScaledDepthsOfAPlainReference) {
  for (const ModelSpec& spec : {tiny_dense(2), tiny_mla_moe(2)}) {
    LlamaModel m(spec, cpu::cpu_backend(), Precision::Fp64);
    m.init_weights(3);
    const Batch x = make_batch(2, 5, spec.vocab_size, 4);
    LlamaContext c;
    const double main_loss = m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s);
    const std::vector<double> depth_losses = m.mtp_losses(c);

    ModelSpec plain = spec;
    plain.mtp_num_layers = 0;
    LlamaModel p(plain, cpu::cpu_backend(), Precision::Fp64);
    for (const auto& info : p.params().infos()) copy_param(m, info.name, p, info.name);
    LlamaContext pc;
    EXPECT_EQ(p.forward(pc, x.tokens.data(), x.targets.data(), x.b, x.s), main_loss);

    const int64_t C = spec.hidden_size, B = x.b, S = x.s, L = spec.num_layers;
    std::vector<double> h = host(pc.head.hn);
    const auto weight = [&](const std::string& name) {
      return m.params().values().data<double>() + m.params().infos()[size_t(m.params().find(name))].offset;
    };
    ModelSpec one = spec;
    one.num_layers = 1;
    one.mtp_num_layers = 0;
    if (!one.moe_layer_pattern.empty()) one.moe_layer_pattern = {spec.moe_layer_pattern.back()};
    ModelPartition no_embedding;
    no_embedding.chunks.push_back({0, 1, false, true});
    for (int64_t k = 0; k < spec.mtp_num_layers; ++k) {
      const std::string pre = "mtp.layers." + std::to_string(k) + ".";
      // The inputs ahead of each row (zero token, masked target past the end).
      std::vector<int32_t> targets(size_t(B * S));
      std::vector<double> e(size_t(B * S * C));
      const double* table = weight("embedding.word_embeddings.weight");
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t j = i + k + 1;
          const int32_t token = j < S ? x.tokens[size_t(b * S + j)] : 0;
          targets[size_t(b * S + i)] = j < S ? x.targets[size_t(b * S + j)] : -1;
          std::copy(table + token * C, table + (token + 1) * C, e.begin() + (b * S + i) * C);
        }
      const std::vector<double> en = rmsnorm(e, weight(pre + "enorm.weight"), C, spec.norm_epsilon);
      const std::vector<double> hn = rmsnorm(h, weight(pre + "hnorm.weight"), C, spec.norm_epsilon);
      Tensor u = Tensor::empty({B * S, C}, DType::F64);
      const double* W = weight(pre + "eh_proj.weight");  // [C, 2C]: the embedding's half first
      for (int64_t r = 0; r < B * S; ++r)
        for (int64_t o = 0; o < C; ++o) {
          double acc = 0;
          for (int64_t c2 = 0; c2 < C; ++c2) acc += W[o * 2 * C + c2] * en[r * C + c2] + W[o * 2 * C + C + c2] * hn[r * C + c2];
          u.data<double>()[r * C + o] = acc;
        }
      LlamaModel layer(one, cpu::cpu_backend(), Precision::Fp64, {}, no_embedding);
      for (const auto& info : layer.params().infos()) {
        std::string from = info.name;
        if (from.starts_with("decoder.layers.0."))
          from = pre + "transformer_layer." + from.substr(std::string("decoder.layers.0.").size());
        else if (from == "decoder.final_layernorm.weight")
          from = pre + "final_layernorm.weight";
        copy_param(m, from, layer, info.name);
      }
      LlamaContext lc;
      layer.begin_microbatch(lc, x.tokens.data(), targets.data(), B, S);
      layer.forward_chunk(lc, 0, u);
      EXPECT_NEAR(depth_losses[size_t(k)], lc.loss, 1e-12) << spec.name << " depth " << k;
      EXPECT_NE(depth_losses[size_t(k)], main_loss);
      h = host(lc.head.hn);
    }
    (void)L;
  }
}

// The layout model_parameter_layout describes (checkpoints, analyze model) is the model's, in its
// order, with Megatron's names for the MTP tensors.
TEST(Mtp, LayoutMatchesTheModelsTensorsInOrder) {
  const ModelSpec s = tiny_mla_moe(2);
  LlamaModel m(s, cpu::cpu_backend(), Precision::Fp32);
  const std::vector<ParamInfo> layout = model_parameter_layout(s);
  ASSERT_EQ(layout.size(), m.params().infos().size());
  for (size_t i = 0; i < layout.size(); ++i) {
    EXPECT_EQ(layout[i].name, m.params().infos()[i].name);
    EXPECT_EQ(layout[i].numel, m.params().infos()[i].numel) << layout[i].name;
  }
  for (const char* name : {"mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.0.eh_proj.weight",
                           "mtp.layers.1.transformer_layer.self_attention.linear_kv_down_proj.weight",
                           "mtp.layers.1.transformer_layer.mlp.router.weight",
                           "mtp.layers.1.transformer_layer.mlp.experts.local_experts.3.linear_fc2.weight",
                           "mtp.layers.1.final_layernorm.weight"})
    EXPECT_GE(m.params().find(name), 0) << name;
  const ModelStats st = model_stats(s, 8), main = model_stats(tiny_mla_moe(0), 8);
  EXPECT_EQ(st.parameters, main.parameters + st.mtp_parameters);
  EXPECT_GT(st.mtp_parameters, 0);
  EXPECT_NEAR(st.flops_per_token, main.flops_per_token + st.mtp_flops_per_token, 1e-6 * st.flops_per_token);
  EXPECT_EQ(st.layers.back().name, "mtp.layers.1");
}

// Recompute (selective, full) and the split B / W passes give the fused backward's gradients.
TEST(Mtp, RecomputeAndSplitPassesGiveTheSameGradients) {
  const ModelSpec s = tiny_mla_moe(2);
  const Batch x = make_batch(2, 5, s.vocab_size, 9);
  LlamaModel ref(s, cpu::cpu_backend(), Precision::Fp64);
  ref.init_weights(5);
  ref.params().zero_grad();
  LlamaContext rc;
  ref.forward(rc, x.tokens.data(), x.targets.data(), x.b, x.s);
  ref.backward(rc, 0.5);
  const std::vector<double> want = host(ref.params().grads());
  for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
    LlamaOptions o;
    o.recompute = r;
    LlamaModel m(s, cpu::cpu_backend(), Precision::Fp64, o);
    m.init_weights(5);
    m.params().zero_grad();
    LlamaContext c;
    m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s);
    m.backward_input(c, 0.5);
    m.backward_weight(c);
    const std::vector<double> got = host(m.params().grads());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12 + 1e-10 * std::fabs(want[i])) << i;
  }
}

// bf16 mixed precision (the CPU bf16 backend and the reference backend) follows fp32 at bf16's
// resolution, the MTP losses included, and its gradients point the same way.
TEST(Mtp, Bf16FollowsFp32) {
  ModelSpec s = tiny_mla_moe(1);
  s.hidden_size = 32;
  s.num_attention_heads = 4;
  s.init_method_std = 0.02;
  s.vocab_size = 64;
  const Batch x = make_batch(2, 8, s.vocab_size, 2);
  LlamaModel f(s, cpu::cpu_backend(), Precision::Fp32);
  f.init_weights(4);
  LlamaContext fc;
  const double fl = f.forward(fc, x.tokens.data(), x.targets.data(), x.b, x.s);
  const double fm = f.mtp_losses(fc).at(0);
  f.params().zero_grad();
  f.backward(fc, 1.0);
  cpu::Bf16Backend fast;
  cpu::ReferenceBackend ref;
  for (ops::Backend* be : {static_cast<ops::Backend*>(&fast), static_cast<ops::Backend*>(&ref)}) {
    LlamaModel m(s, *be, Precision::Bf16);
    m.init_weights(4);
    LlamaContext c;
    EXPECT_NEAR(m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s), fl, 0.01 * fl) << be->name();
    EXPECT_NEAR(m.mtp_losses(c).at(0), fm, 0.01 * fm) << be->name();
    m.params().zero_grad();
    m.backward(c, 1.0);
    const float* ga = f.params().grads().data<float>();
    const float* gb = m.params().grads().data<float>();
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < f.params().numel(); ++i) {
      dot += double(ga[i]) * gb[i];
      na += double(ga[i]) * ga[i];
      nb += double(gb[i]) * gb[i];
    }
    EXPECT_GT(dot / std::sqrt(na * nb), 0.99) << be->name();
  }
}

// A tiny MLA + MoE model with two MTP depths learns a repeating sequence: the main and the MTP
// losses fall (plain SGD on the gradients of the whole objective).
TEST(Mtp, MlaMoeWithMtpLearnsARepeatingSequence) {
  ModelSpec s = tiny_mla_moe(2);
  s.max_position_embeddings = 16;
  LlamaModel m(s, cpu::cpu_backend(), Precision::Fp32);
  m.init_weights(1);
  Batch x{2, 12, {}, {}};
  for (int64_t b = 0; b < x.b; ++b)
    for (int64_t i = 0; i <= x.s; ++i) {
      const int32_t t = int32_t((i + b) % 5);
      if (i < x.s) x.tokens.push_back(t);
      if (i > 0) x.targets.push_back(t);
    }
  std::vector<double> first, last;
  for (int step = 0; step < 60; ++step) {
    m.params().zero_grad();
    LlamaContext c;
    std::vector<double> l = {m.forward(c, x.tokens.data(), x.targets.data(), x.b, x.s)};
    for (double d : m.mtp_losses(c)) l.push_back(d);
    if (step == 0) first = l;
    last = l;
    m.backward(c, 1.0);
    float* w = m.params().values().data<float>();
    const float* g = m.params().grads().data<float>();
    for (int64_t i = 0; i < m.params().numel(); ++i) w[i] -= 0.5f * g[i];
  }
  ASSERT_EQ(first.size(), 3u);
  for (size_t k = 0; k < 3; ++k) EXPECT_LT(last[k], 0.5 * first[k]) << "loss " << k;
}

// Decoding ignores the depths: a model with MTP decodes the logits of the same model without it.
TEST(Mtp, DecodingIgnoresTheDepths) {
  const ModelSpec s = tiny_dense(2);
  ModelSpec plain = s;
  plain.mtp_num_layers = 0;
  LlamaModel m(s, cpu::cpu_backend(), Precision::Fp64), p(plain, cpu::cpu_backend(), Precision::Fp64);
  m.init_weights(6);
  for (const auto& info : p.params().infos()) copy_param(m, info.name, p, info.name);
  const std::vector<int32_t> prompt = {1, 4, 2, 6};
  DecodeState a = m.start_decoding(8), b = p.start_decoding(8);
  const std::vector<float> la = m.decode(a, prompt), lb = p.decode(b, prompt);
  ASSERT_EQ(la.size(), size_t(s.vocab_size));
  EXPECT_EQ(la, lb);
  LlamaContext c;  // a forward without targets (inference) runs no depth
  m.forward(c, prompt.data(), nullptr, 1, 4);
  EXPECT_TRUE(m.mtp_losses(c).empty());
}
