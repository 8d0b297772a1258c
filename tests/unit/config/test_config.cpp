#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "config/experiment.h"
#include "config/lora.h"
#include "core/error.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace primus;
using namespace primus::config;

namespace {

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("primus_cfg_") {}
};

const char* kBase = R"(work_group: team
user_name: me
exp_name: base_exp
workspace: /tmp/primus_ws
modules:
  pre_trainer:
    model: tiny
    overrides:
      micro_batch_size: 2
      global_batch_size: 8
      train_iters: 10
      lr: 1.0e-3
      mock_data: true
)";

using test::error_of;

}  // namespace

TEST(Config, ExtendsMergesKeyByKeyAndChildWins) {
  TempDir d;
  d.write("base.yaml", kBase);
  auto child = d.write("child.yaml", R"(extends: base.yaml
exp_name: child_exp
modules:
  pre_trainer:
    overrides:
      lr: 5.0e-4
      seq_length: 64
)");
  auto cfg = load_experiment(child);
  EXPECT_EQ(cfg.exp_name, "child_exp");
  EXPECT_EQ(cfg.work_group, "team");
  EXPECT_DOUBLE_EQ(cfg.train.lr, 5e-4);
  EXPECT_EQ(cfg.train.micro_batch_size, 2);  // inherited
  EXPECT_EQ(cfg.train.seq_length, 64);
  EXPECT_EQ(cfg.model_spec.hidden_size, 64);  // the tiny preset
  EXPECT_EQ(cfg.tree.origin("modules.pre_trainer.overrides.lr").file, child);
  EXPECT_EQ(cfg.tree.origin("modules.pre_trainer.overrides.lr").line, 6);
  EXPECT_EQ(cfg.tree.origin("work_group").file, (d.path / "base.yaml").string());
}

TEST(Config, EnvironmentSubstitution) {
  TempDir d;
  auto f = d.write("env.yaml", std::string(kBase) + "      seed: ${PRIMUS_TEST_SEED:77}\n");
  ::unsetenv("PRIMUS_TEST_SEED");
  EXPECT_EQ(load_experiment(f).train.seed, 77);
  ::setenv("PRIMUS_TEST_SEED", "91", 1);
  EXPECT_EQ(load_experiment(f).train.seed, 91);
  ::unsetenv("PRIMUS_TEST_SEED");
  auto g = d.write("noenv.yaml", std::string(kBase) + "      seed: ${PRIMUS_TEST_UNSET_VAR}\n");
  std::string e = error_of([&] { load_experiment(g); });
  EXPECT_NE(e.find("noenv.yaml:14"), std::string::npos) << e;
  EXPECT_NE(e.find("PRIMUS_TEST_UNSET_VAR"), std::string::npos) << e;
}

TEST(Config, CommandLineOverridesAnyKey) {
  TempDir d;
  auto f = d.write("c.yaml", kBase);
  auto cfg = load_experiment(f, {{"workspace", "/tmp/other"}, {"exp-name", "cli"}, {"lr", "0.01"},
                                 {"num_layers", "3"}, {"data_path", "[0.3, a, 0.7, b]"}});
  EXPECT_EQ(cfg.workspace, "/tmp/other");
  EXPECT_EQ(cfg.exp_name, "cli");
  EXPECT_DOUBLE_EQ(cfg.train.lr, 0.01);
  EXPECT_EQ(cfg.model_spec.num_layers, 3);
  EXPECT_EQ(cfg.train.data_path, (std::vector<std::string>{"0.3", "a", "0.7", "b"}));
  EXPECT_EQ(cfg.run_dir(), "/tmp/other/cli");
  // The resolved config shows the overrides and the model spec.
  const std::string y = cfg.resolved_yaml();
  EXPECT_NE(y.find("num_layers: 3"), std::string::npos) << y;
  EXPECT_NE(y.find("exp_name: cli"), std::string::npos) << y;
  std::string e = error_of([&] { load_experiment(f, {{"trian_iters", "3"}}); });
  EXPECT_NE(e.find("did you mean 'train_iters'"), std::string::npos) << e;
}

TEST(Config, UnknownKeyNamesFileLineAndSuggestion) {
  TempDir d;
  auto f = d.write("typo.yaml", std::string(kBase) + "      lr_warmup_iter: 5\n");
  std::string e = error_of([&] { load_experiment(f); });
  EXPECT_NE(e.find("typo.yaml:14"), std::string::npos) << e;
  EXPECT_NE(e.find("'lr_warmup_iter'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'lr_warmup_iters'"), std::string::npos) << e;
  auto top = d.write("top.yaml", std::string(kBase) + "workspce: x\n");
  e = error_of([&] { load_experiment(top); });
  EXPECT_NE(e.find("top.yaml:14"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'workspace'"), std::string::npos) << e;
}

TEST(Config, WrongTypesAreErrors) {
  TempDir d;
  auto f = d.write("type.yaml", std::string(kBase) + "      eval_iters: lots\n");
  std::string e = error_of([&] { load_experiment(f); });
  EXPECT_NE(e.find("type.yaml:14"), std::string::npos) << e;
  EXPECT_NE(e.find("'eval_iters' must be an integer"), std::string::npos) << e;
  auto g = d.write("type2.yaml", std::string(kBase) + "      overlap_grad_reduce: maybe\n");
  e = error_of([&] { load_experiment(g); });
  EXPECT_NE(e.find("must be true or false"), std::string::npos) << e;
}

// Keys with a few named values become enums when the config is read: an unknown name is an error
// naming the file, the key, the value and the choices; the resolved config writes the names back.
TEST(Config, ChoiceKeysBecomeEnumsAndPrintTheirNames) {
  TempDir d;
  auto f = d.write("c.yaml", std::string(kBase) + "      recompute_granularity: selective\n");
  auto cfg = load_experiment(f, {{"cp_comm_type", "a2a"}, {"data_parallel_sharding_strategy", "optim_grads"}});
  EXPECT_EQ(cfg.train.recompute_granularity, Recompute::Selective);
  EXPECT_EQ(cfg.train.cp_comm_type, CpComm::A2A);
  EXPECT_EQ(cfg.train.data_parallel_sharding_strategy, DpSharding::OptimGrads);
  std::string y = cfg.resolved_yaml();
  EXPECT_NE(y.find("recompute_granularity: selective"), std::string::npos) << y;
  EXPECT_NE(y.find("cp_comm_type: a2a"), std::string::npos) << y;
  EXPECT_NE(y.find("data_parallel_sharding_strategy: optim_grads\n"), std::string::npos) << y;
  // Unset keys keep their defaults and print as before: "" for recompute and the sharding strategy.
  cfg = load_experiment(f, {{"recompute_granularity", "null"}});
  EXPECT_EQ(cfg.train.recompute_granularity, Recompute::None);
  EXPECT_EQ(cfg.train.data_parallel_sharding_strategy, DpSharding::Unset);
  y = cfg.resolved_yaml();
  EXPECT_NE(y.find("recompute_granularity: \"\""), std::string::npos) << y;
  EXPECT_NE(y.find("data_parallel_sharding_strategy: \"\""), std::string::npos) << y;
  EXPECT_NE(y.find("cp_comm_type: p2p"), std::string::npos) << y;
  auto bad = d.write("bad.yaml", std::string(kBase) + "      recompute_granularity: partial\n");
  std::string e = error_of([&] { load_experiment(bad); });
  EXPECT_NE(e.find("bad.yaml:14"), std::string::npos) << e;
  EXPECT_NE(e.find("recompute_granularity 'partial' is not one of: full, selective (or leave it unset)"),
            std::string::npos)
      << e;
  e = error_of([&] { load_experiment(f, {{"cp_comm_type", "ring"}}); });
  EXPECT_NE(e.find("cp_comm_type 'ring' is not one of: p2p, a2a"), std::string::npos) << e;
  e = error_of([&] { load_experiment(f, {{"data_parallel_sharding_strategy", "zero3"}}); });
  EXPECT_NE(e.find("data_parallel_sharding_strategy 'zero3' is not one of: no_shard, optim, optim_grads, "
                   "optim_grads_params"),
            std::string::npos)
      << e;
  e = error_of([&] { load_experiment(f, {{"cp_comm_type", "[p2p]"}}); });
  EXPECT_NE(e.find("cp_comm_type 'a list' is not one of"), std::string::npos) << e;
}

TEST(Config, LayoutErrorsBeforeTraining) {
  TempDir d;
  auto f = d.write("c.yaml", kBase);
  std::string e = error_of([&] { load_experiment(f, {{"global_batch_size", "7"}}); });
  EXPECT_NE(e.find("global_batch_size 7 is not a multiple of micro_batch_size 2"), std::string::npos) << e;
  e = error_of([&] { load_experiment(f, {{"seq_length", "4096"}}); });
  EXPECT_NE(e.find("exceeds max_position_embeddings 128"), std::string::npos) << e;
  e = error_of([&] { load_experiment(f, {{"mock_data", "false"}}); });
  EXPECT_NE(e.find("data_path is empty"), std::string::npos) << e;
  e = error_of([&] { load_experiment(f, {{"num_query_groups", "3"}}); });
  EXPECT_NE(e.find("num_query_groups"), std::string::npos) << e;
  e = error_of([&] { load_experiment((d.path / "missing.yaml").string()); });
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
  auto bad = d.write("bad.yaml", "modules: [unclosed\n");
  e = error_of([&] { load_experiment(bad); });
  EXPECT_NE(e.find("YAML syntax error"), std::string::npos) << e;
  auto cyc = d.write("cyc.yaml", "extends: cyc.yaml\n");
  e = error_of([&] { load_experiment(cyc); });
  EXPECT_NE(e.find("cycle"), std::string::npos) << e;
}

// Megatron's virtual pipeline keys onto virtual_pipeline_model_parallel_size (tiny: 2 layers).
TEST(Config, VirtualPipelineKeysFollowMegatronsRule) {
  TempDir d;
  auto f = d.write("c.yaml", kBase);
  using Overrides = std::vector<std::pair<std::string, std::string>>;
  // The chunks per rank (1f1b with more than one runs interleaved-1f1b: plan/parallel_layout.cpp,
  // PipelineLayout.PlanTakesTheLayoutsStagesAndVpp).
  ExperimentConfig c = load_experiment(f, Overrides{{"num_virtual_stages_per_pipeline_rank", "2"}});
  EXPECT_EQ(c.train.virtual_pipeline_model_parallel_size, 2);
  c = load_experiment(f, Overrides{{"num_virtual_stages_per_pipeline_rank", "2"}, {"pipeline_schedule", "zbv"}});
  EXPECT_EQ(c.train.pipeline_schedule, "zbv");
  c = load_experiment(f, Overrides{{"num_virtual_stages_per_pipeline_rank", "1"}});
  EXPECT_EQ(c.train.virtual_pipeline_model_parallel_size, 1);
  c = load_experiment(f, Overrides{{"num_virtual_stages_per_pipeline_rank", "null"}});
  EXPECT_EQ(c.train.virtual_pipeline_model_parallel_size, 0);
  // Layers per chunk: (num_layers / pp) / it.
  c = load_experiment(f, Overrides{{"num_layers_per_virtual_pipeline_stage", "1"},
                                   {"num_layers", "8"},
                                   {"pipeline_model_parallel_size", "2"}});
  EXPECT_EQ(c.train.virtual_pipeline_model_parallel_size, 4);
  // Agreeing with virtual_pipeline_model_parallel_size is fine (the resolved config writes both).
  c = load_experiment(f, Overrides{{"num_virtual_stages_per_pipeline_rank", "2"},
                                   {"virtual_pipeline_model_parallel_size", "2"}});
  EXPECT_EQ(c.train.virtual_pipeline_model_parallel_size, 2);
  EXPECT_NE(c.resolved_yaml().find("virtual_pipeline_model_parallel_size: 2"), std::string::npos);
  // Refused by name.
  std::string e = error_of([&] {
    load_experiment(f, Overrides{{"num_virtual_stages_per_pipeline_rank", "2"},
                                 {"pipeline_model_parallel_layout", "Et|tL"}});
  });
  EXPECT_NE(e.find("pipeline_model_parallel_layout sets the stages and with them the chunks per rank; unset "
                   "num_virtual_stages_per_pipeline_rank"),
            std::string::npos)
      << e;
  e = error_of([&] {
    load_experiment(f, Overrides{{"num_virtual_stages_per_pipeline_rank", "2"},
                                 {"num_layers_per_virtual_pipeline_stage", "1"}});
  });
  EXPECT_NE(e.find("set one of num_virtual_stages_per_pipeline_rank (2) and num_layers_per_virtual_pipeline_stage (1)"),
            std::string::npos)
      << e;
  e = error_of([&] {
    load_experiment(f, Overrides{{"num_virtual_stages_per_pipeline_rank", "2"},
                                 {"virtual_pipeline_model_parallel_size", "3"}});
  });
  EXPECT_NE(e.find("num_virtual_stages_per_pipeline_rank gives 2 model chunks per pipeline rank, "
                   "virtual_pipeline_model_parallel_size says 3"),
            std::string::npos)
      << e;
  e = error_of([&] {
    load_experiment(f, Overrides{{"num_layers_per_virtual_pipeline_stage", "3"},
                                 {"num_layers", "8"},
                                 {"pipeline_model_parallel_size", "2"}});
  });
  EXPECT_NE(e.find("the 4 layers per pipeline stage (num_layers 8 / pipeline_model_parallel_size 2) are not divisible "
                   "by num_layers_per_virtual_pipeline_stage 3"),
            std::string::npos)
      << e;
  e = error_of([&] {
    load_experiment(f, Overrides{{"num_layers_per_virtual_pipeline_stage", "1"},
                                 {"num_layers", "7"},
                                 {"pipeline_model_parallel_size", "2"}});
  });
  EXPECT_NE(e.find("needs num_layers (7) divisible by pipeline_model_parallel_size (2)"), std::string::npos) << e;
  e = error_of([&] {
    load_experiment(f, Overrides{{"num_layers_per_virtual_pipeline_stage", "1"},
                                 {"num_layers", "8"},
                                 {"pipeline_model_parallel_size", "2"},
                                 {"decoder_first_pipeline_num_layers", "3"}});
  });
  EXPECT_NE(e.find("with an uneven first or last stage"), std::string::npos) << e;
  e = error_of([&] { load_experiment(f, Overrides{{"num_virtual_stages_per_pipeline_rank", "-2"}}); });
  EXPECT_NE(e.find("num_virtual_stages_per_pipeline_rank must be positive"), std::string::npos) << e;
}

TEST(Config, ReferenceDocMatchesTheCode) {
  // docs/config.md carries the table generated from training_keys(); regenerate it with
  // `primus-cli direct -- train pretrain --config-reference` when keys change.
  std::ifstream in(std::string(PRIMUS_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md is missing";
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(doc.find(training_keys_reference()), std::string::npos)
      << "docs/config.md is out of date; paste in:\n" << training_keys_reference();
  EXPECT_NE(doc.find(lora_keys_reference()), std::string::npos)
      << "docs/config.md's lora table is out of date; paste in:\n" << lora_keys_reference();
}

// The lora block: names become enums here, the rest refused by name with the place it was written.
TEST(Config, LoraBlock) {
  TempDir d;
  const std::string f = d.write("lora.yaml", R"(
modules:
  pre_trainer:
    model: tiny
    overrides:
      train_iters: 1
      mock_data: true
      lora:
        enabled: true
        dim: 8
        alpha: 16
        lora_A_init_method: kaiming
        target_modules: [linear_proj, linear_fc2]
)");
  const ExperimentConfig cfg = load_experiment(f);
  const LoraOptions& l = cfg.train.lora;
  EXPECT_TRUE(l.enabled);
  EXPECT_EQ(l.dim, 8);
  EXPECT_EQ(l.scale(), 2.0);
  EXPECT_EQ(l.a_init, LoraInit::Kaiming);
  EXPECT_EQ(l.b_init, LoraInit::Zero);
  EXPECT_FALSE(l.applies_to(LoraTarget::LinearQkv));
  EXPECT_TRUE(l.applies_to(LoraTarget::LinearFc2));
  EXPECT_EQ(load_experiment(f, {{"lora.dim", "4"}}).train.lora.dim, 4);
  // Written back as read (config.yaml).
  EXPECT_NE(cfg.resolved_yaml().find("target_modules:\n          - linear_proj\n          - linear_fc2"), std::string::npos)
      << cfg.resolved_yaml();
  auto error = [&](std::vector<std::pair<std::string, std::string>> o) {
    return error_of([&] { load_experiment(f, o); });
  };
  EXPECT_NE(error({{"lora.lora_B_init_method", "ones"}}).find("lora.lora_B_init_method 'ones' is not one of: xavier, "
                                                              "normal, kaiming, zero"),
            std::string::npos);
  EXPECT_NE(error({{"lora.rank", "4"}}).find("unknown key 'lora.rank'"), std::string::npos);
  EXPECT_NE(error({{"lora.dim", "0"}}).find("lora.dim must be positive"), std::string::npos);
  EXPECT_NE(error({{"lora.dropout", "1.0"}}).find("lora.dropout must be in [0, 1)"), std::string::npos);
  EXPECT_NE(error({{"lora.dropout", "-0.1"}}).find("lora.dropout must be in [0, 1)"), std::string::npos);
  const LoraOptions dropped =
      load_experiment(f, {{"lora.dropout", "0.05"}, {"lora.dropout_position", "post"}}).train.lora;
  EXPECT_EQ(dropped.dropout, 0.05);
  EXPECT_EQ(dropped.dropout_position, LoraDropoutPosition::Post);
  EXPECT_NE(error({{"lora.target_modules", "[\"*.layers.0.*.linear_qkv\"]"}}).find("wildcard"), std::string::npos);
  EXPECT_TRUE(load_experiment(f, {{"fp8", "hybrid"}}).train.lora.enabled);  // the base's GEMMs in FP8 (test_lora)
  EXPECT_NE(error({{"lora.dim", "0"}}).find("lora.yaml"), std::string::npos);  // where it was written
}

// Issue 21: a key given twice in one map was taken silently (the last one, or the first, by
// yaml-cpp's whim); now it is an error naming both lines.
TEST(Config, DuplicateKeysAreAnErrorNamingBothLines) {
  const auto dir = std::filesystem::temp_directory_path() / ("primus_dup_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "dup.yaml";
  std::ofstream(file) << "exp_name: a\nmodules:\n  pre_trainer:\n    model: tiny\n    overrides:\n      lr: 1.0e-3\n"
                         "      train_iters: 5\n      lr: 2.0e-3\n";
  try {
    primus::config::load_experiment(file.string());
    ADD_FAILURE() << "no error";
  } catch (const primus::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("dup.yaml:8"), std::string::npos) << m;
    EXPECT_NE(m.find("duplicate key 'lr'"), std::string::npos) << m;
    EXPECT_NE(m.find("line 6"), std::string::npos) << m;
  }
  std::ofstream(file) << "exp_name: a\nexp_name: b\n";
  EXPECT_THROW(primus::config::load_yaml_tree(file.string()), primus::Error);
  std::ofstream(file) << "? [a, b]\n: 1\n";
  EXPECT_THROW(primus::config::load_yaml_tree(file.string()), primus::Error);
  std::filesystem::remove_all(dir);
}

// Issue 32: `--q_lora_rank null` was ignored (the model kept the preset's 96) and the saved config
// listed both values. null is "none" for every nullable model key, in a file and on the command
// line; the resolved config holds one value per key (model keys in model_spec only, an alias once).
TEST(Config, NullSetsANullableModelKeyAndTheResolvedConfigHasOneValuePerKey) {
  TempDir d;
  std::string text = kBase;
  text.replace(text.find("model: tiny"), 11, "model: tiny_moe");
  const std::string f = d.write("moe.yaml", text + "      moe_shared_expert_intermediate_size: null\n");
  const ExperimentConfig preset = load_experiment(f);
  ASSERT_EQ(preset.model_spec.q_lora_rank, 96);  // tiny_moe's
  const ExperimentConfig cfg =
      load_experiment(f, {{"q_lora_rank", "null"}, {"num_experts", "~"}, {"layernorm_epsilon", "1e-4"}});
  EXPECT_EQ(cfg.model_spec.q_lora_rank, 0);
  EXPECT_EQ(cfg.model_spec.num_experts, 0);
  EXPECT_EQ(cfg.model_spec.moe_shared_expert_intermediate_size, 0);  // from the file
  EXPECT_DOUBLE_EQ(cfg.model_spec.norm_epsilon, 1e-4);
  // A key that is not nullable keeps the preset's value under null.
  EXPECT_EQ(load_experiment(f, {{"hidden_size", "null"}}).model_spec.hidden_size, preset.model_spec.hidden_size);
  const std::string y = cfg.resolved_yaml();
  auto count = [&](const std::string& key) {
    size_t n = 0;
    for (size_t at = y.find(" " + key + ":"); at != std::string::npos; at = y.find(" " + key + ":", at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("q_lora_rank"), 1u) << y;
  EXPECT_NE(y.find("q_lora_rank: 0"), std::string::npos) << y;
  EXPECT_EQ(count("num_experts"), 1u) << y;
  EXPECT_EQ(count("norm_epsilon"), 1u) << y;
  EXPECT_EQ(count("layernorm_epsilon"), 0u) << y;
  EXPECT_EQ(count("lr"), 1u) << y;
}

// A null in the module config's defaults sets nothing: it must not turn the preset's q_lora_rank
// to "none" as an explicit override does.
TEST(Config, NullModuleDefaultsLeaveThePresetAlone) {
  TempDir d;
  d.write("pre_trainer.yaml", "q_lora_rank: null\nlr: 5.0e-4\n");
  std::string text = kBase;
  text.replace(text.find("model: tiny"), 11, "config: pre_trainer.yaml\n    model: tiny_moe");
  text.replace(text.find("      lr: 1.0e-3\n"), 17, "");
  const ExperimentConfig cfg = load_experiment(d.write("exp.yaml", text));
  EXPECT_EQ(cfg.model_spec.q_lora_rank, 96);
  EXPECT_DOUBLE_EQ(cfg.train.lr, 5e-4);
}

// Issue 32: a config of a few aliases to aliases stands for billions of values (the loader hung);
// nesting is bounded too. Both are errors naming the file.
TEST(Config, AliasBombsAndDeepNestingAreRefused) {
  TempDir d;
  std::string bomb = std::string(kBase) + "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 10; ++i) {
    bomb += fmt::format("a{}: &a{} [", i, i);
    for (int k = 0; k < 10; ++k) bomb += fmt::format("{}*a{}", k ? ", " : "", i - 1);
    bomb += "]\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { load_experiment(d.write("bomb.yaml", bomb)); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_NE(e.find("bomb.yaml: the config holds more than 100000 values"), std::string::npos) << e;
  std::string deep = kBase;
  for (int i = 0; i < 100; ++i) deep += std::string(size_t(2 * i), ' ') + fmt::format("k{}:\n", i);
  deep += std::string(200, ' ') + "v: 1\n";
  e = error_of([&] { load_experiment(d.write("deep.yaml", deep)); });
  EXPECT_NE(e.find("deep.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("nest more than 64 levels deep"), std::string::npos) << e;
}
