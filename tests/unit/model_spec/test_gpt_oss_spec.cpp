// gpt-oss's keys of a model spec (Megatron's softmax_type, window_size, window_attn_skip_freq,
// position_embedding_type yarn and the yarn_* keys): the layers on the window, the sinks counted
// as parameters, the FLOPs of windowed layers, YaRN's tables, the presets' counts, and the errors
// that name the key.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/model_spec.h"
#include "model/rope.h"
#include "support/error_of.h"

using namespace primus;

namespace {

using test::error_of;

ModelSpec tiny(const std::string& extra) {
  const std::string base =
      "num_layers: 4\nhidden_size: 32\nffn_hidden_size: 64\nnum_attention_heads: 4\nnum_query_groups: 2\n"
      "vocab_size: 100\nmax_position_embeddings: 512\n";
  ModelSpec s = model_spec_from_yaml(YAML::Load(base), "oss.yaml");
  if (!extra.empty()) apply_model_keys(s, YAML::Load(extra), "oss.yaml");
  s.name = "oss";
  return s;
}

}  // namespace

// Megatron's rule (transformer/utils.py, is_layer_window_attention): an integer N puts layers
// N, 2N, ... (1-based) on full attention; a list gives each layer, 1 the window.
TEST(GptOssSpec, WindowedLayersFollowMegatronsRule) {
  const ModelSpec every = tiny("window_size: [128, 0]\n");
  for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(every.layer_window(l), 128);
  const ModelSpec alternate = tiny("window_size: [128, 0]\nwindow_attn_skip_freq: 2\n");
  EXPECT_EQ(alternate.layer_window(0), 128);
  EXPECT_EQ(alternate.layer_window(1), -1);
  EXPECT_EQ(alternate.layer_window(2), 128);
  EXPECT_EQ(alternate.layer_window(3), -1);
  const ModelSpec listed = tiny("window_size: [64, 0]\nwindow_attn_skip_freq: [0, 0, 1, 0]\n");
  EXPECT_EQ(listed.layer_window(0), -1);
  EXPECT_EQ(listed.layer_window(2), 64);
  EXPECT_EQ(tiny("window_attn_skip_freq: 2\n").layer_window(0), -1);  // no window_size: none
  EXPECT_EQ(tiny("window_size: null\n").layer_window(0), -1);
  // The resolved spec writes the keys back in the form they load from.
  const YAML::Node back = model_spec_to_yaml(listed);
  EXPECT_EQ(back["window_size"][0].as<int64_t>(), 64);
  EXPECT_EQ(back["window_attn_skip_freq"].size(), 4u);
}

TEST(GptOssSpec, LearnedSinksAreOneParameterPerHeadAndLayer) {
  const ModelStats plain = model_stats(tiny(""), 256);
  const ModelStats sinks = model_stats(tiny("softmax_type: learnable\n"), 256);
  EXPECT_EQ(sinks.parameters, plain.parameters + 4 * 4);
  EXPECT_EQ(sinks.active_parameters, plain.active_parameters + 4 * 4);
  EXPECT_EQ(model_stats(tiny("softmax_type: off-by-one\n"), 256).parameters, plain.parameters);  // a fixed 0
  bool found = false;
  for (const auto& p : model_parameter_layout(tiny("softmax_type: learnable\n")))
    found |= p.name == "decoder.layers.3.self_attention.core_attention.softmax_offset" && p.numel == 4;
  EXPECT_TRUE(found);
}

// A window of w over s positions leaves (s - w - 1)(s - w) / 2 of the s^2 / 2 causal pairs unseen:
// the attention core's FLOPs of a windowed layer shrink by that share, the others stay.
TEST(GptOssSpec, WindowedLayersCountTheKeysTheySee) {
  const double s = 256, w = 32;
  const ModelStats full = model_stats(tiny(""), 256);
  const ModelStats win = model_stats(tiny("window_size: [32, 0]\nwindow_attn_skip_freq: 2\n"), 256);
  const double core = 6.0 * s * 4 * 8;  // 6 s q, q = heads x head_dim
  const double unseen = (s - w - 1) * (s - w) / 2 / (s * s / 2);
  EXPECT_NEAR(full.layers[1].flops_per_token - win.layers[1].flops_per_token, core * unseen, 1e-6);
  EXPECT_DOUBLE_EQ(full.layers[2].flops_per_token, win.layers[2].flops_per_token);
}

TEST(GptOssSpec, BadValuesAreRefusedByName) {
  EXPECT_NE(error_of([] { tiny("window_size: [128, 4]\n"); }).find("right = 0"), std::string::npos);
  EXPECT_NE(error_of([] { tiny("window_size: 128\n"); }).find("'window_size' must be null or a pair"),
            std::string::npos);
  EXPECT_NE(error_of([] { tiny("window_attn_skip_freq: [1, 2]\n"); }).find("must be 0 (full attention) or 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { tiny("window_size: [8, 0]\nwindow_attn_skip_freq: [1, 0]\n").validate(); })
                .find("lists 2 layers for num_layers 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { tiny("softmax_type: sigmoid\n").validate(); }).find("softmax_type must be vanilla"),
            std::string::npos);
}

// The presets are OpenAI's models: every tensor of the Hugging Face safetensors (MXFP4 experts
// counted unpacked) gives 20,914,757,184 and 116,829,156,672. OpenAI's active counts (3.61B and
// 5.13B, model card; no exact figure published) leave the output layer out; this engine's
// convention counts both embeddings, so ours are larger by one vocabulary x hidden matrix
// (201,088 x 2880 = 579,133,440) and round to OpenAI's without it.
TEST(GptOssSpec, PresetsCountOpenAIsParameters) {
  struct Published {
    const char* name;
    int64_t parameters, active;
    double openai_active_billions;
  };
  const int64_t output_layer = 201088LL * 2880;
  for (const Published& p : {Published{"gpt_oss_20B", 20'914'757'184, 4'187'440'704, 3.61},
                             Published{"gpt_oss_120B", 116'829'156'672, 5'711'982'912, 5.13}}) {
    SCOPED_TRACE(p.name);
    const ModelSpec s = load_model_spec(p.name);
    const ModelStats st = model_stats(s, 4096);
    EXPECT_EQ(st.parameters, p.parameters);
    EXPECT_EQ(st.active_parameters, p.active);
    EXPECT_EQ(st.embedding_parameters, 2 * output_layer);
    EXPECT_EQ(std::round(double(st.active_parameters - output_layer) / 1e7) / 100, p.openai_active_billions);
  }
}

// The 20B preset's layers: the window (128 keys: [127, 0]) on layers 0, 2, ... (1-based odd), sinks
// in every layer, the clamped GLU, YaRN on grouped-query attention; the 120B extends it.
TEST(GptOssSpec, PresetsHoldGptOssParts) {
  const ModelSpec s = load_model_spec("gpt_oss_20B");
  EXPECT_EQ(s.layer_window(0), 127);
  EXPECT_EQ(s.layer_window(1), -1);
  EXPECT_EQ(s.layer_window(22), 127);
  EXPECT_EQ(s.layer_window(23), -1);
  EXPECT_TRUE(s.learns_attention_sinks());
  EXPECT_TRUE(s.add_bias_linear);
  EXPECT_TRUE(s.quick_geglu);
  EXPECT_EQ(s.glu_linear_offset, 1.0);
  EXPECT_EQ(s.activation_func_clamp_value, 7.0);
  EXPECT_EQ(s.head_dim(), 64);
  const std::optional<Yarn> y = yarn_of(s);
  ASSERT_TRUE(y.has_value());
  EXPECT_EQ(y->factor, 32.0);
  EXPECT_EQ(y->original_max_position, 4096);
  EXPECT_FALSE(y->round_to_int);
  const ModelSpec big = load_model_spec("gpt_oss_120B");
  EXPECT_EQ(big.num_layers, 36);
  EXPECT_EQ(big.num_experts, 128);
  EXPECT_EQ(big.moe_router_topk, 4);
}

// YaRN on grouped-query attention as OpenAI's reference implementation writes it
// (gpt_oss/torch/model.py, _compute_concentration_and_inv_freq): concentration 0.1 ln 32 + 1 on
// cos and sin; pair i's frequency theta^(-2i/d) kept (i < low), divided by 32 (i > high), blended
// by (i - low) / (high - low) between, low/high = d/2 ln(4096 / (beta 2 pi)) / ln theta, not
// rounded; Megatron's and Hugging Face's definitions give the same numbers.
TEST(GptOssSpec, YarnTablesFollowOpenAIsFormula) {
  const ModelSpec s = load_model_spec("gpt_oss_20B");
  const int64_t d = 64, half = 32, P = 5000;
  std::vector<double> c(size_t(P * half)), sn(size_t(P * half));
  rope_tables_of(s, P, c.data(), sn.data());
  const double conc = 0.1 * std::log(32.0) + 1.0, theta = 150000;
  const double low = half * std::log(4096 / (32 * 2 * M_PI)) / std::log(theta);
  const double high = half * std::log(4096 / (1 * 2 * M_PI)) / std::log(theta);
  EXPECT_GT(low, 0);
  EXPECT_NE(low, std::floor(low));  // the unrounded range matters here
  for (int64_t i = 0; i < half; ++i) {
    const double freq = std::pow(theta, -2.0 * double(i) / double(d));
    const double mask = 1.0 - std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double inv = freq / 32 * (1 - mask) + freq * mask;
    for (const int64_t p : {int64_t(1), int64_t(4999)}) {
      EXPECT_NEAR(c[size_t(p * half + i)], std::cos(double(p) * inv) * conc, 1e-9) << i << " " << p;
      EXPECT_NEAR(sn[size_t(p * half + i)], std::sin(double(p) * inv) * conc, 1e-9) << i << " " << p;
    }
  }
  // Megatron's default rounds the range: other tables.
  ModelSpec rounded = s;
  rounded.yarn_correction_range_round_to_int = true;
  std::vector<double> c2(size_t(P * half)), s2(size_t(P * half));
  rope_tables_of(rounded, P, c2.data(), s2.data());
  EXPECT_NE(c2, c);
  // Plain rope with the same base: no concentration.
  ModelSpec rope = s;
  rope.position_embedding_type = "rope";
  rope_tables_of(rope, P, c2.data(), s2.data());
  EXPECT_DOUBLE_EQ(c2[0], 1.0);
  EXPECT_NEAR(c[0], conc, 1e-15);
}

TEST(GptOssSpec, BadYarnValuesAreRefusedByName) {
  EXPECT_NE(error_of([] {
              tiny("position_embedding_type: learned_absolute\n").validate();
            }).find("position_embedding_type must be rope or yarn"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              tiny("position_embedding_type: yarn\nrotary_scaling_factor: 0.5\n").validate();
            }).find("rotary_scaling_factor must be at least 1"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              tiny("position_embedding_type: yarn\nyarn_beta_fast: 1\nyarn_beta_slow: 2\n").validate();
            }).find("yarn_beta_fast (1) must be greater than yarn_beta_slow (2)"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              tiny("position_embedding_type: yarn\nuse_rope_scaling: true\n").validate();
            }).find("two rotary scalings"),
            std::string::npos);
}
