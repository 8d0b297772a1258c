// Strict resume (issue 32): a checkpoint loads only into the model it was saved from, unless the
// user says otherwise (load_strict, finetune, no_load_optim); see checkpoint/model_fit.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <yaml-cpp/yaml.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_fit.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/llama.h"
#include "support/error_of.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

namespace fs = std::filesystem;
using namespace primus;
using Overrides = std::vector<std::pair<std::string, std::string>>;

namespace {

// tiny_moe (multi-latent attention with QK-norm, MoE with a shared expert, grouped sigmoid routing
// and the expert bias) shrunk to two layers of width 64, on the fixture's corpus.
struct TinyMoe {
  test::TinyExperiment exp;
  std::string config;
  TinyMoe() {
    config = (exp.dir / "moe.yaml").string();
    std::ofstream(config) << "exp_name: tiny_moe_test\nworkspace: " << (exp.dir / "ws").string() << R"(
modules:
  pre_trainer:
    model: tiny_moe
    overrides:
      num_layers: 2
      hidden_size: 64
      ffn_hidden_size: 96
      num_attention_heads: 4
      num_query_groups: 4
      vocab_size: 256
      max_position_embeddings: 64
      q_lora_rank: 32
      kv_lora_rank: 16
      qk_head_dim: 16
      qk_pos_emb_head_dim: 8
      v_head_dim: 16
      num_experts: 4
      moe_ffn_hidden_size: 32
      moe_shared_expert_intermediate_size: 32
      moe_layer_freq: [0, 1]
      moe_router_num_groups: 2
      moe_router_group_topk: 1
      micro_batch_size: 2
      global_batch_size: 4
      seq_length: 32
      train_iters: 2
      lr: 3.0e-3
      lr_warmup_iters: 1
      log_interval: 1
      eval_interval: 0
      split: 90,10,0
      data_path: [)" << (exp.dir / "corpus").string()
                          << R"(]
)";
  }
  config::ExperimentConfig load(Overrides overrides = {}) const { return config::load_experiment(config, overrides); }
};

using test::pretrain_error;
using test::slurp;

}  // namespace

// Each flag that adds, removes or reshapes trained tensors, or changes what they compute, is refused
// by name on resume, with both values and the ways to go on; nothing is saved, and the final error
// of the automatic resume never suggests --overwrite (which would replace the trained checkpoints).
TEST(StrictResume, EachWeightChangingFlagIsRefusedByName) {
  TinyMoe moe;
  const auto base = moe.load();
  train::pretrain(base);
  const fs::path ckpt = fs::path(base.checkpoint_dir()) / checkpoint::checkpoint_name(2);
  const std::string shard = slurp(ckpt / "rank_00000.bin");
  const std::vector<std::pair<Overrides, std::string>> cases = {
      {{{"qk_layernorm", "false"}}, "qk_layernorm is true there and false in this run's config"},
      {{{"moe_shared_expert_intermediate_size", "0"}}, "moe_shared_expert_intermediate_size is 32 there and null"},
      {{{"moe_router_enable_expert_bias", "false"}}, "moe_router_enable_expert_bias is true there and false"},
      {{{"kv_lora_rank", "8"}}, "kv_lora_rank is 16 there and 8"},
      {{{"q_lora_rank", "16"}}, "q_lora_rank is 32 there and 16"},
      {{{"num_experts", "8"}}, "num_experts is 4 there and 8"},
      {{{"moe_shared_expert_gate", "true"}}, "moe_shared_expert_gate is false there and true"},
      {{{"moe_router_topk", "1"}}, "moe_router_topk is 2 there and 1"},
      {{{"rotary_base", "20000"}}, "rotary_base is 10000 there and 20000"},
  };
  for (const auto& [flags, named] : cases) {
    Overrides ov = flags;
    ov.push_back({"train_iters", "3"});
    const std::string e = pretrain_error(moe.load(ov));
    EXPECT_NE(e.find(named), std::string::npos) << e;
    EXPECT_NE(e.find("no checkpoint in " + base.checkpoint_dir() + " can be resumed by this run"), std::string::npos)
        << e;
    EXPECT_NE(e.find("--load_strict false"), std::string::npos) << e;
    EXPECT_EQ(e.find("overwrite"), std::string::npos) << e;
  }
  // A field that changes only what the weights compute may start a new run from them: the refusal says how.
  EXPECT_NE(pretrain_error(moe.load({{"rotary_base", "20000"}, {"train_iters", "3"}})).find("--finetune true --load"),
            std::string::npos);
  // An explicit `load` is refused the same way.
  const std::string e = pretrain_error(
      moe.load({{"load", ckpt.string()}, {"qk_layernorm", "false"}, {"train_iters", "3"}}));
  EXPECT_NE(e.find("cannot load checkpoint"), std::string::npos) << e;
  EXPECT_NE(e.find("qk_layernorm"), std::string::npos) << e;
  EXPECT_NE(e.find("self_attention.q_layernorm.weight"), std::string::npos) << e;  // what would be dropped
  // Nothing was saved over the trained checkpoint.
  EXPECT_EQ(checkpoint::list_checkpoints(base.checkpoint_dir()).size(), 1u);
  EXPECT_EQ(slurp(ckpt / "rank_00000.bin"), shard);
}

// load_strict false: the tensors that match load, the others are listed (dropped from the
// checkpoint, or left at their initial values), and the run goes on from the checkpoint.
TEST(StrictResume, LoadStrictFalseLoadsWhatMatchesAndListsTheRest) {
  TinyMoe moe;
  const auto base = moe.load();
  train::pretrain(base);
  const auto cfg = moe.load(
      {{"qk_layernorm", "false"}, {"moe_shared_expert_gate", "true"}, {"load_strict", "false"}, {"train_iters", "3"}});
  testing::internal::CaptureStdout();
  train::TrainSummary s;
  const std::string e = test::error_of([&] { s = train::pretrain(cfg); });
  log::flush();
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(e, "(no error)");
  EXPECT_EQ(s.start_iteration, 2);
  EXPECT_NE(out.find("qk_layernorm: true in the checkpoint, false in this run"), std::string::npos) << out;
  for (const char* t :
       {"decoder.layers.0.self_attention.q_layernorm.weight", "decoder.layers.1.self_attention.kv_layernorm.weight"})
    EXPECT_NE(out.find(t), std::string::npos) << t << " not listed as dropped:\n" << out;
  EXPECT_NE(out.find("Dropped (4 checkpoint tensors"), std::string::npos) << out;
  EXPECT_NE(out.find("(1 tensors the checkpoint lacks): decoder.layers.1.mlp.shared_experts.gate_weight"),
            std::string::npos)
      << out;
  // The run's own checkpoint holds its model: it resumes strictly.
  const std::string next = (fs::path(cfg.checkpoint_dir()) / checkpoint::checkpoint_name(3)).string();
  EXPECT_TRUE(checkpoint::check_model_fit(next, cfg.model_spec).exact());
}

// What load_strict false leaves unloaded keeps the model's own values; what matches is the checkpoint's.
TEST(StrictResume, ANonStrictLoadKeepsTheInitialValuesOfWhatTheCheckpointLacks) {
  test::TinyExperiment exp;
  const auto cfg = exp.load();
  ModelSpec other = cfg.model_spec;
  other.qk_layernorm = true;
  LlamaModel saved(cfg.model_spec, cpu::cpu_backend(), Precision::Fp32);
  saved.params().init(7, 0.02, 0.01);
  std::vector<float> zeros(saved.params().numel(), 0.0f);
  const fs::path dir = exp.dir / "ck";
  const std::string ck = checkpoint::save_checkpoint(dir.string(), saved.params(), zeros.data(), zeros.data(),
                                                     {1, 4, 1, 1, "r"}, "x");
  LlamaModel model(other, cpu::cpu_backend(), Precision::Fp32);
  model.params().init(8, 0.02, 0.01);
  EXPECT_NE(test::error_of([&] { checkpoint::load_checkpoint(ck, model.params()); }).find("has no tensor"),
            std::string::npos);
  checkpoint::LoadOptions lo;
  lo.strict = false;
  const checkpoint::CheckpointData d = checkpoint::load_checkpoint(ck, model.params(), lo);
  EXPECT_EQ(d.fresh.size(), 2u);  // q and k norms of the one layer
  for (const StoredParam& p : model.params().infos()) {
    const bool fresh = std::find(d.fresh.begin(), d.fresh.end(), p.name) != d.fresh.end();
    const float* want = fresh ? model.params().value<float>(model.params().find(p.name))
                              : saved.params().value<float>(saved.params().find(p.name));
    EXPECT_TRUE(std::equal(want, want + p.numel, d.params.begin() + p.offset)) << p.name;
    EXPECT_EQ(fresh,
              p.name.find("_layernorm") != std::string::npos && p.name.find("self_attention") != std::string::npos)
        << p.name;
  }
}

// A checkpoint tensor the model has no place for is an error under strict loading (today it was
// ignored), whatever the table of fields says; `generate` and `checkpoint export` run the same check.
TEST(StrictResume, ACheckpointTensorWithoutAPlaceIsRefused) {
  test::TinyExperiment exp;
  const Overrides base{{"train_iters", "2"}, {"eval_interval", "0"}, {"lr_warmup_iters", "1"}};
  const auto cfg = exp.load(base);
  LlamaModel model(cfg.model_spec, cpu::cpu_backend(), Precision::Fp32);
  ParamStore store;
  for (const StoredParam& p : model.params().infos()) store.add(p.name, p.shape, ParamInit::Normal, p.weight_decay);
  store.add("decoder.layers.0.self_attention.extra.weight", {4}, ParamInit::Ones, false);
  store.allocate();
  store.init(3, 0.02, 0.01);
  std::vector<float> zeros(store.numel(), 0.0f);
  YAML::Node yaml;
  yaml["modules"]["pre_trainer"]["model_spec"] = model_spec_to_yaml(cfg.model_spec);
  const std::string ck = checkpoint::save_checkpoint((exp.dir / "other").string(), store, zeros.data(), zeros.data(),
                                                     {1, 4, 1, 1, "r"}, YAML::Dump(yaml) + "\n");
  Overrides with_load = base;
  with_load.push_back({"load", ck});
  const std::string e = pretrain_error(exp.load(with_load));
  EXPECT_NE(e.find("has no place for 1 of its tensors: decoder.layers.0.self_attention.extra.weight"),
            std::string::npos)
      << e;
  const std::string read = test::error_of(
      [&] { checkpoint::check_model_fit(ck, cfg.model_spec, {checkpoint::LoadPurpose::Read}); });
  EXPECT_NE(read.find("does not hold the model its own config.yaml describes"), std::string::npos) << read;
  EXPECT_NE(read.find("extra.weight"), std::string::npos) << read;
}

// Damaged optimizer state: the error says how to resume the weights without it, and no_load_optim does.
TEST(StrictResume, NoLoadOptimResumesTheWeightsWithoutTheOptimizerState) {
  test::TinyExperiment exp;
  const auto cfg = exp.load(
      {{"train_iters", "4"}, {"save_interval", "2"}, {"eval_interval", "0"}, {"lr_warmup_iters", "1"}});
  train::pretrain(cfg);
  const fs::path shard = fs::path(cfg.checkpoint_dir()) / checkpoint::checkpoint_name(4) / "rank_00000.bin";
  {
    const auto at = std::streamoff(fs::file_size(shard)) - 8;  // in exp_avg_sq
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    f.seekp(at);
    f.put(char(c ^ 0x40));
  }
  const Overrides on{{"train_iters", "5"}, {"eval_interval", "0"}, {"lr_warmup_iters", "1"}};
  Overrides with_load = on;
  with_load.push_back({"load", fs::path(shard).parent_path().string()});
  const std::string e = pretrain_error(exp.load(with_load));
  EXPECT_NE(e.find("exp_avg_sq fails its CRC-32"), std::string::npos) << e;
  EXPECT_NE(e.find("--no_load_optim true"), std::string::npos) << e;
  Overrides no_optim = on;
  no_optim.push_back({"no_load_optim", "true"});
  const auto s = train::pretrain(exp.load(no_optim));
  EXPECT_EQ(s.start_iteration, 4);
}

// Every model key is either compared on load or named as free to change: a new key must be placed.
TEST(StrictResume, EveryModelKeyIsComparedOrNamedFreeToChange) {
  const auto compared = checkpoint::model_keys_compared(), free = checkpoint::model_keys_free_to_change();
  std::set<std::string> placed(compared.begin(), compared.end());
  for (const auto& k : free) EXPECT_TRUE(placed.insert(k).second) << k << " is in both lists";
  for (const auto& k : model_spec_keys()) EXPECT_EQ(placed.count(k), 1u) << k << " is in neither list";
  EXPECT_EQ(placed.size(), model_spec_keys().size());
}
