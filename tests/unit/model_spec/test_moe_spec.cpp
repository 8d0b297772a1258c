// MoE, MLA and QK-norm keys of a model spec: the published parameter counts of the MoE and Qwen3
// presets, active parameters, moe_layer_freq's three forms, and the errors that name the key.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>

#include "core/error.h"
#include "model/model_spec.h"
#include "support/error_of.h"

using namespace primus;

namespace {

using test::error_of;

// A tiny MoE spec from YAML text on top of a dense base.
ModelSpec tiny_moe(const std::string& extra) {
  const std::string base =
      "num_layers: 4\nhidden_size: 32\nffn_hidden_size: 64\nnum_attention_heads: 4\nvocab_size: 100\n"
      "max_position_embeddings: 64\nnum_experts: 8\nmoe_ffn_hidden_size: 16\nmoe_router_topk: 2\n";
  ModelSpec s = model_spec_from_yaml(YAML::Load(base), "moe.yaml");
  if (!extra.empty()) apply_model_keys(s, YAML::Load(extra), "moe.yaml");
  s.name = "moe";
  return s;
}

struct Published {
  const char* name;
  int64_t parameters, active;
};
class MoePresetCounts : public ::testing::TestWithParam<Published> {};

TEST_P(MoePresetCounts, EqualsPublished) {
  ModelSpec s = load_model_spec(GetParam().name);
  ModelStats st = model_stats(s, 4096);
  EXPECT_EQ(st.parameters - st.mtp_parameters, GetParam().parameters);  // the main model's
  EXPECT_EQ(st.active_parameters - st.mtp_active_parameters, GetParam().active);
  EXPECT_EQ(st.parameters, st.embedding_parameters + st.non_embedding_parameters);
}

// Totals from the models' Hugging Face safetensors indexes (DeepSeek-V3's main model: its MTP
// depth is counted apart, below);
// active counts as our convention computes them (input embedding included, top-k experts).
INSTANTIATE_TEST_SUITE_P(
    Presets, MoePresetCounts,
    ::testing::Values(Published{"mixtral_8x7B_v0.1", 46'702'792'704, 12'879'925'248},
                      Published{"mixtral_8x22B_v0.1", 140'620'634'112, 39'152'031'744},
                      Published{"deepseek_v2_lite", 15'706'484'224, 2'661'150'208},
                      Published{"deepseek_v2", 235'741'434'880, 21'375'800'320},
                      Published{"deepseek_v3", 671'026'419'200, 37'552'297'472},
                      Published{"qwen3_30B_A3B", 30'532'122'624, 3'353'032'704},
                      Published{"qwen3_235B_A22B", 235'093'634'560, 22'190'763'520},
                      Published{"qwen3_4B", 4'022'468'096, 4'022'468'096},
                      Published{"qwen3_8B", 8'190'735'360, 8'190'735'360},
                      Published{"qwen3_14B", 14'768'307'200, 14'768'307'200},
                      Published{"qwen3_32B", 32'762'123'264, 32'762'123'264}),
    [](const auto& info) {
      std::string n = info.param.name;
      for (char& c : n)
        if (c == '.') c = '_';
      return n;
    });

}  // namespace

// DeepSeek-V3's multi-token prediction depth (mtp_num_layers 1, as Primus's deepseek_v3.yaml):
// enorm, hnorm, eh_proj [7168, 14336], one MLA + MoE layer as the last decoder layer, its final
// norm; the embedding and output layer shared. The release's MTP module ("14B", 671B + 14B = 685B)
// also stores its own copies of those two (2 x 129280 x 7168).
TEST(MoeSpec, DeepSeekV3MtpDepthCountedApart) {
  const ModelSpec s = load_model_spec("deepseek_v3");
  ASSERT_EQ(s.mtp_num_layers, 1);
  const ModelStats st = model_stats(s, 4096);
  const int64_t h = 7168, layer = st.layers[size_t(s.num_layers)].parameters;  // decoder.layers.60
  EXPECT_EQ(st.mtp_parameters, 3 * h + 2 * h * h + layer);
  EXPECT_EQ(st.mtp_parameters, 11'610'068'224);
  EXPECT_EQ(st.parameters, 671'026'419'200 + 11'610'068'224);
  EXPECT_EQ(st.layers.back().name, "mtp.layers.0");
  EXPECT_NEAR(double(st.mtp_parameters + 2 * 129280 * h) / 1e9, 13.5, 0.05);  // the release's copies
  EXPECT_GT(st.mtp_flops_per_token, 0.0);
}

// Presets that follow Primus's YAMLs (configs/models/kimi_k2.yaml, glm4_7.yaml, glm5.yaml): the
// counts these shapes give (pinned) and their distance from the figures the model makers
// announced: Kimi-K2 1T total / 32B active, GLM-4.5 and 4.7 355B / 32B, GLM-5 744B / 40B (whose
// sparse-attention indexer and MTP layer Primus's YAML and this preset leave out).
TEST(MoeSpec, PrimusYamlPresetsNearTheAnnouncedSizes) {
  struct Row {
    const char* name;
    int64_t parameters, active;
    double announced_total, announced_active, tolerance;
  };
  for (const Row& r : {Row{"kimi_k2", 1'026'408'232'448, 32'861'500'928, 1.0e12, 32e9, 0.05},
                       Row{"glm4_7", 355'756'876'800, 33'005'184'000, 355e9, 32e9, 0.05},
                       Row{"glm5", 743'139'315'456, 41'012'825'856, 744e9, 40e9, 0.05},
                       // "~10B active": 10.42B without the input embedding, 11.03B with it.
                       Row{"minimax_m2.5", 228'689'336'320, 11'030'124'544, 229e9, 10e9, 0.11}}) {
    const ModelStats st = model_stats(load_model_spec(r.name), 4096);
    EXPECT_EQ(st.parameters, r.parameters) << r.name;
    EXPECT_EQ(st.active_parameters, r.active) << r.name;
    EXPECT_NEAR(double(st.parameters) / r.announced_total, 1.0, r.tolerance) << r.name;
    EXPECT_NEAR(double(st.active_parameters) / r.announced_active, 1.0, r.tolerance) << r.name;
  }
}

// Llama 4 as Meta released it (configs/models/llama4_*.yaml; docs/model_math.md, Llama 4): the
// text decoders' counts, against the published 109B / 400B total and 17B active (Scout's 109B is
// the multimodal checkpoint's: within 2%), and the layers' attention and MLP kinds.
TEST(MoeSpec, Llama4PresetsMatchThePublishedTotals) {
  struct Row {
    const char* name;
    int64_t parameters, active;
    double total;
  };
  for (const Row& r : {Row{"llama4_17B16E", 107'769'861'120, 17'172'894'720, 109e9},
                       Row{"llama4_17B128E", 400'711'848'960, 17'184'691'200, 400e9}}) {
    const ModelSpec s = load_model_spec(r.name);
    const ModelStats st = model_stats(s, 8192);
    EXPECT_EQ(st.parameters, r.parameters) << r.name;
    EXPECT_EQ(st.active_parameters, r.active) << r.name;
    EXPECT_NEAR(double(st.parameters) / r.total, 1.0, 0.02) << r.name;
    EXPECT_NEAR(double(st.active_parameters) / 17e9, 1.0, 0.02) << r.name;
    for (int64_t l = 0; l < s.num_layers; ++l) {
      const bool nope = (l + 1) % 4 == 0;
      EXPECT_EQ(s.layer_uses_rope(l), !nope) << r.name << " layer " << l;
      EXPECT_EQ(s.layer_attention_chunk(l), nope ? 0 : 8192) << r.name << " layer " << l;
    }
  }
  const ModelSpec maverick = load_model_spec("llama4_17B128E");
  for (int64_t l = 0; l < maverick.num_layers; ++l) EXPECT_EQ(maverick.is_moe_layer(l), l % 2 == 1) << l;
  EXPECT_TRUE(load_model_spec("llama4_17B16E").is_moe_layer(0));
  // Chunked layers see (s / c) c^2 / 2 of the causal pairs: fewer than the global layers past 8192.
  const ModelSpec scout = load_model_spec("llama4_17B16E");
  const ModelStats at8k = model_stats(scout, 8192), at32k = model_stats(scout, 32768);
  // Layer 0 (chunked) and layer 3 (global NoPE) differ in attention alone: at 8192 not at all.
  EXPECT_DOUBLE_EQ(at8k.layers[1].flops_per_token, at8k.layers[4].flops_per_token);
  EXPECT_LT(at32k.layers[1].flops_per_token, at32k.layers[4].flops_per_token);
}

// Grok as Primus defines it (configs/models/grok{1,2}.yaml; docs/model_math.md, Grok): the counts
// of these shapes, and where they meet the published figures.
TEST(MoeSpec, GrokPresetCountsAndThePublishedFigures) {
  const ModelSpec g1 = load_model_spec("grok1");
  const ModelStats s1 = model_stats(g1, 4096);
  EXPECT_EQ(s1.parameters, 315'271'944'192);
  EXPECT_EQ(s1.active_parameters, 83'343'710'208);  // 2 of 8 experts, the input embedding counted
  // The 64 decoder layers alone hold 314.88B: xai-org/grok-1's "314B". The rest is the embedding
  // and output layer of Primus's 32000-token tokenizer (and the final norm).
  const int64_t layers1 = s1.non_embedding_parameters - g1.hidden_size;
  EXPECT_EQ(layers1, 314'878'722'048);
  EXPECT_EQ(layers1 / 1'000'000'000, 314);
  EXPECT_EQ(s1.parameters - s1.active_parameters, 64 * 6 * 3 * 6144 * int64_t(32768));  // 6 idle experts a layer

  const ModelSpec g2 = load_model_spec("grok2");
  const ModelStats s2 = model_stats(g2, 4096);
  EXPECT_EQ(s2.parameters, 216'351'645'696);
  EXPECT_EQ(s2.active_parameters, 61'732'823'040);  // Primus's comment: 62B active
  EXPECT_EQ((s2.active_parameters + 500'000'000) / 1'000'000'000, 62);
  // Primus's comment says 270B in all: Grok-2 as released also has a dense MLP of 32768 beside the
  // experts in every layer ("residual_moe") and a 131072-token vocabulary, which Primus's YAML
  // leaves out; with them (output layer untied) the same shapes count 269.5B.
  const int64_t h = g2.hidden_size;
  const int64_t released = s2.parameters + 64 * 3 * h * int64_t(32768) + 2 * (131072 - g2.vocab_size) * h;
  EXPECT_EQ(released, 269'514'448'896);
  EXPECT_EQ((released + 500'000'000) / 1'000'000'000, 270);
  // The soft-caps and rotary_scaling_factor are not parameters: the spec as Primus writes it.
  EXPECT_EQ(g2.final_logit_softcapping, 50.0);
  EXPECT_EQ(g2.router_logit_softcapping, 30.0);
  EXPECT_EQ(g2.rotary_scaling_factor, 16.0);
  EXPECT_EQ(g1.final_logit_softcapping, 0.0);
}

TEST(MoeSpec, LayerFreqIntegerListAndExpression) {
  ModelSpec a = tiny_moe("moe_layer_freq: 2\n");
  a.validate();
  EXPECT_TRUE(a.is_moe_layer(0));
  EXPECT_FALSE(a.is_moe_layer(1));
  EXPECT_TRUE(a.is_moe_layer(2));
  ModelSpec b = tiny_moe("moe_layer_freq: [0, 1, 1, 0]\n");
  b.validate();
  EXPECT_FALSE(b.is_moe_layer(0));
  EXPECT_TRUE(b.is_moe_layer(1));
  EXPECT_FALSE(b.is_moe_layer(3));
  ModelSpec c = tiny_moe("moe_layer_freq: \"([0]*1+[1]*3)\"\n");
  c.validate();
  EXPECT_EQ(c.moe_layer_pattern, (std::vector<int64_t>{0, 1, 1, 1}));
  ModelSpec d = tiny_moe("moe_layer_freq: \"2*[0,1]\"\n");
  EXPECT_EQ(d.moe_layer_pattern, (std::vector<int64_t>{0, 1, 0, 1}));
  // The list round-trips through the resolved config.
  ModelSpec e = model_spec_from_yaml(model_spec_to_yaml(c), "resolved.yaml");
  EXPECT_EQ(e.moe_layer_pattern, c.moe_layer_pattern);
}

TEST(MoeSpec, LayoutCountsExpertsAndActive) {
  ModelSpec s = tiny_moe("moe_shared_expert_intermediate_size: 16\nmoe_layer_freq: \"([0]+[1]*3)\"\n");
  auto layout = model_parameter_layout(s);
  int experts = 0;
  for (const auto& p : layout) {
    if (p.expert >= 0) ++experts;
    EXPECT_TRUE(p.trainable);
  }
  EXPECT_EQ(experts, 3 * 8 * 2);  // 3 MoE layers x 8 experts x (fc1, fc2)
  ModelStats st = model_stats(s, 16);
  const int64_t expert = 3 * 32 * 16;  // one expert's SwiGLU weights
  EXPECT_EQ(st.parameters - st.active_parameters, 3 * (8 - 2) * expert);
  // A dense layer and an MoE layer differ by exactly the expert/router/shared weights.
  const int64_t attn = 4 * 32 * 32 + 2 * 32;
  EXPECT_EQ(st.layers[1].parameters, attn + 3 * 32 * 64);
  EXPECT_EQ(st.layers[2].parameters, attn + 8 * expert + 8 * 32 + 3 * 32 * 16);
  EXPECT_EQ(st.layers[2].active_parameters, attn + 2 * expert + 8 * 32 + 3 * 32 * 16);
  // FLOPs: 6 per active weight plus attention's 6 s q.
  EXPECT_DOUBLE_EQ(st.layers[2].flops_per_token, 6.0 * double(st.layers[2].active_parameters) + 6.0 * 16 * 32);
}

TEST(MoeSpec, ExpertBiasIsACountedBuffer) {
  ModelSpec s = tiny_moe("moe_router_score_function: sigmoid\nmoe_router_enable_expert_bias: true\n");
  int buffers = 0;
  for (const auto& p : model_parameter_layout(s))
    if (!p.trainable) {
      ++buffers;
      EXPECT_NE(p.name.find("mlp.router.expert_bias"), std::string::npos);
    }
  EXPECT_EQ(buffers, 4);
}

TEST(MoeSpec, NullMeansNone) {
  ModelSpec s = tiny_moe("moe_expert_capacity_factor: null\nmoe_router_num_groups: null\nq_lora_rank: ~\n");
  s.validate();
  EXPECT_EQ(s.moe_expert_capacity_factor, 0.0);
  EXPECT_EQ(s.moe_router_num_groups, 0);
  EXPECT_EQ(s.q_lora_rank, 0);
}

// moe_router_group_score: a name read into its enum (topk_sum by default, Megatron's rule), written back by
// name; a bad name, or max without groups, is refused naming the key.
TEST(MoeSpec, GroupScoreIsReadByNameAndRefusedByName) {
  const std::string groups = "moe_router_num_groups: 4\nmoe_router_group_topk: 2\n";
  ModelSpec a = tiny_moe(groups);
  a.validate();
  EXPECT_EQ(a.moe_router_group_score, GroupScore::TopkSum);
  ModelSpec b = tiny_moe(groups + "moe_router_group_score: max\n");
  b.validate();
  EXPECT_EQ(b.moe_router_group_score, GroupScore::Max);
  EXPECT_EQ(model_spec_to_yaml(b)["moe_router_group_score"].as<std::string>(), "max");
  EXPECT_EQ(model_spec_from_yaml(model_spec_to_yaml(b), "resolved.yaml").moe_router_group_score, GroupScore::Max);
  EXPECT_EQ(model_spec_to_yaml(a)["moe_router_group_score"].as<std::string>(), "topk_sum");
  const std::string bad = error_of([&] { tiny_moe(groups + "moe_router_group_score: maximum\n"); });
  EXPECT_NE(bad.find("'moe_router_group_score' must be one of: topk_sum, max, got 'maximum'"), std::string::npos)
      << bad;
  EXPECT_NE(error_of([&] {
              tiny_moe(groups + "moe_router_group_score: [max]\n");
            }).find("'moe_router_group_score' must be one of: topk_sum, max, got a list"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              tiny_moe("moe_router_group_score: max\n").validate();
            }).find("moe_router_group_score max applies to group-limited routing only"),
            std::string::npos);
}

TEST(MoeSpec, BadInputNamesTheKey) {
  auto err = [](const std::string& extra) { return error_of([&] { tiny_moe(extra).validate(); }); };
  EXPECT_NE(err("moe_router_topk: 9\n").find("moe_router_topk (9) cannot exceed num_experts (8)"), std::string::npos);
  EXPECT_NE(err("moe_router_enable_expert_bias: true\n").find("moe_router_enable_expert_bias adds the bias to the scores "
                                                                 "the choice ranks: it needs"),
            std::string::npos);
  EXPECT_NE(err("moe_router_score_function: sigmod\n").find("moe_router_score_function 'sigmod' is not one of"),
            std::string::npos);
  EXPECT_NE(err("moe_token_dispatcher_type: flex\n").find("moe_token_dispatcher_type 'flex'"), std::string::npos);
  EXPECT_NE(err("moe_router_load_balancing_type: sinkhorn\n").find("moe_router_load_balancing_type"),
            std::string::npos);
  EXPECT_NE(err("moe_layer_freq: [1, 1]\n").find("moe_layer_freq lists 2 layers but num_layers is 4"),
            std::string::npos);
  EXPECT_NE(err("moe_layer_freq: [0, 1, 2, 1]\n").find("moe_layer_freq entries must be 0"), std::string::npos);
  EXPECT_NE(err("moe_layer_freq: 0\n").find("moe_layer_freq must be at least 1"), std::string::npos);
  EXPECT_NE(err("moe_router_num_groups: 3\nmoe_router_group_topk: 1\n").find("divisible by moe_router_num_groups"),
            std::string::npos);
  EXPECT_NE(err("moe_router_num_groups: 4\n").find("needs both"), std::string::npos);
  EXPECT_NE(err("moe_router_num_groups: 4\nmoe_router_group_topk: 1\nmoe_router_topk: 3\n")
                .find("moe_router_topk (3) exceeds the experts of the 1 selected groups (2)"),
            std::string::npos);
  EXPECT_NE(err("moe_aux_loss_coeff: -1\n").find("moe_aux_loss_coeff must be a non-negative"), std::string::npos);
  EXPECT_NE(err("moe_shared_expert_gate: true\n").find("moe_shared_expert_gate needs a shared expert"),
            std::string::npos);
  // Expression syntax errors name the key and the text.
  EXPECT_NE(error_of([] { tiny_moe("moe_layer_freq: \"([0]*3+\"\n"); }).find("'moe_layer_freq' expression"),
            std::string::npos);
  EXPECT_NE(error_of([] { tiny_moe("moe_layer_freq: \"[0,1\"\n"); }).find("unclosed list"), std::string::npos);
  EXPECT_NE(error_of([] { tiny_moe("moe_router_topk: two\n"); }).find("'moe_router_topk' must be an integer"),
            std::string::npos);
}

TEST(MlaSpec, LayoutAndAttentionFlops) {
  ModelSpec s = tiny_moe(
      "multi_latent_attention: true\nqk_layernorm: true\nq_lora_rank: 8\nkv_lora_rank: 6\nqk_head_dim: 4\n"
      "qk_pos_emb_head_dim: 2\nv_head_dim: 4\nnum_experts: null\n");
  s.validate();
  ModelStats st = model_stats(s, 16);
  const int64_t H = 4, C = 32;
  const int64_t attn = C * 8 + 8 + 8 * H * 6 + C * (6 + 2) + 6 + 6 * H * (4 + 4) + H * 4 * C;
  EXPECT_EQ(st.layers[1].parameters, attn + 2 * C + 3 * C * 64);
  // 3 s heads (qk + rope + v) for the attention core.
  EXPECT_DOUBLE_EQ(st.layers[1].flops_per_token, 6.0 * double(st.layers[1].parameters) + 3.0 * 16 * H * 10);
  EXPECT_NE(error_of([&] {
              ModelSpec b = s;
              b.qk_pos_emb_head_dim = 3;
              b.validate();
            }).find("qk_pos_emb_head_dim (3) must be even"),
            std::string::npos);
}
