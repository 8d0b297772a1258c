// Hugging Face checkpoints of the mixture-of-experts families (hf/hf_families.h): Mixtral,
// Qwen2-MoE, Qwen3-MoE, DeepSeek-V2 and V3 (with and without its multi-token-prediction layer), gpt-oss, Llama 4. A
// tiny random model of each in its Hugging Face layout (tests/oracles/hf_moe_peer.py) imports and exports to the same
// bytes and gives the peer's logits (and DeepSeek-V3's MTP logits and loss); the quantized formats dequantize to
// hand-computed values; bad folders are refused by name.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_fit.h"
#include "core/error.h"
#include "core/log.h"
#include "hf/dequant.h"
#include "hf/hf_checkpoint.h"
#include "hf/hf_families.h"
#include "hf/safetensors.h"
#include "hf_peer.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace primus;

namespace {

using test::error_of;

using test::TempDir;

const std::vector<std::string> kFamilies = {
    "mixtral",     "qwen2_moe",       "qwen3_moe", "deepseek_v2", "deepseek_v2_grouped",
    "deepseek_v3", "deepseek_v3_mtp", "gpt_oss",   "llama4"};

json read_config(const std::string& dir) {
  std::ifstream f(fs::path(dir) / "config.json");
  return json::parse(f);
}
void write_config(const std::string& dir, const json& c) { std::ofstream(fs::path(dir) / "config.json") << c.dump(2); }

// Rewrites the folder's safetensors with `edit` applied to its tensor list.
// The error of importing o.hf_dir after `edit` rewrote its config.json from `good`.
std::string import_error_with(const hf::ImportOptions& o, const json& good, const std::function<void(json&)>& edit) {
  json c = good;
  edit(c);
  write_config(o.hf_dir, c);
  return error_of([&] { hf::import_hf(o); });
}

void rewrite_tensors(const std::string& dir, const std::function<void(std::vector<hf::TensorOut>&)>& edit) {
  std::vector<hf::TensorOut> ts;
  {
    hf::SafetensorsReader r(dir);
    for (const auto& [name, e] : r.tensors()) ts.push_back({name, e.dtype, e.shape, r.raw(name)});
  }
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors" || e.path().filename() == "model.safetensors.index.json")
      fs::remove(e.path());
  edit(ts);
  hf::write_safetensors(dir, ts, 5'000'000'000);
}

// The keys of each family's config.json that describe the model (what an export must give back).
std::vector<std::string> family_keys(const std::string& family) {
  std::vector<std::string> k = {"architectures",       "model_type",         "hidden_size",  "num_hidden_layers",
                                "num_attention_heads", "vocab_size",         "rms_norm_eps", "rope_theta",
                                "tie_word_embeddings", "num_experts_per_tok"};
  if (family == "mixtral") k.insert(k.end(), {"num_local_experts", "intermediate_size", "num_key_value_heads"});
  if (family == "qwen2_moe" || family == "qwen3_moe")
    k.insert(k.end(), {"num_experts", "moe_intermediate_size", "intermediate_size", "mlp_only_layers", "norm_topk_prob",
                       "num_key_value_heads"});
  if (family == "qwen2_moe") k.push_back("shared_expert_intermediate_size");
  if (family == "qwen3_moe") k.push_back("head_dim");
  if (family == "gpt_oss")
    k.insert(k.end(), {"num_local_experts", "intermediate_size", "num_key_value_heads", "head_dim", "sliding_window",
                       "layer_types", "swiglu_limit", "attention_bias", "rope_scaling"});
  if (family == "llama4")
    k.insert(k.end(), {"num_local_experts", "intermediate_size", "intermediate_size_mlp", "num_key_value_heads",
                       "head_dim", "moe_layers", "interleave_moe_layer_step", "no_rope_layers", "use_qk_norm",
                       "attention_chunk_size", "attn_temperature_tuning", "floor_scale", "attn_scale", "rope_scaling"});
  if (family.starts_with("deepseek"))
    k.insert(k.end(), {"n_routed_experts", "n_shared_experts", "moe_intermediate_size", "intermediate_size",
                       "first_k_dense_replace", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                       "v_head_dim", "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group",
                       "norm_topk_prob", "aux_loss_alpha", "seq_aux"});
  if (family.starts_with("deepseek_v3")) k.push_back("num_nextn_predict_layers");
  return k;
}

}  // namespace

TEST(HfMoe, ImportThenExportGivesTheSameBytes) {
  TempDir t;
  // Every family in F32, one file; the two with the most conversions (MLA's rope rows, packed
  // experts) also in BF16, sharded.
  std::vector<std::pair<std::string, std::pair<std::string, uint64_t>>> cases;
  for (const std::string& family : kFamilies) cases.push_back({family, {"F32", 5'000'000'000}});
  for (const std::string family : {"deepseek_v3_mtp", "gpt_oss", "llama4"}) cases.push_back({family, {"BF16", 60'000}});
  for (const auto& [family, format] : cases) {
    const auto& [dtype, shard] = format;
    SCOPED_TRACE(family + " " + dtype);
    const std::string src = t / "src", save = t / "save", dst = t / "dst";
    fs::remove_all(src), fs::remove_all(save), fs::remove_all(dst);
    test::peer_write_family(src, family, dtype, shard);
    EXPECT_EQ(fs::exists(fs::path(src) / "model.safetensors.index.json"), shard < 1'000'000);
    hf::import_hf({src, save, "", false});
    hf::ExportOptions eo;
    eo.checkpoint = save;
    eo.out_dir = dst;
    eo.dtype = dtype;
    eo.max_shard_bytes = shard;
    hf::export_hf(eo);  // the architecture the checkpoint's parts say
    hf::SafetensorsReader a(src), b(dst);
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (const auto& [name, e] : a.tensors()) {
      ASSERT_TRUE(b.has(name)) << name;
      EXPECT_EQ(b.entry(name).shape, e.shape) << name;
      EXPECT_TRUE(a.raw(name) == b.raw(name)) << name << " differs";
    }
    const json ja = read_config(src), jb = read_config(dst);
    for (const std::string& k : family_keys(family)) EXPECT_EQ(ja[k], jb[k]) << k;
  }
}

TEST(HfMoe, PeerModelGivesOurLogits) {
  TempDir t;
  std::vector<std::string> families = kFamilies;
  families.push_back("gpt_oss_mxfp4");  // the experts in MXFP4, which the peer dequantizes by itself
  for (const std::string& family : families) {
    SCOPED_TRACE(family);
    const std::string src = t / "src", save = t / "save", dst = t / "dst";
    fs::remove_all(src), fs::remove_all(save), fs::remove_all(dst);
    test::peer_write_family(src, family, "F32", 5'000'000'000);
    const std::string ckpt = hf::import_hf({src, save, "", false});
    const auto ours = test::our_logits(ckpt, test::kPeerTokens);
    test::expect_close(ours, test::peer_logits(src, test::kPeerTokens));  // import: the peer on the source folder
    // Export gives the source's bytes back (ImportThenExportGivesTheSameBytes), but for MXFP4
    // experts, which it writes unpacked: the peer on that folder.
    if (family != "gpt_oss_mxfp4") continue;
    hf::ExportOptions eo;
    eo.checkpoint = ckpt;
    eo.out_dir = dst;
    hf::export_hf(eo);
    EXPECT_TRUE(hf::SafetensorsReader(dst).has("model.layers.0.mlp.experts.gate_up_proj"));
    test::expect_close(ours, test::peer_logits(dst, test::kPeerTokens));  // export: the peer on our exported folder
  }
}

// E4M3 (fn) and E2M1 / E8M0 by hand, and the block layouts.
TEST(HfMoe, Fp8BlocksAndMxfp4DequantizeToHandComputedValues) {
  EXPECT_EQ(hf::e4m3_to_float(0x38), 1.0f);                  // 0.0111.000: 2^(7-7)
  EXPECT_EQ(hf::e4m3_to_float(0xC4), -3.0f);                 // 1.1000.100: -(1 + 4/8) 2^1
  EXPECT_EQ(hf::e4m3_to_float(0x7E), 448.0f);                // the largest: (1 + 6/8) 2^8
  EXPECT_EQ(hf::e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal: 1/8 2^-6
  EXPECT_TRUE(std::isnan(hf::e4m3_to_float(0x7F)));
  EXPECT_EQ(hf::e2m1_to_float(0x7), 6.0f);
  EXPECT_EQ(hf::e2m1_to_float(0xB), -1.5f);
  // A 130 x 3 weight in 128 x 128 blocks: rows 128 and 129 take the second row of factors.
  std::string fp8(130 * 3, char(0x38));
  fp8[129 * 3 + 2] = char(0xC4);
  const std::vector<float> w = hf::dequant_fp8_blocks(fp8, 130, 3, {0.5f, 4.0f}, {2, 1}, 128, "w");
  EXPECT_EQ(w[0], 0.5f);
  EXPECT_EQ(w[127 * 3 + 1], 0.5f);
  EXPECT_EQ(w[128 * 3], 4.0f);
  EXPECT_EQ(w[129 * 3 + 2], -12.0f);
  EXPECT_NE(error_of([&] {
              hf::dequant_fp8_blocks(fp8, 130, 3, {0.5f}, {1, 1}, 128, "layer.w");
            }).find("layer.w"),
            std::string::npos);
  // MXFP4: byte 0x2F holds -6 (low nibble, first) and 1 (high); scale byte 128: times 2.
  std::string blocks(16, char(0)), scales(1, char(128));
  blocks[0] = char(0x2F);
  blocks[15] = char(0x70);  // 0, then 6
  const std::vector<float> m = hf::dequant_mxfp4(blocks, scales, 1, 1, "b");
  ASSERT_EQ(m.size(), 32u);
  EXPECT_EQ(m[0], -12.0f);
  EXPECT_EQ(m[1], 2.0f);
  EXPECT_EQ(m[30], 0.0f);
  EXPECT_EQ(m[31], 12.0f);
}

// A DeepSeek-V3 folder with an fp8 block-quantized weight (and its weight_scale_inv) imports
// dequantized; without its factors it is refused by name.
TEST(HfMoe, DeepSeekV3Fp8WeightsAreDequantizedOnImport) {
  TempDir t;
  const std::string src = t / "src";
  test::peer_write_family(src, "deepseek_v3", "BF16", 5'000'000'000);
  json c = read_config(src);
  c["quantization_config"] = {
      {"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}}};
  write_config(src, c);
  const std::string w = "model.layers.1.mlp.experts.2.up_proj.weight";  // [24, 64]
  std::string fp8(24 * 64, char(0x38));
  fp8[5 * 64 + 7] = char(0xC4);
  rewrite_tensors(src, [&](std::vector<hf::TensorOut>& ts) {
    for (auto& x : ts)
      if (x.name == w) x = {w, "F8_E4M3", {24, 64}, fp8};
    ts.push_back({w + "_scale_inv", "F32", {1, 1}, hf::f32_to_bytes({0.25f}, "F32")});
  });
  const std::string ckpt = hf::import_hf({src, t / "save", "", false});
  hf::ExportOptions eo;
  eo.checkpoint = ckpt;
  eo.out_dir = t / "dst";
  hf::export_hf(eo);
  const std::vector<float> v = hf::SafetensorsReader(t / "dst").as_f32(w);
  EXPECT_EQ(v[0], 0.25f);
  EXPECT_EQ(v[5 * 64 + 7], -0.75f);
  EXPECT_FALSE(read_config(t / "dst").contains("quantization_config"));  // exported as F32

  rewrite_tensors(src, [&](std::vector<hf::TensorOut>& ts) {
    std::erase_if(ts, [&](const hf::TensorOut& x) { return x.name == w + "_scale_inv"; });
  });
  EXPECT_NE(error_of([&] { hf::import_hf({src, t / "save2", "", false}); }).find(w + "_scale_inv"), std::string::npos);
  c["quantization_config"] = {{"quant_method", "gptq"}};
  write_config(src, c);
  EXPECT_NE(error_of([&] {
              hf::import_hf({src, t / "save2", "", false});
            }).find("quantization_config"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(t / "save2"));
}

namespace {

// Our model's multi-token-prediction logits and losses (model/mtp.cpp) on `tokens` with their next
// tokens as targets: per depth k, the positions with a token k + 1 ahead, each the depth's normed
// output (its final_layernorm, HF's shared_head.norm) through the shared output layer.
struct OurMtp {
  std::vector<std::vector<std::vector<float>>> logits;
  std::vector<double> losses;
};
OurMtp our_mtp(const std::string& ckpt, const std::vector<int32_t>& tokens) {
  const YAML::Node cfg = YAML::Load(checkpoint::read_checkpoint_config(ckpt));
  const ModelSpec spec = model_spec_from_yaml(cfg["modules"]["pre_trainer"]["model_spec"], ckpt);
  LlamaModel model(spec, cpu::cpu_backend(), Precision::Fp32);
  checkpoint::LoadOptions lo;
  lo.optimizer = false;
  const auto ck = checkpoint::load_checkpoint(ckpt, model.params(), lo);
  std::copy(ck.params.begin(), ck.params.end(), model.params().values().data<float>());
  std::vector<int32_t> targets(tokens.begin() + 1, tokens.end());
  targets.push_back(-1);
  LlamaContext ctx;
  const int64_t T = int64_t(tokens.size()), C = spec.hidden_size, V = spec.vocab_size;
  model.forward(ctx, tokens.data(), targets.data(), 1, T);
  OurMtp out;
  out.losses = model.mtp_losses(ctx);
  const int head = model.params().find(spec.untie_embeddings_and_output_weights ? "output_layer.weight"
                                                                                : "embedding.word_embeddings.weight");
  const float* W = model.params().values().data<float>() + model.params().infos()[size_t(head)].offset;
  for (size_t k = 0; k < ctx.mtp.size(); ++k) {
    const float* h = ctx.mtp[k].head.normed.data<float>();
    auto& rows = out.logits.emplace_back();
    for (int64_t i = 0; i + int64_t(k) + 1 < T; ++i) {
      auto& row = rows.emplace_back(size_t(V));
      for (int64_t v = 0; v < V; ++v) {
        double acc = 0;
        for (int64_t c = 0; c < C; ++c) acc += double(h[i * C + c]) * double(W[v * C + c]);
        row[size_t(v)] = float(acc);
      }
    }
  }
  return out;
}

}  // namespace

// DeepSeek-V3's multi-token-prediction layer (model.layers.<num_hidden_layers>.*, num_nextn_predict_layers 1)
// imports into this model's MTP depth: its logits equal the PyTorch peer's (hf_moe_peer.py mtp_logits, written from
// vLLM's deepseek_mtp.py), and its loss the cross-entropy of the peer's logits against the tokens two ahead.
// (ImportThenExportGivesTheSameBytes and PeerModelGivesOurLogits cover its bytes and the main logits.)
TEST(HfMoe, MtpLayerGivesThePeersMtpLogitsAndLoss) {
  TempDir t;
  const std::string src = t / "src";
  test::peer_write_family(src, "deepseek_v3_mtp", "F32", 5'000'000'000);
  const std::string ckpt = hf::import_hf({src, t / "save", "", false});
  EXPECT_EQ(checkpoint::read_checkpoint_model(ckpt).mtp_num_layers, 1);
  const OurMtp ours = our_mtp(ckpt, test::kPeerTokens);
  const auto peer = test::peer_mtp_logits(src, test::kPeerTokens);
  ASSERT_EQ(peer.size(), 1u);
  ASSERT_EQ(ours.logits.size(), 1u);
  test::expect_close(ours.logits[0], peer[0]);
  // Depth 0's row i targets token i + 2: rows 0 .. T - 3.
  double loss = 0;
  const size_t rows = test::kPeerTokens.size() - 2;
  for (size_t i = 0; i < rows; ++i) {
    const auto& z = peer[0][i];
    double m = -1e300, sum = 0;
    for (float v : z) m = std::max(m, double(v));
    for (float v : z) sum += std::exp(double(v) - m);
    loss += m + std::log(sum) - double(z[size_t(test::kPeerTokens[i + 2])]);
  }
  loss /= double(rows);
  ASSERT_EQ(ours.losses.size(), 1u);
  EXPECT_NEAR(ours.losses[0], loss, 1e-5 * loss);
}

// A DeepSeek-V3 folder whose MTP layer is incomplete or contradicts the model is refused, naming the
// tensor; one without any MTP tensor (as transformers' save_pretrained writes it) imports without MTP.
TEST(HfMoe, MtpHostileInputsAreRefusedByName) {
  TempDir t;
  const std::string src = t / "src", save = t / "save";
  test::peer_write_family(src, "deepseek_v3_mtp", "F32", 5'000'000'000);
  const json good = read_config(src);
  std::vector<hf::TensorOut> all;
  rewrite_tensors(src, [&](std::vector<hf::TensorOut>& ts) { all = ts; });
  auto import_with = [&](const std::function<void(std::vector<hf::TensorOut>&)>& edit) {
    rewrite_tensors(src, [&](std::vector<hf::TensorOut>& ts) {
      ts = all;
      edit(ts);
    });
    const std::string e = error_of([&] { hf::import_hf({src, save, "", false}); });
    EXPECT_FALSE(fs::exists(save)) << e;
    return e;
  };
  auto drop = [](const std::string& name) {
    return [name](std::vector<hf::TensorOut>& ts) {
      std::erase_if(ts, [&](const hf::TensorOut& x) { return x.name == name; });
    };
  };
  for (const std::string name :
       {"model.layers.3.enorm.weight", "model.layers.3.eh_proj.weight", "model.layers.3.shared_head.norm.weight",
        "model.layers.3.mlp.experts.5.up_proj.weight", "model.layers.3.self_attn.kv_a_proj_with_mqa.weight"})
    EXPECT_NE(import_with(drop(name)).find(name), std::string::npos) << name;
  // A wrong shape: eh_proj [C, C] for [C, 2C].
  EXPECT_NE(import_with([](std::vector<hf::TensorOut>& ts) {
              for (auto& x : ts)
                if (x.name == "model.layers.3.eh_proj.weight")
                  x = {x.name, "F32", {64, 64}, x.bytes.substr(0, 64 * 64 * 4)};
            }).find("model.layers.3.eh_proj.weight"),
            std::string::npos);
  // A copy of the output head or the embedding that is not the main model's.
  for (const std::string name : {"model.layers.3.shared_head.head.weight", "model.layers.3.embed_tokens.weight"})
    EXPECT_NE(import_with([&](std::vector<hf::TensorOut>& ts) {
                for (auto& x : ts)
                  if (x.name == name) x.bytes[5] ^= 1;
              }).find(name + "' differs"),
              std::string::npos)
        << name;
  // The copies absent: nothing is lost (they are the main model's), the import goes through.
  rewrite_tensors(src, [&](std::vector<hf::TensorOut>& ts) {
    ts = all;
    drop("model.layers.3.shared_head.head.weight")(ts);
    drop("model.layers.3.embed_tokens.weight")(ts);
  });
  EXPECT_EQ(checkpoint::read_checkpoint_model(hf::import_hf({src, save, "", false})).mtp_num_layers, 1);
  // No MTP tensor at all: imported without MTP.
  rewrite_tensors(src, [&](std::vector<hf::TensorOut>& ts) {
    ts = all;
    std::erase_if(ts, [](const hf::TensorOut& x) { return x.name.starts_with("model.layers.3."); });
  });
  EXPECT_EQ(checkpoint::read_checkpoint_model(hf::import_hf({src, save, "", true})).mtp_num_layers, 0);
  fs::remove_all(save);
  // The MTP tensors without num_nextn_predict_layers have no place; the key itself is checked.
  rewrite_tensors(src, [&](std::vector<hf::TensorOut>& ts) { ts = all; });
  auto config_error = [&](const std::function<void(json&)>& edit) {
    return import_error_with({src, save, "", false}, good, edit);
  };
  EXPECT_NE(config_error([](json& c) { c.erase("num_nextn_predict_layers"); }).find("model.layers.3."),
            std::string::npos);
  EXPECT_NE(config_error([](json& c) { c["num_nextn_predict_layers"] = -1; }).find("num_nextn_predict_layers"),
            std::string::npos);
  EXPECT_NE(config_error([](json& c) { c["num_nextn_predict_layers"] = "one"; }).find("num_nextn_predict_layers"),
            std::string::npos);
  // An MTP layer that HF would build dense (first_k_dense_replace past it) while ours mirrors the last, MoE, layer.
  EXPECT_NE(config_error([](json& c) {
              c["moe_layer_freq"] = 2, c["first_k_dense_replace"] = 0;
            }).find("multi-token-prediction layer model.layers.3 is dense"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(save));
  write_config(src, good);

  // Export: num_nextn_predict_layers written; a family without MTP refuses the model by name.
  const std::string ckpt = hf::import_hf({src, save, "", false});
  hf::ExportOptions eo;
  eo.checkpoint = ckpt;
  eo.out_dir = t / "dst";
  eo.architecture = "DeepseekV2ForCausalLM";
  EXPECT_NE(error_of([&] { hf::export_hf(eo); }).find("multi-token prediction"), std::string::npos);
  EXPECT_FALSE(fs::exists(t / "dst"));
  // A DeepSeek-V2 config with num_nextn_predict_layers is refused by name.
  test::peer_write_family(t / "v2", "deepseek_v2", "F32", 5'000'000'000);
  json c = read_config(t / "v2");
  c["num_nextn_predict_layers"] = 1;
  write_config(t / "v2", c);
  EXPECT_NE(error_of([&] {
              hf::import_hf({t / "v2", t / "save2", "", false});
            }).find("num_nextn_predict_layers 1"),
            std::string::npos);
}

TEST(HfMoe, HostileInputsAreRefusedByName) {
  TempDir t;
  const std::string src = t / "src";
  test::peer_write_family(src, "mixtral", "F32", 5'000'000'000);
  const json good = read_config(src);
  auto import_with = [&](const std::function<void(json&)>& edit) {
    return import_error_with({src, t / "save", "", true}, good, edit);
  };
  // A config of another family.
  EXPECT_NE(import_with([](json& c) { c["model_type"] = "qwen3_moe"; }).find("model_type 'qwen3_moe'"),
            std::string::npos);
  EXPECT_NE(import_with([](json& c) {
              c["architectures"] = {"Qwen3MoeForCausalLM"}, c["model_type"] = "qwen3_moe";
            }).find("'num_experts' is missing"),
            std::string::npos);
  // Values this model cannot represent.
  EXPECT_NE(import_with([](json& c) { c["router_jitter_noise"] = 0.1; }).find("router_jitter_noise"),
            std::string::npos);
  EXPECT_NE(import_with([](json& c) { c["num_experts_per_tok"] = 5; }).find("moe_router_topk"), std::string::npos);
  // Absurd sizes: refused before anything of their size is allocated, in well under a second.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(import_with([](json& c) { c["num_local_experts"] = int64_t(1) << 40; }).find("MoE of"), std::string::npos);
  EXPECT_NE(import_with([](json& c) { c["num_hidden_layers"] = int64_t(1) << 40; }).find("num_hidden_layers"),
            std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  write_config(src, good);
  // A missing expert tensor.
  rewrite_tensors(src, [](std::vector<hf::TensorOut>& ts) {
    std::erase_if(ts, [](const hf::TensorOut& x) {
      return x.name == "model.layers.1.block_sparse_moe.experts.3.w2.weight";
    });
  });
  EXPECT_NE(error_of([&] {
              hf::import_hf({src, t / "save", "", true});
            }).find("model.layers.1.block_sparse_moe.experts.3.w2.weight"),
            std::string::npos);
  // A truncated file.
  fs::resize_file(fs::path(src) / "model.safetensors", fs::file_size(fs::path(src) / "model.safetensors") - 100);
  EXPECT_NE(error_of([&] { hf::import_hf({src, t / "save", "", true}); }).find("model.safetensors"), std::string::npos);
  EXPECT_FALSE(fs::exists(t / "save"));

  // DeepSeek routings this router does not compute.
  const std::string ds = t / "ds";
  test::peer_write_family(ds, "deepseek_v2", "F32", 5'000'000'000);
  json c = read_config(ds);
  c["topk_method"] = "noaux_tc", c["n_group"] = 2, c["topk_group"] = 2;  // its top 2 summed; topk_sum's top 1
  write_config(ds, c);
  EXPECT_NE(error_of([&] {
              hf::import_hf({ds, t / "save", "", true});
            }).find("topk_method noaux_tc with num_experts_per_tok 2 and topk_group 2 is not supported"),
            std::string::npos);
  c = read_config(ds);
  c["topk_method"] = "greedy", c["scoring_func"] = "sigmoid", c["norm_topk_prob"] = false;
  write_config(ds, c);
  EXPECT_NE(error_of([&] {
              hf::import_hf({ds, t / "save", "", true});
            }).find("norm_topk_prob false"),
            std::string::npos);
  // DeepSeek-V3's router is noaux_tc whatever topk_method says (transformers' has no other).
  const std::string v3 = t / "v3";
  test::peer_write_family(v3, "deepseek_v3", "F32", 5'000'000'000);
  c = read_config(v3);
  c["topk_method"] = "group_limited_greedy";
  write_config(v3, c);
  EXPECT_NE(error_of([&] {
              hf::import_hf({v3, t / "save", "", true});
            }).find("topk_method 'group_limited_greedy' is not supported for DeepseekV3ForCausalLM"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(t / "save"));
}

// DeepSeek-V2's group_limited_greedy ranks a group of experts by its largest score: it imports as
// moe_router_group_score max, also where num_experts_per_tok / topk_group is 2 (the 236B model's 6 / 3).
// ImportThenExportGivesTheSameBytes and PeerModelGivesOurLogits run such a tiny model
// (deepseek_v2_grouped: 8 groups of 4, 3 kept, top-6); here the same weights under Megatron's rule (the
// sum of each group's top 2) give other logits than the peer's, so those tests see the rules swapped.
// Export writes what the Hugging Face configs can say and refuses by name what they cannot.
TEST(HfMoe, DeepSeekV2GroupLimitedGreedyRanksAGroupByItsLargestScore) {
  TempDir t;
  test::peer_write_family(t / "src", "deepseek_v2_grouped", "F32", 5'000'000'000);
  const std::string ckpt = hf::import_hf({t / "src", t / "save", "", false});
  const ModelSpec imported = checkpoint::read_checkpoint_model(ckpt);
  EXPECT_EQ(imported.moe_router_group_score, GroupScore::Max);
  EXPECT_EQ(imported.moe_router_num_groups, 8);
  EXPECT_EQ(imported.moe_router_group_topk, 3);
  EXPECT_EQ(imported.moe_router_topk, 6);
  const auto peer = test::peer_logits(t / "src", test::kPeerTokens);
  test::expect_close(test::our_logits(ckpt, test::kPeerTokens), peer);
  const auto sum_rule = test::our_logits(ckpt, test::kPeerTokens,
                                         [](ModelSpec& s) { s.moe_router_group_score = GroupScore::TopkSum; });
  ASSERT_EQ(sum_rule.size(), peer.size());
  double moved = 0;
  for (size_t i = 0; i < peer.size(); ++i)
    for (size_t v = 0; v < peer[i].size(); ++v) moved = std::max(moved, double(std::abs(sum_rule[i][v] - peer[i][v])));
  EXPECT_GT(moved, 1e-2) << "this model does not tell the two group scores apart";
  // The rule is part of what the weights mean: a load under the other one is refused, naming it.
  ModelSpec other = imported;
  other.moe_router_group_score = GroupScore::TopkSum;
  EXPECT_NE(error_of([&] {
              checkpoint::check_model_fit(ckpt, other);
            }).find("moe_router_group_score is max there and topk_sum in this run's config"),
            std::string::npos);

  // The published DeepSeek-V2 (236B) config reads into our deepseek_v2 preset's model under max, and
  // writes back the same routing.
  const json v2 = json::parse(R"({"architectures": ["DeepseekV2ForCausalLM"], "aux_loss_alpha": 0.003,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 12288,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1536,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 160, "n_shared_experts": 2, "norm_topk_prob": false,
    "num_attention_heads": 128, "num_experts_per_tok": 6, "num_hidden_layers": 60, "num_key_value_heads": 128,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 16.0, "scoring_func": "softmax", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 3, "topk_method": "group_limited_greedy", "v_head_dim": 128,
    "vocab_size": 102400})");
  const ModelSpec ours = hf::spec_from_hf_config(v2, "DeepSeek-V2", nullptr);
  const ModelSpec preset = load_model_spec("deepseek_v2");
  EXPECT_EQ(ours.moe_router_group_score, GroupScore::Max);
  EXPECT_EQ(ours.moe_router_num_groups, preset.moe_router_num_groups);
  EXPECT_EQ(ours.moe_router_group_topk, preset.moe_router_group_topk);
  EXPECT_EQ(model_stats(ours, 128).parameters, model_stats(preset, 128).parameters);
  const json back = hf::hf_config_from_spec(ours, "DeepseekV2ForCausalLM", "bfloat16");
  for (const char* k : {"topk_method", "n_group", "topk_group", "num_experts_per_tok", "routed_scaling_factor"})
    EXPECT_EQ(back[k], v2[k]) << k;
  // The preset keeps Megatron's rule (the sum of each group's top 6 / 3 = 2): no DeepSeek config says that.
  EXPECT_EQ(preset.moe_router_group_score, GroupScore::TopkSum);
  const std::string e = error_of([&] { hf::hf_config_from_spec(preset, "DeepseekV2ForCausalLM", "bfloat16"); });
  EXPECT_NE(e.find("ranks a group of experts by the sum of its top 2 scores (moe_router_group_score topk_sum, "
                   "moe_router_topk 6, moe_router_group_topk 3); a DeepseekV2ForCausalLM checkpoint ranks it by its "
                   "largest score (topk_method group_limited_greedy)"),
            std::string::npos)
      << e;
  // V3's noaux_tc sums a group's top 2: a max model with its expert bias is refused as V3, by name.
  ModelSpec v3_max = load_model_spec("deepseek_v3");
  v3_max.moe_router_group_score = GroupScore::Max;
  EXPECT_NE(error_of([&] {
              hf::hf_config_from_spec(v3_max, "DeepseekV3ForCausalLM", "bfloat16");
            }).find("ranks a group of experts by its largest score (moe_router_group_score max"),
            std::string::npos);
}

// Llama 4: values its model here cannot represent, a text config named as the multimodal folder, a
// missing packed expert tensor, and exports across Llama 4 and the other families, refused by name.
TEST(HfMoe, Llama4HostileInputsAreRefusedByName) {
  TempDir t;
  const std::string src = t / "src";
  test::peer_write_family(src, "llama4", "F32", 5'000'000'000);
  const json good = read_config(src);
  auto import_with = [&](const std::function<void(json&)>& edit) {
    return import_error_with({src, t / "save", "", true}, good, edit);
  };
  EXPECT_NE(import_with([](json& c) { c["num_experts_per_tok"] = 2; }).find("num_experts_per_tok 2"),
            std::string::npos);
  EXPECT_NE(import_with([](json& c) {
              c["no_rope_layers"] = {1, 0};
            }).find("no_rope_layers lists 2 layers"),
            std::string::npos);
  EXPECT_NE(import_with([](json& c) {
              c["no_rope_layers"] = {1, 2, 0, 0};
            }).find("no_rope_layers entry 2"),
            std::string::npos);
  EXPECT_NE(import_with([](json& c) { c["moe_layers"] = {1, 4}; }).find("moe_layers names layer 4"), std::string::npos);
  EXPECT_NE(import_with([](json& c) { c["attn_temperature_tuning"] = "yes"; }).find("attn_temperature_tuning"),
            std::string::npos);
  EXPECT_NE(import_with([](json& c) {
              c["architectures"] = {"Llama4ForConditionalGeneration"};  // a text config named as the multimodal one
            }).find("model_type 'llama4_text' is not Llama4ForConditionalGeneration's"),
            std::string::npos);
  write_config(src, good);
  const std::string ckpt = hf::import_hf({src, t / "ckpt", "", false});
  hf::ExportOptions eo;
  eo.checkpoint = ckpt;
  eo.out_dir = t / "dst";
  eo.architecture = "MixtralForCausalLM";
  EXPECT_NE(error_of([&] { hf::export_hf(eo); }).find("Llama 4's parts"), std::string::npos);
  EXPECT_FALSE(fs::exists(t / "dst"));
  rewrite_tensors(src, [](std::vector<hf::TensorOut>& ts) {
    std::erase_if(ts, [](const hf::TensorOut& x) { return x.name == "model.layers.3.feed_forward.experts.down_proj"; });
  });
  EXPECT_NE(error_of([&] {
              hf::import_hf({src, t / "save", "", true});
            }).find("model.layers.3.feed_forward.experts.down_proj"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(t / "save"));
  // A Mixtral checkpoint is not a Llama 4 one: its softmax top-2 routing is refused by name.
  test::peer_write_family(t / "mixtral", "mixtral", "F32", 5'000'000'000);
  eo.checkpoint = hf::import_hf({t / "mixtral", t / "mixtral_ckpt", "", false});
  eo.architecture = "Llama4ForCausalLM";
  EXPECT_NE(error_of([&] { hf::export_hf(eo); }).find("top-1 routing whose sigmoid score"), std::string::npos);
}

namespace {

// What write_multimodal adds beside the text model: the vision encoder's and projector's tensors.
struct OtherTowers {
  int64_t tensors = 0, params = 0;
};

// The Llama 4 text folder `text` in Meta's layout (Llama4ForConditionalGeneration, model_type llama4),
// written to `out`: its config.json under text_config (without architectures, as Meta's), a small
// vision_config beside it; its tensors under language_model., beside a few of a vision encoder and
// projector (named as modeling_llama4's Llama4VisionModel and Llama4MultiModalProjector name theirs;
// their values do not matter: import leaves them out).
OtherTowers write_multimodal(const std::string& text, const std::string& out, const std::string& dtype,
                             uint64_t shard) {
  json tc = read_config(text);
  tc.erase("architectures");
  const json c = {{"architectures", {"Llama4ForConditionalGeneration"}},
                  {"model_type", "llama4"},
                  {"text_config", tc},
                  {"vision_config",
                   {{"model_type", "llama4_vision_model"},
                    {"hidden_size", 8},
                    {"num_hidden_layers", 1},
                    {"num_attention_heads", 2},
                    {"intermediate_size", 16},
                    {"image_size", 4},
                    {"patch_size", 2},
                    {"num_channels", 3},
                    {"pixel_shuffle_ratio", 0.5},
                    {"projector_input_dim", 16},
                    {"projector_output_dim", 16},
                    {"vision_output_dim", 16}}},
                  {"image_token_index", 200092},
                  {"tie_word_embeddings", false},
                  {"torch_dtype", tc["torch_dtype"]}};
  std::vector<hf::TensorOut> ts;
  {
    hf::SafetensorsReader r(text);
    for (const auto& [name, e] : r.tensors()) ts.push_back({"language_model." + name, e.dtype, e.shape, r.raw(name)});
  }
  const std::vector<std::pair<std::string, std::vector<int64_t>>> others = {
      {"vision_model.class_embedding", {8}},
      {"vision_model.positional_embedding_vlm", {5, 8}},
      {"vision_model.patch_embedding.linear.weight", {8, 12}},
      {"vision_model.model.layers.0.self_attn.q_proj.weight", {8, 8}},
      {"vision_model.model.layers.0.mlp.fc1.weight", {16, 8}},
      {"vision_model.vision_adapter.mlp.fc1.weight", {16, 32}},
      {"multi_modal_projector.linear_1.weight", {64, 16}}};
  OtherTowers towers;
  for (const auto& [name, shape] : others) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = 0.01f * float(i % 7 - 3);
    ts.push_back({name, dtype, shape, hf::f32_to_bytes(v, dtype)});
    ++towers.tensors, towers.params += n;
  }
  fs::create_directories(out);
  hf::write_safetensors(out, ts, shard);
  write_config(out, c);
  return towers;
}

// A checkpoint's weights (fp32) and its model as YAML, without the model's name (the config.json it came from).
std::vector<float> checkpoint_weights(const std::string& ckpt) {
  const ModelSpec spec = checkpoint::read_checkpoint_model(ckpt);
  LlamaModel model(spec, cpu::cpu_backend(), Precision::Fp32);
  checkpoint::LoadOptions lo;
  lo.optimizer = false;
  return checkpoint::load_checkpoint(ckpt, model.params(), lo).params;
}
std::string checkpoint_model_yaml(const std::string& ckpt) {
  ModelSpec spec = checkpoint::read_checkpoint_model(ckpt);
  spec.name.clear();
  YAML::Emitter e;
  e << model_spec_to_yaml(spec);
  return e.c_str();
}

}  // namespace

// Meta's Llama 4 folders (Llama4ForConditionalGeneration): the tiny Llama 4 text folder rewrapped in
// that layout imports into the text folder's checkpoint (the weights' bytes and the model), leaving
// the vision encoder and projector out with one log line that counts them; the PyTorch peer on the
// multimodal folder gives our logits; the export is the text model's, file for file. F32 in one file
// and BF16 sharded.
TEST(HfMoe, Llama4MultimodalFolderImportsAsItsTextModel) {
  TempDir t;
  for (const auto& [dtype, shard] : {std::pair<std::string, uint64_t>{"F32", 5'000'000'000}, {"BF16", 60'000}}) {
    SCOPED_TRACE(dtype);
    const std::string text = t / (dtype + "_text"), mm = t / (dtype + "_mm");
    test::peer_write_family(text, "llama4", dtype, shard);
    const OtherTowers towers = write_multimodal(text, mm, dtype, shard);
    EXPECT_EQ(fs::exists(fs::path(mm) / "model.safetensors.index.json"), shard < 1'000'000);
    const std::string ck_text = hf::import_hf({text, t / (dtype + "_ck_text"), "", false});
    testing::internal::CaptureStdout();
    std::string ck_mm;
    const std::string error = error_of([&] { ck_mm = hf::import_hf({mm, t / (dtype + "_ck_mm"), "", false}); });
    log::flush();
    const std::string said = testing::internal::GetCapturedStdout();
    ASSERT_EQ(error, "(no error)");
    const std::string line =
        fmt::format("the vision encoder and its projector left out ({} tensors, {} parameters under vision_model., "
                    "multi_modal_projector.): this engine imports Llama4ForConditionalGeneration's text model, "
                    "Llama4ForCausalLM",
                    towers.tensors, towers.params);
    EXPECT_NE(said.find(line), std::string::npos) << said;
    EXPECT_EQ(said.find("left out"), said.rfind("left out")) << said;  // said once
    const std::vector<float> a = checkpoint_weights(ck_text), b = checkpoint_weights(ck_mm);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    EXPECT_EQ(checkpoint_model_yaml(ck_text), checkpoint_model_yaml(ck_mm));
    if (dtype == "F32") test::expect_close(test::our_logits(ck_mm, test::kPeerTokens), test::peer_logits(mm, test::kPeerTokens));
    hf::ExportOptions eo;
    eo.dtype = dtype;
    eo.max_shard_bytes = shard;
    eo.checkpoint = ck_text, eo.out_dir = t / (dtype + "_out_text");
    hf::export_hf(eo);
    eo.checkpoint = ck_mm, eo.out_dir = t / (dtype + "_out_mm");
    hf::export_hf(eo);  // the text model, Llama4ForCausalLM
    hf::SafetensorsReader x(t / (dtype + "_out_text")), y(t / (dtype + "_out_mm"));
    ASSERT_EQ(x.tensors().size(), y.tensors().size());
    for (const auto& [name, e] : x.tensors()) {
      ASSERT_TRUE(y.has(name)) << name;
      EXPECT_EQ(y.entry(name).shape, e.shape) << name;
      EXPECT_TRUE(x.raw(name) == y.raw(name)) << name << " differs";
    }
    EXPECT_EQ(read_config(t / (dtype + "_out_text")), read_config(t / (dtype + "_out_mm")));
    EXPECT_EQ(read_config(t / (dtype + "_out_mm"))["architectures"], json::array({"Llama4ForCausalLM"}));
  }
}

// A Llama4ForConditionalGeneration folder without its text model's config or tensors, with a tensor
// of no tower, or asked of an export, is refused by name, leaving nothing behind.
TEST(HfMoe, Llama4MultimodalHostileInputsAreRefusedByName) {
  TempDir t;
  const std::string text = t / "text", mm = t / "mm", save = t / "save";
  test::peer_write_family(text, "llama4", "F32", 5'000'000'000);
  write_multimodal(text, mm, "F32", 5'000'000'000);
  const json good = read_config(mm);
  auto config_error = [&](const std::function<void(json&)>& edit) {
    const std::string e = import_error_with({mm, save, "", false}, good, edit);
    EXPECT_FALSE(fs::exists(save)) << e;
    return e;
  };
  EXPECT_NE(config_error([](json& c) { c.erase("text_config"); }).find("'text_config' is missing"), std::string::npos);
  EXPECT_NE(config_error([](json& c) { c["text_config"] = nullptr; }).find("'text_config' is missing"),
            std::string::npos);
  EXPECT_NE(config_error([](json& c) { c["text_config"] = "x"; }).find("'text_config' is string, not an object"),
            std::string::npos);
  EXPECT_NE(config_error([](json& c) { c["text_config"] = json::array({1}); }).find("'text_config' is array"),
            std::string::npos);
  EXPECT_NE(config_error([](json& c) {
              c["text_config"]["model_type"] = "llama4";
            }).find("text_config: model_type 'llama4' is not Llama4ForCausalLM's ('llama4_text')"),
            std::string::npos);
  EXPECT_NE(config_error([](json& c) {
              c["text_config"]["architectures"] = {"LlamaForCausalLM"};
            }).find("text_config: architectures [\"LlamaForCausalLM\"]"),
            std::string::npos);
  EXPECT_NE(config_error([](json& c) {
              c["text_config"].erase("intermediate_size_mlp");
            }).find("text_config: 'intermediate_size_mlp' is missing"),
            std::string::npos);
  EXPECT_NE(config_error([](json& c) {
              c["model_type"] = "llama4_text";
            }).find("model_type 'llama4_text' is not Llama4ForConditionalGeneration's ('llama4')"),
            std::string::npos);
  EXPECT_NE(config_error([](json& c) {
              c["quantization_config"] = {{"quant_method", "fbgemm_fp8"}};
            }).find("quantization_config"),
            std::string::npos);
  write_config(mm, good);

  std::vector<hf::TensorOut> all;
  rewrite_tensors(mm, [&](std::vector<hf::TensorOut>& ts) { all = ts; });
  auto tensor_error = [&](const std::function<void(std::vector<hf::TensorOut>&)>& edit) {
    rewrite_tensors(mm, [&](std::vector<hf::TensorOut>& ts) {
      ts = all;
      edit(ts);
    });
    const std::string e = error_of([&] { hf::import_hf({mm, save, "", false}); });
    EXPECT_FALSE(fs::exists(save)) << e;
    return e;
  };
  // A text tensor missing, named as the folder names it (the packed experts, a mapped weight, the head).
  for (const std::string name :
       {"language_model.model.layers.3.feed_forward.experts.down_proj",
        "language_model.model.layers.0.self_attn.k_proj.weight", "language_model.lm_head.weight"})
    EXPECT_NE(tensor_error([&](std::vector<hf::TensorOut>& ts) {
                std::erase_if(ts, [&](const hf::TensorOut& x) { return x.name == name; });
              }).find("'" + name + "'"),
              std::string::npos)
        << name;
  // A tensor of no tower, and the text model's tensors without their prefix, have no place.
  for (const std::string name :
       {"audio_model.encoder.weight", "language_model.model.extra.weight", "model.layers.0.input_layernorm.weight"})
    EXPECT_NE(tensor_error([&](std::vector<hf::TensorOut>& ts) {
                ts.push_back({name, "F32", {64}, std::string(64 * 4, '\0')});
              }).find("tensor '" + name + "' has no place in a Llama4ForConditionalGeneration model"),
              std::string::npos)
        << name;
  rewrite_tensors(mm, [&](std::vector<hf::TensorOut>& ts) { ts = all; });

  // Export writes the text model only: the multimodal layout asked for is refused by name.
  hf::ExportOptions eo;
  eo.checkpoint = hf::import_hf({mm, save, "", false});
  eo.out_dir = t / "dst";
  eo.architecture = "Llama4ForConditionalGeneration";
  EXPECT_NE(error_of([&] { hf::export_hf(eo); }).find("export it as Llama4ForCausalLM"), std::string::npos);
  EXPECT_FALSE(fs::exists(t / "dst"));
}

// An export as a family that cannot hold the model is refused by name.
TEST(HfMoe, ExportAsAnotherFamilyIsRefusedByName) {
  TempDir t;
  test::peer_write_family(t / "src", "qwen2_moe", "F32", 5'000'000'000);
  const std::string ckpt = hf::import_hf({t / "src", t / "save", "", false});
  hf::ExportOptions eo;
  eo.checkpoint = ckpt;
  eo.out_dir = t / "dst";
  eo.architecture = "LlamaForCausalLM";
  EXPECT_NE(error_of([&] { hf::export_hf(eo); }).find("QKV biases"), std::string::npos);
  eo.architecture = "DeepseekV2ForCausalLM";
  EXPECT_NE(error_of([&] { hf::export_hf(eo); }).find("QKV biases"), std::string::npos);
  eo.architecture = "Qwen2ForCausalLM";
  EXPECT_NE(error_of([&] { hf::export_hf(eo); }).find("experts"), std::string::npos);
  EXPECT_FALSE(fs::exists(t / "dst"));
}

// An imported MoE checkpoint is an ordinary one: trained from under expert parallelism on two
// ranks (mpirun through `direct --nproc 2`, ep 2: two of the four experts a rank) it gives the
// one-process run's losses.
TEST(HfMoe, ImportedCheckpointTrainsUnderExpertParallel) {
  TempDir t;
  const std::string cli = PRIMUS_CLI_PATH;
  test::peer_write_family(t / "src", "mixtral", "BF16", 5'000'000'000);
  const std::string ckpt = hf::import_hf({t / "src", t / "ckpt", "", false});
  {  // the imported model as a preset file
    const YAML::Node cfg = YAML::Load(checkpoint::read_checkpoint_config(ckpt));
    YAML::Emitter e;
    e << cfg["modules"]["pre_trainer"]["model_spec"];
    std::ofstream(t / "model.yaml") << e.c_str() << "\n";
  }
  std::ofstream(t / "exp.yaml") << "exp_name: one\nworkspace: " << (t / "ws")
                                << "\nmodules:\n  pre_trainer:\n    model: " << (t / "model.yaml") << R"(
    overrides:
      micro_batch_size: 2
      global_batch_size: 4
      seq_length: 32
      train_iters: 3
      mock_data: true
      log_interval: 1
      eval_interval: 0
      pretrained_checkpoint: )" << (t / "ckpt")
                                << "\n";
  const std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1";
  auto r = test::run_command(
      fmt::format("cd {} && {} {} direct -- train pretrain --config exp.yaml 2>&1", t.path.string(), env, cli));
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_command(
      fmt::format("cd {} && {} {} direct --nproc 2 -- train pretrain --config exp.yaml --exp_name ep2 "
                  "--expert_model_parallel_size 2 2>&1",
                  t.path.string(), env, cli));
  ASSERT_EQ(r.code, 0) << r.out;
  auto losses = [](const fs::path& run) {
    std::vector<double> out;
    std::ifstream m(run / "metrics.jsonl");
    for (std::string line; std::getline(m, line);) {
      const json j = json::parse(line);
      if (j.contains("lm_loss")) out.push_back(j["lm_loss"].get<double>());
    }
    return out;
  };
  const auto one = losses(fs::path(t / "ws") / "one"), ep2 = losses(fs::path(t / "ws") / "ep2");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(ep2.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(ep2[i], one[i], 1e-5 * one[i]) << "step " << i + 1;
}

// The published config.json files of Mixtral-8x7B-v0.1, Qwen3-30B-A3B, DeepSeek-V2-Lite,
// DeepSeek-V3, gpt-oss-20b and Llama 4 Scout / Maverick (their model keys, as Hugging Face hosts them) read into the
// models of our presets of the same names: the same parameter and active counts, the same routing and rotary keys.
TEST(HfMoe, PublishedConfigsGiveOurPresets) {
  const json mixtral = json::parse(
      R"({"architectures": ["MixtralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
    "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "vocab_size": 32000})");
  const json qwen3 = json::parse(R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
    "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
    "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 151936})");
  const json v2_lite = json::parse(R"({"architectures": ["DeepseekV2ForCausalLM"], "aux_loss_alpha": 0.001,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128, "vocab_size": 102400})");
  const json v3 = json::parse(R"({"architectures": ["DeepseekV3ForCausalLM"], "aux_loss_alpha": 0.001,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
    "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}, "rope_theta": 10000,
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true, "tie_word_embeddings": false,
    "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 129280})");
  json gpt_oss = json::parse(R"({"architectures": ["GptOssForCausalLM"], "attention_bias": true, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096, "intermediate_size": 2880,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4,
    "num_hidden_layers": 24, "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                            "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
    "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false}, "rope_theta": 150000,
    "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": false,
    "vocab_size": 201088})");
  for (int l = 0; l < 24; ++l) gpt_oss["layer_types"].push_back(l % 2 == 0 ? "sliding_attention" : "full_attention");
  // Llama 4 Scout (-Instruct) and Maverick: the released config.json is Llama4ForConditionalGeneration's
  // (model_type llama4, the vision tower beside); its text_config is the Llama4ForCausalLM config read
  // here, with that architecture named.
  const json scout_release = json::parse(
      R"({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "text_config": {"attention_bias": false, "attention_chunk_size": 8192, "attn_scale": 0.1,
    "attn_temperature_tuning": 4, "floor_scale": 8192, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
    "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "max_position_embeddings": 10485760, "model_type": "llama4_text", "num_attention_heads": 40,
    "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "num_local_experts": 16,
    "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0,
    "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "rope_theta": 500000.0,
    "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "use_qk_norm": true, "vocab_size": 202048},
    "tie_word_embeddings": false})");
  json scout = scout_release["text_config"], maverick = scout;
  scout["architectures"] = maverick["architectures"] = {"Llama4ForCausalLM"};
  {  // the released config.json itself reads into its text_config's model (docs/checkpoints.md)
    YAML::Emitter released, text;
    released << model_spec_to_yaml(hf::spec_from_hf_config(scout_release, "scout", nullptr));
    text << model_spec_to_yaml(hf::spec_from_hf_config(scout, "scout", nullptr));
    EXPECT_EQ(std::string(released.c_str()), std::string(text.c_str()));
  }
  maverick["interleave_moe_layer_step"] = 2, maverick["num_local_experts"] = 128, maverick["use_qk_norm"] = false;
  maverick["max_position_embeddings"] = 1048576, maverick["rope_scaling"] = nullptr;
  for (int l = 0; l < 48; ++l) {
    scout["moe_layers"].push_back(l);
    if (l % 2 == 1) maverick["moe_layers"].push_back(l);
    for (json* c : {&scout, &maverick}) (*c)["no_rope_layers"].push_back(int((l + 1) % 4 != 0));
  }
  for (const auto& [config, preset] : {std::pair{&mixtral, "mixtral_8x7B_v0.1"},
                                       {&qwen3, "qwen3_30B_A3B"},
                                       {&v2_lite, "deepseek_v2_lite"},
                                       {&v3, "deepseek_v3"},
                                       {&gpt_oss, "gpt_oss_20B"},
                                       {&scout, "llama4_17B16E"},
                                       {&maverick, "llama4_17B128E"}}) {
    SCOPED_TRACE(preset);
    const ModelSpec ours = hf::spec_from_hf_config(*config, preset, nullptr);
    const ModelSpec want = load_model_spec(preset);
    EXPECT_EQ(ours.mtp_num_layers, want.mtp_num_layers);  // DeepSeek-V3's num_nextn_predict_layers 1
    const ModelStats a = model_stats(ours, 128), b = model_stats(want, 128);
    EXPECT_EQ(a.parameters, b.parameters);
    EXPECT_EQ(a.active_parameters, b.active_parameters);
    EXPECT_EQ(a.flops_per_token, b.flops_per_token);  // windows, experts and attention widths alike
    EXPECT_EQ(ours.moe_router_score_function, want.moe_router_score_function);
    EXPECT_EQ(ours.moe_router_num_groups, want.moe_router_num_groups);
    EXPECT_EQ(ours.moe_router_group_topk, want.moe_router_group_topk);
    EXPECT_EQ(ours.moe_router_enable_expert_bias, want.moe_router_enable_expert_bias);
    EXPECT_EQ(ours.moe_router_topk_scaling_factor, want.moe_router_topk_scaling_factor);
    EXPECT_EQ(ours.moe_router_load_balancing_type, want.moe_router_load_balancing_type);
    EXPECT_EQ(ours.rotary_base, want.rotary_base);
    EXPECT_EQ(ours.rotary_scaling_factor, want.rotary_scaling_factor);
    EXPECT_EQ(ours.mscale, want.mscale);
    EXPECT_EQ(ours.mscale_all_dim, want.mscale_all_dim);
    EXPECT_EQ(ours.position_embedding_type, want.position_embedding_type);
    EXPECT_EQ(ours.yarn_correction_range_round_to_int, want.yarn_correction_range_round_to_int);
    EXPECT_EQ(ours.window_size, want.window_size);
    EXPECT_EQ(ours.activation_func_clamp_value, want.activation_func_clamp_value);
    EXPECT_EQ(ours.norm_epsilon, want.norm_epsilon);
    for (int64_t l = 0; l < ours.num_layers; ++l) {  // Llama 4's NoPE and MoE layers
      EXPECT_EQ(ours.layer_uses_rope(l), want.layer_uses_rope(l)) << "layer " << l;
      EXPECT_EQ(ours.is_moe_layer(l), want.is_moe_layer(l)) << "layer " << l;
    }
    EXPECT_EQ(ours.use_rope_scaling, want.use_rope_scaling);
    if (want.use_rope_scaling) {  // Llama 3.1's scaling (Scout's)
      EXPECT_EQ(ours.rope_scaling_factor, want.rope_scaling_factor);
      EXPECT_EQ(ours.rope_low_freq_factor, want.rope_low_freq_factor);
      EXPECT_EQ(ours.rope_high_freq_factor, want.rope_high_freq_factor);
      EXPECT_EQ(ours.rope_original_max_position_embeddings, want.rope_original_max_position_embeddings);
    }
    EXPECT_EQ(ours.qk_l2_norm, want.qk_l2_norm);
    EXPECT_EQ(ours.attention_chunk_size, want.attention_chunk_size);
    EXPECT_EQ(ours.attn_temperature_tuning, want.attn_temperature_tuning);
    EXPECT_EQ(ours.moe_apply_probs_on_input, want.moe_apply_probs_on_input);
    // Routing weights: a softmax over the chosen logits equals a softmax over all, renormalised.
    auto renormalised = [](const ModelSpec& s) { return !s.moe_router_pre_softmax || s.moe_router_norm_topk_prob; };
    EXPECT_EQ(renormalised(ours), renormalised(want));
    // And back: the config an export writes reads into the same model.
    const json back = hf::hf_config_from_spec(ours, hf::default_architecture(ours).name, "bfloat16");
    EXPECT_EQ(back["architectures"], (*config)["architectures"]);
    if (config->contains("interleave_moe_layer_step")) {  // Llama 4's
      EXPECT_EQ(back["interleave_moe_layer_step"], (*config)["interleave_moe_layer_step"]);
    }
    // DeepSeek-V3's multi-token prediction depth (1), absent elsewhere.
    EXPECT_EQ(back.value("num_nextn_predict_layers", json()), config->value("num_nextn_predict_layers", json()));
    EXPECT_EQ(model_stats(hf::spec_from_hf_config(back, preset, nullptr), 128).flops_per_token, a.flops_per_token);
  }
}
