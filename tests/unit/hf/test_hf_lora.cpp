// LoRA checkpoints out to Hugging Face: `checkpoint export` merges W + (alpha / dim) B A, and the
// imported merged model computes the LoRA model's loss; `--adapters` writes a PEFT folder
// (adapter_config.json, adapter_model.safetensors) with PEFT's names and shapes, the fused qkv and
// gate/up adapters split (A shared, B by rows), whose tensors give back the merged weights.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/rng.h"
#include "hf/hf_checkpoint.h"
#include "hf/safetensors.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "plan/model_options.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace primus;

namespace {

// The loss of `model` with the weights of checkpoint `dir` on a fixed batch.
double loss_of(LlamaModel& model, const std::string& dir) {
  const checkpoint::CheckpointData ck = checkpoint::load_checkpoint(dir, model.params());
  std::copy(ck.params.begin(), ck.params.end(), model.params().values().data<float>());
  model.sync_working_weights();
  Rng rng(3);
  std::vector<int32_t> tokens(2 * 16), targets(2 * 16);
  for (auto& t : tokens) t = int32_t(rng.next_u64() % 50);
  for (auto& t : targets) t = int32_t(rng.next_u64() % 50);
  LlamaContext c;
  return model.forward(c, tokens.data(), targets.data(), 2, 16);
}

}  // namespace

TEST(HfLora, MergedExportAndPeftFolder) {
  test::TinyExperiment exp;
  const fs::path t = exp.dir / "out";
  const auto cfg = exp.load({{"modules.pre_trainer.overrides.lora.enabled", "true"}, {"lora.dim", "4"},
                             {"lora.alpha", "8"}, {"train_iters", "4"}, {"lr_warmup_iters", "0"}, {"lr", "2e-2"},
                             {"eval_interval", "0"}});
  train::pretrain(cfg);
  const std::string ckpt = checkpoint::resolve_checkpoint(cfg.checkpoint_dir());

  // Merged: export, import, and the plain model computes the LoRA model's loss.
  hf::ExportOptions eo;
  eo.checkpoint = ckpt;
  eo.out_dir = (t / "merged").string();
  hf::export_hf(eo);
  const std::string imported = hf::import_hf({(t / "merged").string(), (t / "imported").string(), "", false});
  LlamaModel lora(cfg.model_spec, cpu::cpu_backend(), Precision::Fp32, plan::model_options(cfg.train));
  LlamaModel plain(cfg.model_spec, cpu::cpu_backend(), Precision::Fp32);
  const double want = loss_of(lora, ckpt), got = loss_of(plain, imported);
  EXPECT_NEAR(got, want, 1e-5 * want);
  // The adapters changed the model: the frozen base alone computes another loss.
  LlamaModel base(cfg.model_spec, cpu::cpu_backend(), Precision::Fp32);
  base.init_weights(uint64_t(cfg.train.seed));
  LlamaContext bc;
  Rng rng(3);
  std::vector<int32_t> tokens(2 * 16), targets(2 * 16);
  for (auto& x : tokens) x = int32_t(rng.next_u64() % 50);
  for (auto& x : targets) x = int32_t(rng.next_u64() % 50);
  EXPECT_GT(std::fabs(base.forward(bc, tokens.data(), targets.data(), 2, 16) - want), 1e-4);

  // PEFT folder.
  eo.out_dir = (t / "peft").string();
  eo.adapters = true;
  hf::export_hf(eo);
  ASSERT_TRUE(fs::exists(t / "peft" / "adapter_model.safetensors"));
  const json pc = json::parse(std::ifstream(t / "peft" / "adapter_config.json"));
  EXPECT_EQ(pc["peft_type"], "LORA");
  EXPECT_EQ(pc["r"], 4);
  EXPECT_EQ(pc["lora_alpha"].get<double>(), 8.0);
  EXPECT_EQ(pc["target_modules"],
            json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
  const ModelSpec& s = cfg.model_spec;
  const int64_t C = s.hidden_size, F = s.ffn_hidden_size;
  hf::SafetensorsReader peft((t / "peft" / "adapter_model.safetensors").string());
  EXPECT_EQ(peft.tensors().size(), size_t(s.num_layers * 7 * 2));
  const std::string l0 = "base_model.model.model.layers.0.";
  EXPECT_EQ(peft.entry(l0 + "self_attn.q_proj.lora_A.weight").shape, (std::vector<int64_t>{4, C}));
  EXPECT_EQ(peft.entry(l0 + "self_attn.k_proj.lora_B.weight").shape, (std::vector<int64_t>{s.kv_size(), 4}));
  EXPECT_EQ(peft.entry(l0 + "self_attn.o_proj.lora_A.weight").shape, (std::vector<int64_t>{4, s.q_size()}));
  EXPECT_EQ(peft.entry(l0 + "mlp.up_proj.lora_B.weight").shape, (std::vector<int64_t>{F, 4}));
  EXPECT_EQ(peft.entry(l0 + "mlp.down_proj.lora_A.weight").shape, (std::vector<int64_t>{4, F}));
  // Read back: merged up_proj = base up_proj + (alpha / r) lora_B lora_A.
  hf::SafetensorsReader merged((t / "merged").string());
  const std::vector<float> up = merged.as_f32("model.layers.0.mlp.up_proj.weight");
  const std::vector<float> A = peft.as_f32(l0 + "mlp.up_proj.lora_A.weight"), B = peft.as_f32(l0 + "mlp.up_proj.lora_B.weight");
  const float* W = base.params().value<float>(base.params().find("decoder.layers.0.mlp.linear_fc1.weight")) + F * C;
  double max_b = 0, max_err = 0;
  for (float b : B) max_b = std::max(max_b, double(std::fabs(b)));
  EXPECT_GT(max_b, 0.0) << "B trained away from zero";
  for (int64_t i = 0; i < F; ++i)
    for (int64_t j = 0; j < C; ++j) {
      double d = 0;
      for (int64_t k = 0; k < 4; ++k) d += double(B[size_t(i * 4 + k)]) * double(A[size_t(k * C + j)]);
      max_err = std::max(max_err, std::fabs(double(W[i * C + j]) + 2.0 * d - double(up[size_t(i * C + j)])));
    }
  EXPECT_LT(max_err, 1e-6);
}

// The PEFT folder read back (hf::read_peft_adapters) gives the checkpoint's adapters bit for bit,
// and a run started from them (peft_adapter_path: train::pretrain's starting adapters) holds the
// trained run's weights exactly (lr 0 keeps them through its step); a folder of another rank or of
// another base model is refused, naming what differs.
TEST(HfLora, PeftFolderRoundTripsAndRefusesAnotherRankOrBase) {
  test::TinyExperiment exp;
  const std::vector<std::pair<std::string, std::string>> lora = {
      {"modules.pre_trainer.overrides.lora.enabled", "true"}, {"lora.dim", "4"}, {"lora.alpha", "8"},
      {"eval_interval", "0"}, {"lr_warmup_iters", "0"}};
  auto with = [&](std::vector<std::pair<std::string, std::string>> more) {
    more.insert(more.begin(), lora.begin(), lora.end());
    return exp.load(more);
  };
  const auto cfg = with({{"exp_name", "trained"}, {"train_iters", "2"}, {"lr", "2e-2"}});
  train::pretrain(cfg);
  const std::string ckpt = checkpoint::resolve_checkpoint(cfg.checkpoint_dir());
  hf::ExportOptions eo;
  eo.checkpoint = ckpt;
  eo.out_dir = (exp.dir / "peft").string();
  eo.adapters = true;
  hf::export_hf(eo);

  const auto adapters = hf::read_peft_adapters(eo.out_dir, cfg.model_spec, cfg.train.lora);
  LlamaModel model(cfg.model_spec, cpu::cpu_backend(), Precision::Fp32, plan::model_options(cfg.train));
  const ParamStore& p = model.params();
  const checkpoint::CheckpointData saved = checkpoint::load_checkpoint(ckpt, p);
  ASSERT_EQ(adapters.size(), p.infos().size() - size_t(model.first_trainable()));
  double moved = 0;
  for (int id = model.first_trainable(); id < int(p.infos().size()); ++id) {
    const StoredParam& info = p.infos()[size_t(id)];
    const std::vector<float> want(saved.params.begin() + info.offset, saved.params.begin() + info.offset + info.numel);
    ASSERT_EQ(adapters.at(info.name), want) << info.name;
    for (float v : want) moved += std::fabs(v);
  }
  EXPECT_GT(moved, 0.0);

  // A run from the base (the same seed) and the folder's adapters starts with the trained weights.
  const auto again = with({{"exp_name", "from_peft"}, {"train_iters", "1"}, {"lr", "0"}, {"min_lr", "0"},
                           {"weight_decay", "0"}, {"peft_adapter_path", eo.out_dir}});
  train::pretrain(again, adapters);
  const checkpoint::CheckpointData started =
      checkpoint::load_checkpoint(checkpoint::resolve_checkpoint(again.checkpoint_dir()), p);
  EXPECT_EQ(started.params, saved.params);

  auto refused = [&](const ModelSpec& spec, const LoraOptions& l) {
    try {
      hf::read_peft_adapters(eo.out_dir, spec, l);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("not refused");
  };
  LoraOptions rank8 = cfg.train.lora;
  rank8.dim = 8;
  EXPECT_NE(refused(cfg.model_spec, rank8).find("the adapters' rank r is 4, this run's lora.dim is 8"),
            std::string::npos);
  ModelSpec wider = cfg.model_spec;
  wider.ffn_hidden_size += 8;
  EXPECT_NE(refused(wider, cfg.train.lora).find("the adapters of another base model"), std::string::npos)
      << refused(wider, cfg.train.lora);
  LoraOptions fewer = cfg.train.lora;
  fewer.targets[uint8_t(LoraTarget::LinearFc2)] = false;
  EXPECT_NE(refused(cfg.model_spec, fewer).find("down_proj.lora_A.weight is not an adapter of this run"),
            std::string::npos)
      << refused(cfg.model_spec, fewer);
}
