// Issue 18: Megatron-LM and Primus argument names in experiment configs: applied, accepted with no
// effect (listed), or an error naming the key; `config: pre_trainer.yaml`; null as unset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "config/experiment.h"
#include "config/foreign_keys.h"
#include "core/error.h"
#include "model/model_spec.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace primus;
using namespace primus::config;

namespace {

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("primus_mk_") {}
};

// A Primus-shaped experiment with extra override lines.
std::string experiment(const std::string& extra, const std::string& module_config = "") {
  return "exp_name: mk\nworkspace: /tmp/primus_mk_ws\nmodules:\n  pre_trainer:\n    framework: megatron\n" +
         (module_config.empty() ? "" : "    config: " + module_config + "\n") +
         "    model: tiny\n    overrides:\n      train_iters: 4\n      mock_data: true\n" + extra;
}

using test::error_of;

}  // namespace

TEST(MegatronKeys, TableIsSortedUniqueAndLeavesOurKeysToUs) {
  const auto& keys = foreign_keys();
  ASSERT_GT(keys.size(), 1000u);  // Megatron-LM's arguments and Primus's config keys
  std::set<std::string> ours;
  for (const auto& k : training_keys()) ours.insert(k.name);
  for (const auto& k : model_spec_keys()) ours.insert(k);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) EXPECT_LT(std::string(keys[i - 1].name), std::string(keys[i].name)) << "sorted, unique";
    if (keys[i].status == KeyStatus::Applied)  // another name of one of ours
      EXPECT_EQ(ours.count(keys[i].engine_value), 1u) << keys[i].name << " -> " << keys[i].engine_value;
  }
  for (const char* name : {"wandb_project", "stderr_sink_level", "ckpt_format", "enable_primus_turbo",
                           "cross_entropy_fusion_impl", "overlap_param_gather", "use_flash_attn"})
    ASSERT_TRUE(find_foreign_key(name) && find_foreign_key(name)->status == KeyStatus::NoEffect) << name;
  for (const char* name : {"swiglu", "normalization", "mamba_num_heads", "fp4", "train_data_path"})
    ASSERT_TRUE(find_foreign_key(name) && find_foreign_key(name)->status == KeyStatus::NotSupported) << name;
  EXPECT_EQ(find_foreign_key("no_such_key"), nullptr);
  EXPECT_STREQ(key_source("micro_batch_size"), "Megatron-LM, Primus");
  EXPECT_STREQ(key_source("enable_primus_turbo"), "Primus");
  EXPECT_STREQ(key_source("pipeline_balance"), "this engine");
}

// A key we apply must not keep its old line in the foreign table: the line's verdict ("not
// supported", a default, a note) would be stale, and it would be the table, not the code, that
// said so. Implementing a key moves its line to applied_key_sources() in foreign_keys.cpp.
TEST(MegatronKeys, NoForeignEntryShadowsAnAppliedKey) {
  std::vector<std::string> shadowing;
  for (const auto& k : training_keys())
    if (find_foreign_key(k.name)) shadowing.push_back(k.name);
  for (const auto& k : model_spec_keys())
    if (find_foreign_key(k)) shadowing.push_back(k);
  EXPECT_TRUE(shadowing.empty()) << "applied keys with a line in foreign_keys.cpp's foreign_keys() (move them to "
                                    "applied_key_sources()): "
                                 << ::testing::PrintToString(shadowing);
  // Their names keep where they come from.
  EXPECT_STREQ(key_source("num_experts"), "Megatron-LM, Primus");
  EXPECT_STREQ(key_source("original_max_position_embeddings"), "Primus");
  EXPECT_STREQ(key_source("kv_lora_rank"), "Megatron-LM, Primus");
}

TEST(MegatronKeys, NoEffectKeysAreAcceptedAndListed) {
  TempDir d;
  auto f = d.write("e.yaml", experiment("      wandb_project: \"Proj\"\n      stderr_sink_level: DEBUG\n"
                                        "      use_flash_attn: true\n      log_throughput: null\n"));
  auto cfg = load_experiment(f);
  ASSERT_EQ(cfg.no_effect.size(), 3u);  // null is unset: not listed
  EXPECT_EQ(cfg.no_effect[0].key, "wandb_project");
  const std::string line = no_effect_summary(cfg);
  EXPECT_NE(line.find("wandb_project, stderr_sink_level"), std::string::npos) << line;
  EXPECT_NE(line.find("use_flash_attn (a kernel"), std::string::npos) << line;
  const std::string printed = cfg.resolved_yaml();
  EXPECT_NE(printed.find("# accepted with no effect on this engine:\n#   wandb_project: 'Proj'"), std::string::npos)
      << printed;
}

// Primus-Turbo's switch of gpt-oss's sinks and window (docs/model_math.md, gpt-oss): read as the
// model keys; without use_sink_attention the window keys have no effect (listed); bad values and a
// config that also writes the model keys are refused by name.
TEST(MegatronKeys, TurboSinkKeysAreTheAttentionModelKeys) {
  TempDir d;
  auto on = d.write("on.yaml", experiment("      use_sink_attention: true\n      sink_sliding_window: 16\n"));
  ExperimentConfig c = load_experiment(on);
  EXPECT_TRUE(c.model_spec.learns_attention_sinks());
  EXPECT_EQ(c.model_spec.layer_window(0), 16);
  EXPECT_EQ(c.model_spec.layer_window(1), -1);
  auto all = d.write("all.yaml", experiment("      use_sink_attention: true\n      sink_sliding_window: 16\n"
                                            "      sink_window_even_layers_only: false\n"));
  EXPECT_EQ(load_experiment(all).model_spec.layer_window(1), 16);
  auto off = d.write("off.yaml", experiment("      use_sink_attention: false\n      sink_sliding_window: 16\n"));
  c = load_experiment(off);
  EXPECT_FALSE(c.model_spec.has_attention_sinks());
  ASSERT_EQ(c.no_effect.size(), 1u);
  EXPECT_EQ(c.no_effect[0].key, "sink_sliding_window");
  auto bad = d.write("bad.yaml", experiment("      use_sink_attention: true\n      sink_sliding_window: -2\n"));
  EXPECT_NE(error_of([&] { load_experiment(bad); }).find("sink_sliding_window must be 0 (no window) or a positive"),
            std::string::npos);
  auto both = d.write("both.yaml", experiment("      use_sink_attention: true\n      softmax_type: off-by-one\n"));
  EXPECT_NE(error_of([&] { load_experiment(both); }).find("and softmax_type both set"), std::string::npos);
}

TEST(MegatronKeys, NotSupportedIsAnErrorUnlessItIsTheEngineValue) {
  TempDir d;
  // The values this engine runs with, and null, load.
  auto ok = d.write("ok.yaml", experiment("      swiglu: true\n      normalization: RMSNorm\n      finetune: false\n"
                                          "      mamba_num_heads: null\n      no_save_optim: false\n"
                                          "      attention_dropout: 0\n      position_embedding_type: rope\n"));
  EXPECT_NO_THROW(load_experiment(ok));
  struct Case {
    const char* line;
    const char* key;
  };
  for (const Case& c : {Case{"      normalization: LayerNorm\n", "normalization"},
                        Case{"      mamba_num_heads: 8\n", "mamba_num_heads"}, Case{"      fp4: e2m1\n", "fp4"},
                        Case{"      swiglu: false\n", "swiglu"}, Case{"      no_save_optim: true\n", "no_save_optim"},
                        Case{"      attention_dropout: 0.1\n", "attention_dropout"}}) {
    auto f = d.write("bad.yaml", experiment(c.line));
    const std::string e = error_of([&] { load_experiment(f); });
    EXPECT_NE(e.find(std::string("'") + c.key + "' is not supported"), std::string::npos) << e;
    EXPECT_NE(e.find("bad.yaml:"), std::string::npos) << "names the file and line: " << e;
  }
  // And on the command line.
  const std::string e = error_of([&] { load_experiment(ok, {{"apply-layernorm-1p", "true"}}); });
  EXPECT_NE(e.find("'apply_layernorm_1p' is not supported"), std::string::npos) << e;
}

TEST(MegatronKeys, TyposSuggestTheNearestKeyOfAnyTable) {
  TempDir d;
  auto f = d.write("t.yaml", experiment("      wandb_projet: x\n"));
  std::string e = error_of([&] { load_experiment(f); });
  EXPECT_NE(e.find("unknown key 'wandb_projet' (did you mean 'wandb_project'?)"), std::string::npos) << e;
  auto g = d.write("g.yaml", experiment(""));
  e = error_of([&] { load_experiment(g, {{"micro-bach-size", "2"}}); });
  EXPECT_NE(e.find("did you mean 'micro_batch_size'"), std::string::npos) << e;
}

TEST(MegatronKeys, NullMeansUnset) {
  TempDir d;
  auto f = d.write("n.yaml", experiment("      lr_decay_iters: null\n      save: null\n      load: ~\n"
                                        "      seed: null\n      max_position_embeddings: null\n"));
  auto cfg = load_experiment(f);
  EXPECT_EQ(cfg.train.lr_decay_iters, 4);  // unset: train_iters
  EXPECT_EQ(cfg.train.save, "");
  EXPECT_EQ(cfg.train.seed, 1234);
  EXPECT_EQ(cfg.model_spec.max_position_embeddings, load_model_spec("tiny").max_position_embeddings);
  // `--lr_decay_iters null` on the command line unsets too.
  auto g = d.write("g.yaml", experiment("      lr_decay_iters: 3\n"));
  EXPECT_EQ(load_experiment(g, {{"lr_decay_iters", "null"}}).train.lr_decay_iters, 4);
}

TEST(MegatronKeys, DashSpellingAndFlagsOnTheCommandLine) {
  TempDir d;
  auto f = d.write("c.yaml", experiment(""));
  auto cfg = load_experiment(f, {{"micro-batch-size", "4"},
                                 {"global-batch-size", "8"},
                                 {"use-distributed-optimizer", "true"},
                                 {"num-layers", "3"},
                                 {"wandb-project", "x"}});
  EXPECT_EQ(cfg.train.micro_batch_size, 4);
  EXPECT_EQ(cfg.train.global_batch_size, 8);
  EXPECT_TRUE(cfg.train.use_distributed_optimizer);
  EXPECT_EQ(cfg.model_spec.num_layers, 3);
  ASSERT_EQ(cfg.no_effect.size(), 1u);
  EXPECT_EQ(cfg.no_effect[0].key, "wandb_project");
}

TEST(MegatronKeys, MegatronDestNamesAreAliases) {
  TempDir d;
  auto f = d.write("a.yaml", experiment("      layernorm_epsilon: 1.0e-6\n"));
  EXPECT_DOUBLE_EQ(load_experiment(f).model_spec.norm_epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(
      load_experiment(d.write("b.yaml", experiment("")), {{"layernorm-epsilon", "3e-6"}}).model_spec.norm_epsilon,
      3e-6);
  // Megatron's config-dataclass name (TransformerConfig.num_moe_experts) of a model key.
  auto m = d.write("m.yaml", experiment("      num_moe_experts: 4\n"));
  EXPECT_EQ(load_experiment(m).model_spec.num_experts, 4);
}

TEST(MegatronKeys, FlagsAsZeroAndOne) {
  TempDir d;
  auto f = d.write("b.yaml", experiment("      use_distributed_optimizer: 1\n      overlap_grad_reduce: 0\n"
                                        "      recompute_method: uniform\n      use_torch_fsdp2: true\n"));
  auto cfg = load_experiment(f);
  EXPECT_TRUE(cfg.train.use_distributed_optimizer);
  EXPECT_FALSE(cfg.train.overlap_grad_reduce);
  EXPECT_TRUE(cfg.train.use_torch_fsdp2);  // a key of ours (plan/parallel_layout.h)
  EXPECT_EQ(cfg.no_effect.size(), 1u);     // recompute_method: a memory-saving choice, no effect on the result
  auto g = d.write("g.yaml", experiment("      use_distributed_optimizer: 2\n"));
  EXPECT_NE(error_of([&] { load_experiment(g); }).find("must be true or false, got '2'"), std::string::npos);
}

TEST(MegatronKeys, ModuleConfigGivesDefaultsThatOverridesBeat) {
  TempDir d;
  // configs/modules/pre_trainer.yaml: Primus's pre-trainer defaults (lr 2e-5, 40 warmup steps,
  // cosine decay, weight decay 0); the experiment's keys win.
  auto f = d.write("m.yaml", experiment("      seq_length: 32\n      lr: 1.0e-3\n", "pre_trainer.yaml"));
  auto cfg = load_experiment(f);
  EXPECT_DOUBLE_EQ(cfg.train.lr, 1e-3);
  EXPECT_EQ(cfg.train.train_iters, 4);
  EXPECT_EQ(cfg.train.lr_warmup_iters, 40);
  EXPECT_EQ(cfg.train.lr_decay_style, "cosine");
  EXPECT_DOUBLE_EQ(cfg.train.weight_decay, 0.0);
  EXPECT_EQ(cfg.train.global_batch_size, 16);
  EXPECT_NE(
      cfg.tree.origin("modules.pre_trainer.overrides.lr_warmup_iters").file.find("configs/modules/pre_trainer.yaml"),
      std::string::npos);
  // A module config beside the experiment is taken first.
  d.write("my_module.yaml", "lr_warmup_iters: 3\nwandb_project: p\n");
  auto g = d.write("g.yaml", experiment("", "my_module.yaml"));
  auto cg = load_experiment(g);
  EXPECT_EQ(cg.train.lr_warmup_iters, 3);
  EXPECT_EQ(cg.no_effect.size(), 1u);
  // An unknown one is an error naming it and the ones there are.
  auto h = d.write("h.yaml", experiment("", "pre_traner.yaml"));
  const std::string e = error_of([&] { load_experiment(h); });
  EXPECT_NE(e.find("module config 'pre_traner.yaml' not found"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'pre_trainer.yaml'"), std::string::npos) << e;
}

TEST(MegatronKeys, ArgumentTableInTheDocsMatchesTheCode) {
  // regenerate with `primus-cli direct -- train pretrain --config-reference`.
  std::ifstream in(std::string(PRIMUS_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in);
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  const std::string table = argument_status_reference();
  EXPECT_NE(doc.find(table), std::string::npos) << "docs/config.md's argument table is out of date";
  EXPECT_NE(table.find("| `micro_batch_size` | applied |"), std::string::npos);
  EXPECT_NE(table.find("| `wandb_project` | no effect |"), std::string::npos);
  EXPECT_NE(table.find("| `swiglu` | not supported | `true` |"), std::string::npos);
  // One row per name.
  std::set<std::string> seen;
  for (size_t i = table.find("\n| `"); i != std::string::npos; i = table.find("\n| `", i + 1)) {
    const std::string name = table.substr(i + 4, table.find('`', i + 4) - (i + 4));
    EXPECT_TRUE(seen.insert(name).second) << name << " has two rows";
  }
  EXPECT_GT(seen.size(), 1100u);
}

// The precision-aware optimizer's keys (docs/optim.md#low-precision-optimizer-state): Primus's
// settings and Transformer Engine's scaled states (fp16 and fp8 moments, the fp16 master) load as
// enums; Megatron's rules (a dtype other than fp32 needs use_precision_aware_optimizer; its choices:
// main_grads_dtype fp32 or bf16, main_params_dtype fp32 or fp16), an fp16 master or bf16 gradients
// in fp32 training are refused by name, with the file and line.
TEST(MegatronKeys, PrecisionAwareOptimizerKeys) {
  TempDir d;
  const std::string primus =
      "      bf16: true\n      use_precision_aware_optimizer: true\n      main_grads_dtype: bf16\n"
      "      exp_avg_dtype: bf16\n      exp_avg_sq_dtype: bf16\n";
  const ExperimentConfig c = load_experiment(d.write("ok.yaml", experiment(primus)));
  EXPECT_TRUE(c.train.use_precision_aware_optimizer);
  EXPECT_EQ(c.train.main_grads_dtype, OptimDtype::Bf16);
  EXPECT_EQ(c.train.main_params_dtype, OptimDtype::Fp32);
  EXPECT_EQ(c.train.exp_avg_dtype, OptimDtype::Bf16);
  EXPECT_EQ(c.train.exp_avg_sq_dtype, OptimDtype::Bf16);
  EXPECT_NE(c.resolved_yaml().find("exp_avg_sq_dtype: bf16"), std::string::npos);
  const ExperimentConfig te = load_experiment(
      d.write("te.yaml",
              experiment("      bf16: true\n      use_precision_aware_optimizer: true\n      main_params_dtype: fp16\n"
                         "      exp_avg_dtype: fp8\n      exp_avg_sq_dtype: fp16\n")));
  EXPECT_EQ(te.train.main_params_dtype, OptimDtype::Fp16);
  EXPECT_EQ(te.train.exp_avg_dtype, OptimDtype::Fp8);
  EXPECT_EQ(te.train.exp_avg_sq_dtype, OptimDtype::Fp16);
  struct Case {
    std::string lines, needle;
  };
  for (const Case& k :
       {Case{"      exp_avg_dtype: bf16\n", "exp_avg_dtype bf16 needs use_precision_aware_optimizer: true"},
        Case{"      exp_avg_sq_dtype: fp8\n", "exp_avg_sq_dtype fp8 needs use_precision_aware_optimizer: true"},
        Case{"      bf16: true\n      use_precision_aware_optimizer: true\n      main_grads_dtype: fp16\n",
             "main_grads_dtype fp16 is not one of Megatron's choices (fp32, bf16)"},
        Case{"      bf16: true\n      use_precision_aware_optimizer: true\n      main_grads_dtype: fp8\n",
             "main_grads_dtype fp8 is not one of Megatron's choices (fp32, bf16)"},
        Case{"      bf16: true\n      use_precision_aware_optimizer: true\n      main_params_dtype: fp8\n",
             "main_params_dtype fp8 is not one of Megatron's choices (fp32, fp16; bf16 is MaxText's)"},
        Case{"      use_precision_aware_optimizer: true\n      main_params_dtype: fp16\n",
             "main_params_dtype fp16 needs bf16: true"},
        Case{"      use_precision_aware_optimizer: true\n      main_grads_dtype: bf16\n",
             "main_grads_dtype bf16 needs bf16: true"},
        Case{"      exp_avg_dtype: float16\n", "exp_avg_dtype 'float16' is not one of: fp32, bf16, fp16, fp8"}}) {
    const std::string f = d.write("bad.yaml", experiment(k.lines));
    const std::string e = error_of([&] { load_experiment(f); });
    EXPECT_NE(e.find(k.needle), std::string::npos) << e;
    EXPECT_NE(e.find("bad.yaml:"), std::string::npos) << "names the file and line: " << e;
  }
}
