// ModelSpec: preset loading (extends, errors with file:line), validation, and the counts that
// must equal the published parameter numbers.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "core/error.h"
#include "model/model_spec.h"
#include "support/error_of.h"

using namespace primus;
namespace fs = std::filesystem;

namespace {

// A fresh folder per test (ctest runs test cases in parallel processes).
fs::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = fs::temp_directory_path() /
               (std::string("primus_spec_") + info->name() + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
}

using test::error_of;

const char* kValidTiny =
    "num_layers: 2\n"
    "hidden_size: 64\n"
    "ffn_hidden_size: 96\n"
    "num_attention_heads: 4\n"
    "num_query_groups: 2\n"
    "vocab_size: 256\n"
    "max_position_embeddings: 128\n";

}  // namespace

// ---------------------------------------------------------------------------------------------
// Presets against the published parameter counts (Hugging Face model cards / safetensors).

struct PresetCount {
  const char* name;
  int64_t parameters;
};

class PresetCounts : public ::testing::TestWithParam<PresetCount> {};

TEST_P(PresetCounts, EqualsPublished) {
  ModelSpec s = load_model_spec(GetParam().name);
  s.validate();
  ModelStats st = model_stats(s, std::min<int64_t>(s.max_position_embeddings, 4096));
  EXPECT_EQ(st.parameters, GetParam().parameters) << GetParam().name;
  EXPECT_EQ(st.parameters, st.embedding_parameters + st.non_embedding_parameters);
}

INSTANTIATE_TEST_SUITE_P(
    Presets, PresetCounts,
    ::testing::Values(PresetCount{"llama2_7B", 6'738'415'616}, PresetCount{"llama3_8B", 8'030'261'248},
                      PresetCount{"llama3.1_8B", 8'030'261'248}, PresetCount{"llama3.1_70B", 70'553'706'496},
                      PresetCount{"llama3.1_405B", 405'853'388'800}, PresetCount{"qwen2.5_7B", 7'615'616'512},
                      PresetCount{"qwen2.5_72B", 72'706'203'648}, PresetCount{"mistral_7B", 7'241'732'096},
                      PresetCount{"llama2c_15M", 15'191'712}, PresetCount{"llama_100M", 134'105'856},
                      PresetCount{"llama3.2_1B", 1'235'814'400}, PresetCount{"tiny", 94'528},
                      // Issue 18: the rest of Primus's dense Llama and Qwen2.5 examples.
                      PresetCount{"llama2_13B", 13'015'864'320}, PresetCount{"llama2_70B", 68'976'648'192},
                      PresetCount{"llama3.2_3B", 3'212'749'824}, PresetCount{"llama3_70B", 70'553'706'496},
                      PresetCount{"llama3.3_70B", 70'553'706'496}, PresetCount{"qwen2.5_3B", 3'085'938'688},
                      PresetCount{"qwen2.5_14B", 14'770'033'664}, PresetCount{"qwen2.5_32B", 32'763'876'352}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (char& c : n)
        if (c == '.') c = '_';
      return n;
    });

TEST(Presets, AllListed) {
  auto names = list_model_presets();
  for (const char* want : {"tiny", "llama2_7B", "llama3_8B", "llama3.1_8B", "llama3.1_70B", "llama3.1_405B",
                           "qwen2.5_7B", "qwen2.5_72B", "mistral_7B", "llama2c_15M", "llama_100M", "llama3.2_1B",
                           "llama2_13B", "llama2_70B", "llama3.2_3B", "llama3_70B", "llama3.3_70B", "qwen2.5_3B",
                           "qwen2.5_14B", "qwen2.5_32B"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
}

TEST(Presets, FamilyFacts) {
  ModelSpec l31 = load_model_spec("llama3.1_8B");  // extends llama3_8B
  EXPECT_EQ(l31.name, "llama3.1_8B");
  EXPECT_EQ(l31.vocab_size, 128256);
  EXPECT_EQ(l31.num_query_groups, 8);
  EXPECT_DOUBLE_EQ(l31.rotary_base, 500000.0);
  EXPECT_EQ(l31.max_position_embeddings, 131072);
  EXPECT_TRUE(l31.use_rope_scaling);
  EXPECT_DOUBLE_EQ(l31.rope_scaling_factor, 8.0);
  EXPECT_DOUBLE_EQ(l31.rope_low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(l31.rope_high_freq_factor, 4.0);
  EXPECT_EQ(l31.rope_original_max_position_embeddings, 8192);
  EXPECT_FALSE(load_model_spec("llama3_8B").use_rope_scaling);

  ModelSpec l405 = load_model_spec("llama3.1_405B");  // two levels of extends
  EXPECT_EQ(l405.num_layers, 126);
  EXPECT_EQ(l405.head_dim(), 128);
  EXPECT_TRUE(l405.use_rope_scaling);

  ModelSpec q7 = load_model_spec("qwen2.5_7B");
  EXPECT_TRUE(q7.add_qkv_bias);
  EXPECT_TRUE(q7.untie_embeddings_and_output_weights);
  EXPECT_EQ(q7.vocab_size, 152064);
  EXPECT_DOUBLE_EQ(q7.norm_epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(load_model_spec("qwen2.5_72B").norm_epsilon, 1e-5);

  ModelSpec s15 = load_model_spec("llama2c_15M");
  EXPECT_FALSE(s15.untie_embeddings_and_output_weights);
  ModelStats st = model_stats(s15, 256);
  EXPECT_EQ(st.embedding_parameters, 32000 * 288);  // tied: the output layer adds nothing
}

TEST(Presets, EmbeddingSplit) {
  ModelStats st = model_stats(load_model_spec("llama2_7B"), 4096);
  EXPECT_EQ(st.embedding_parameters, 2LL * 32000 * 4096);
  EXPECT_EQ(st.non_embedding_parameters, 6'738'415'616LL - 2LL * 32000 * 4096);
  // 6 * (non-embedding + logits matmul) + causal attention 6 * L * s * q_size.
  EXPECT_DOUBLE_EQ(st.flops_per_token, 42'865'287'168.0);
}

TEST(Presets, UnknownNameSuggests) {
  std::string e = error_of([] { load_model_spec("llama3_8b"); });
  EXPECT_NE(e.find("unknown model preset 'llama3_8b'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'llama3_8B'"), std::string::npos) << e;
}

TEST(Presets, ConfigDirFromEnvironment) {
  fs::path d = temp_dir();
  fs::create_directories(d / "models");
  write(d / "models" / "mine.yaml", "extends: base.yaml\nnum_layers: 3\n");
  write(d / "models" / "base.yaml", kValidTiny);
  ::setenv("PRIMUS_CONFIG_DIR", d.c_str(), 1);
  EXPECT_EQ(model_preset_dir(), (d / "models").string());
  ModelSpec s = load_model_spec("mine");
  auto names = list_model_presets();
  ::unsetenv("PRIMUS_CONFIG_DIR");
  EXPECT_EQ(s.num_layers, 3);
  EXPECT_EQ(names, (std::vector<std::string>{"base", "mine"}));
  EXPECT_NE(model_preset_dir(), (d / "models").string());
}

// ---------------------------------------------------------------------------------------------
// Counting conventions on the tiny model, written out by hand.

TEST(Stats, TinyByHand) {
  ModelSpec s = load_model_spec("tiny");
  ASSERT_EQ(s.head_dim(), 16);
  ASSERT_EQ(s.q_size(), 64);
  ASSERT_EQ(s.kv_size(), 32);
  ASSERT_EQ(s.qkv_size(), 128);
  // Per layer: norm 64 + qkv 128*64 + proj 64*64 + norm 64 + fc1 192*64 + fc2 64*96 = 30848.
  const int64_t layer = 64 + 128 * 64 + 64 * 64 + 64 + 192 * 64 + 64 * 96;
  ASSERT_EQ(layer, 30848);
  ModelStats st = model_stats(s, 128);
  EXPECT_EQ(st.parameters, 256 * 64 + 2 * layer + 64 + 256 * 64);
  EXPECT_EQ(st.embedding_parameters, 2 * 256 * 64);
  EXPECT_EQ(st.non_embedding_parameters, 2 * layer + 64);
  // 6 * (61760 + 256*64) + 6 * 2 layers * 128 seq * 64 q_size.
  EXPECT_DOUBLE_EQ(st.flops_per_token, 6.0 * (61760 + 16384) + 6.0 * 2 * 128 * 64);
  // 4 bytes * (4h + 2 + qkv + q + heads + 3 ffn) per layer + 4 * (h + 1) for the final norm.
  EXPECT_DOUBLE_EQ(st.activation_bytes_per_token, 2 * 4.0 * (256 + 2 + 128 + 64 + 4 + 288) + 4.0 * 65);

  // Rows: embedding, 2 decoder layers, final norm, output layer; they add up to the totals.
  ASSERT_EQ(st.layers.size(), 5u);
  EXPECT_EQ(st.layers[0].name, "embedding");
  EXPECT_EQ(st.layers[1].name, "decoder.layers.0");
  EXPECT_EQ(st.layers[1].parameters, layer);
  EXPECT_DOUBLE_EQ(st.layers[1].flops_per_token, 6.0 * layer + 6.0 * 128 * 64);
  EXPECT_EQ(st.layers[4].name, "output_layer");
  EXPECT_DOUBLE_EQ(st.layers[4].flops_per_token, 6.0 * 256 * 64);
  int64_t p = 0;
  double f = 0;
  for (const auto& l : st.layers) p += l.parameters, f += l.flops_per_token;
  EXPECT_EQ(p, st.parameters);
  EXPECT_DOUBLE_EQ(f, st.flops_per_token);

  // Attention FLOPs grow linearly with the sequence.
  EXPECT_DOUBLE_EQ(model_stats(s, 64).flops_per_token, st.flops_per_token - 6.0 * 2 * 64 * 64);
}

TEST(Stats, TiedOutputStillCountsLogitsFlops) {
  ModelSpec s = load_model_spec("tiny");
  ModelStats untied = model_stats(s, 32);
  s.untie_embeddings_and_output_weights = false;
  ModelStats tied = model_stats(s, 32);
  EXPECT_EQ(untied.parameters - tied.parameters, 256 * 64);
  EXPECT_EQ(tied.non_embedding_parameters, untied.non_embedding_parameters);
  EXPECT_DOUBLE_EQ(tied.flops_per_token, untied.flops_per_token);
  EXPECT_EQ(tied.layers.back().parameters, 0);
}

TEST(Stats, QkvBiasAndKvChannels) {
  ModelSpec s = load_model_spec("tiny");
  s.add_qkv_bias = true;
  EXPECT_EQ(model_stats(s, 16).parameters, 94'528 + 2 * 128);
  // kv_channels decouples head width from hidden_size / heads.
  s.add_qkv_bias = false;
  s.kv_channels = 32;  // q_size 128, kv_size 64, qkv 256
  const int64_t layer = 64 + 256 * 64 + 64 * 128 + 64 + 192 * 64 + 64 * 96;
  EXPECT_EQ(model_stats(s, 16).parameters, 2 * 256 * 64 + 2 * layer + 64);
}

TEST(Stats, OverflowIsAnError) {
  ModelSpec s = load_model_spec("tiny");
  s.vocab_size = int64_t(1) << 40;
  s.hidden_size = int64_t(1) << 30;  // V * h = 2^70
  s.num_attention_heads = 1;
  s.num_query_groups = 1;
  std::string e = error_of([&] { model_stats(s, 16); });
  EXPECT_NE(e.find("2^63"), std::string::npos) << e;
}

TEST(Stats, RejectsBadSeqLength) {
  ModelSpec s = load_model_spec("tiny");
  EXPECT_NE(error_of([&] { model_stats(s, 0); }).find("seq_length"), std::string::npos);
  std::string e = error_of([&] { model_stats(s, 129); });
  EXPECT_NE(e.find("max_position_embeddings"), std::string::npos) << e;
}

TEST(Layout, NamesOrderAndDecay) {
  ModelSpec s = load_model_spec("qwen2.5_7B");
  s.num_layers = 1;
  auto layout = model_parameter_layout(s);
  std::vector<std::string> names;
  for (const auto& p : layout) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "embedding.word_embeddings.weight", "decoder.layers.0.input_layernorm.weight",
                       "decoder.layers.0.self_attention.linear_qkv.weight",
                       "decoder.layers.0.self_attention.linear_qkv.bias",
                       "decoder.layers.0.self_attention.linear_proj.weight",
                       "decoder.layers.0.pre_mlp_layernorm.weight", "decoder.layers.0.mlp.linear_fc1.weight",
                       "decoder.layers.0.mlp.linear_fc2.weight", "decoder.final_layernorm.weight",
                       "output_layer.weight"}));
  EXPECT_EQ(layout[2].shape, (std::vector<int64_t>{3584 + 2 * 512, 3584}));
  EXPECT_EQ(layout[4].shape, (std::vector<int64_t>{3584, 3584}));
  EXPECT_EQ(layout[6].shape, (std::vector<int64_t>{2 * 18944, 3584}));
  EXPECT_EQ(layout[7].shape, (std::vector<int64_t>{3584, 18944}));
  for (const auto& p : layout) EXPECT_EQ(p.weight_decay, p.shape.size() == 2) << p.name;
}

// ---------------------------------------------------------------------------------------------
// Loading: extends, and errors that name the key, the file and the line.

TEST(Load, ExtendsByPathAndByNameChildOverrides) {
  fs::path d = temp_dir();
  write(d / "base.yaml", kValidTiny);
  write(d / "child.yaml", "extends: base.yaml\nnum_layers: 5\nadd_qkv_bias: true\n");
  ModelSpec c = load_model_spec((d / "child.yaml").string());
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_TRUE(c.add_qkv_bias);
  EXPECT_EQ(c.name, (d / "child.yaml").string());

  write(d / "by_name.yaml", "extends: llama2_7B\nnum_layers: 2\ndescription: two layers of llama 2\n");
  ModelSpec b = load_model_spec((d / "by_name.yaml").string());
  EXPECT_EQ(b.num_layers, 2);
  EXPECT_EQ(b.ffn_hidden_size, 11008);
}

TEST(Load, ExtendsCycleAndMissingParent) {
  fs::path d = temp_dir();
  write(d / "a.yaml", "extends: b.yaml\nnum_layers: 1\n");
  write(d / "b.yaml", "extends: a.yaml\n");
  std::string e = error_of([&] { load_model_spec((d / "a.yaml").string()); });
  EXPECT_NE(e.find("cycle"), std::string::npos) << e;

  write(d / "c.yaml", "extends: llama9_1B\n");
  e = error_of([&] { load_model_spec((d / "c.yaml").string()); });
  EXPECT_NE(e.find("c.yaml:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown model preset 'llama9_1B'"), std::string::npos) << e;
}

TEST(Load, UnknownKeyNamesFileLineAndSuggestion) {
  fs::path d = temp_dir();
  write(d / "typo.yaml", "num_layers: 2\n# a comment\nhiden_size: 64\n");
  std::string e = error_of([&] { load_model_spec((d / "typo.yaml").string()); });
  EXPECT_NE(e.find((d / "typo.yaml").string() + ":3:1"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'hiden_size'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'hidden_size'"), std::string::npos) << e;
}

TEST(Load, WrongTypesNameTheKey) {
  fs::path d = temp_dir();
  write(d / "t1.yaml", "num_layers: 2\nhidden_size: big\n");
  std::string e = error_of([&] { load_model_spec((d / "t1.yaml").string()); });
  EXPECT_NE(e.find("t1.yaml:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("'hidden_size' must be an integer, got 'big'"), std::string::npos) << e;

  write(d / "t2.yaml", "hidden_size: 4096.5\n");
  e = error_of([&] { load_model_spec((d / "t2.yaml").string()); });
  EXPECT_NE(e.find("'hidden_size' must be an integer"), std::string::npos) << e;

  write(d / "t3.yaml", "add_qkv_bias: maybe\n");
  e = error_of([&] { load_model_spec((d / "t3.yaml").string()); });
  EXPECT_NE(e.find("'add_qkv_bias' must be true or false"), std::string::npos) << e;

  write(d / "t4.yaml", "norm_epsilon: [1, 2]\n");
  e = error_of([&] { load_model_spec((d / "t4.yaml").string()); });
  EXPECT_NE(e.find("'norm_epsilon' must be a number, got a list"), std::string::npos) << e;
}

TEST(Load, SyntaxEmptyDuplicateAndNonMap) {
  fs::path d = temp_dir();
  write(d / "syntax.yaml", "num_layers: 2\nhidden_size: [64\n");
  std::string e = error_of([&] { load_model_spec((d / "syntax.yaml").string()); });
  EXPECT_NE(e.find("syntax.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;

  write(d / "empty.yaml", "");
  e = error_of([&] { load_model_spec((d / "empty.yaml").string()); });
  EXPECT_NE(e.find("empty"), std::string::npos) << e;

  write(d / "dup.yaml", "num_layers: 2\nnum_layers: 3\n");
  e = error_of([&] { load_model_spec((d / "dup.yaml").string()); });
  EXPECT_NE(e.find("dup.yaml:2:1: key 'num_layers' appears twice"), std::string::npos) << e;

  write(d / "list.yaml", "- 1\n- 2\n");
  e = error_of([&] { load_model_spec((d / "list.yaml").string()); });
  EXPECT_NE(e.find("must be a map"), std::string::npos) << e;

  e = error_of([&] { load_model_spec((d / "missing.yaml").string()); });
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
}

TEST(Load, FromParsedNode) {
  ModelSpec s = model_spec_from_yaml(YAML::Load(kValidTiny), "inline");
  s.validate();
  EXPECT_EQ(s.name, "inline");
  EXPECT_EQ(s.query_groups(), 2);
  std::string e = error_of([] { model_spec_from_yaml(YAML::Load("vocab: 3\n"), "inline"); });
  EXPECT_NE(e.find("inline:1:1: unknown key 'vocab'"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------------------------
// validate(): each inconsistency names its field.

static ModelSpec tiny_with(const std::string& extra) {
  YAML::Node n = YAML::Load(kValidTiny);
  YAML::Node e = YAML::Load(extra);
  for (auto it = e.begin(); it != e.end(); ++it) n[it->first.Scalar()] = it->second;
  return model_spec_from_yaml(n, "test");
}

TEST(Validate, ShapesNameTheField) {
  EXPECT_NO_THROW(tiny_with("{}").validate());
  struct Case {
    const char* yaml;
    const char* needle;
  };
  for (const Case& c : {
           Case{"{hidden_size: 66, num_attention_heads: 4}", "hidden_size (66) must be divisible by num_attention_heads (4)"},
           Case{"{num_attention_heads: 4, num_query_groups: 3}", "num_attention_heads (4) must be divisible by num_query_groups (3)"},
           Case{"{num_query_groups: 8}", "num_query_groups"},
           Case{"{num_layers: 0}", "num_layers must be positive"},
           Case{"{ffn_hidden_size: -1}", "ffn_hidden_size must be positive"},
           Case{"{vocab_size: 0}", "vocab_size must be positive"},
           Case{"{max_position_embeddings: 0}", "max_position_embeddings must be positive"},
           Case{"{kv_channels: -2}", "kv_channels"},
           Case{"{kv_channels: 15}", "must be even"},
           Case{"{norm_epsilon: 0}", "norm_epsilon"},
           Case{"{rotary_base: -1}", "rotary_base"},
           Case{"{use_rope_scaling: true, rope_low_freq_factor: 4, rope_high_freq_factor: 1}", "rope_high_freq_factor"},
       }) {
    std::string e = error_of([&] { tiny_with(c.yaml).validate(); });
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.yaml << " -> '" << e << "'";
    EXPECT_NE(e.find("model 'test'"), std::string::npos) << e;
  }
  // kv_channels lifts the divisibility rule.
  EXPECT_NO_THROW(tiny_with("{hidden_size: 66, kv_channels: 16}").validate());
}
