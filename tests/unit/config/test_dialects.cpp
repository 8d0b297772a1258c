// Issue 39: Primus's torchtitan and MaxText experiment configs, in those frameworks' own key names,
// translated into this engine's keys (config/dialect.h): the tables, the translation of the
// layout, batch and learning-rate schedule against each framework's own formula, the keys refused
// by name, the command line in both dialects, and --print-config's side-by-side view.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numbers>
#include <optional>
#include <set>

#include "config/dialect.h"
#include "config/experiment.h"
#include "core/error.h"
#include "model/model_spec.h"
#include "optim/lr_schedule.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

using namespace primus;
using namespace primus::config;
using test::error_of;

namespace {

struct TempDir : test::TempDir {
  TempDir() : test::TempDir("primus_dialect_") {}
};

// A torchtitan experiment without Primus's module config: torchtitan's defaults under `extra`.
std::string torchtitan(const std::string& extra, const std::string& model = "llama3.1_8B.yaml") {
  return "exp_name: tt\nworkspace: /tmp/primus_dialect_ws\nmodules:\n  pre_trainer:\n    framework: torchtitan\n"
         "    model: " +
         model + "\n    overrides:\n      training:\n        mock_data: true\n" + extra;
}

std::string maxtext(const std::string& extra, const std::string& model = "llama3_8B.yaml") {
  return "exp_name: mt\nworkspace: /tmp/primus_dialect_ws\nmodules:\n  pre_trainer:\n    framework: maxtext\n"
         "    model: " +
         model + "\n    overrides:\n      dataset_type: synthetic\n" + extra;
}

LRSchedule schedule_of(const TrainingArgs& a) {
  LRScheduleOptions o;
  o.lr = a.lr;
  o.min_lr = a.min_lr;
  o.lr_warmup_init = a.lr_warmup_init;
  o.lr_warmup_iters = a.lr_warmup_iters;
  o.lr_decay_iters = a.lr_decay_iters;
  o.lr_decay_style = a.lr_decay_style;
  o.lr_wsd_decay_style = a.lr_wsd_decay_style;
  o.lr_wsd_decay_iters = a.lr_wsd_decay_iters;
  return LRSchedule(o);
}

// torchtitan's warmup-stable-decay schedule (components/lr_scheduler.py at 73a0e697), restated from
// its documented behaviour: the learning rate of step s (from 0).
double torchtitan_lr(double lr, int64_t s, int64_t total, int64_t warmup, std::optional<double> ratio,
                     const std::string& type, double min_factor) {
  warmup = std::min(warmup, total);
  int64_t decay = ratio ? int64_t(std::nearbyint(double(total) * *ratio)) : total - warmup;
  decay = std::min(decay, total - warmup);
  const int64_t stable = total + 1 - warmup - decay;
  if (s < warmup) return lr * double(s + 1) / double(warmup);
  if (s < warmup + stable) return lr;
  const double p = double(s + 1 - warmup - stable) / double(decay);
  double f = type == "linear" ? 1 - p : type == "sqrt" ? 1 - std::sqrt(p) : 0.5 * (1 + std::cos(std::numbers::pi * p));
  return lr * (min_factor + (1 - min_factor) * f);
}

// MaxText's schedule (create_learning_rate_schedule in src/maxtext/utils/maxtext_utils.py),
// restated: the learning rate of step s < S.
double maxtext_lr(double lr, int64_t s, int64_t S, double warmup_fraction, double final_fraction,
                  const std::string& type, double wsd_fraction, const std::string& wsd_style) {
  const int64_t warmup = int64_t(double(S) * warmup_fraction);
  const double final_lr = lr * final_fraction;
  auto cos = [&](int64_t k, int64_t len) {
    const double pct = len > 1 ? double(k) / double(len - 1) : 1.0;
    const double a = 0.5 * (std::cos(std::numbers::pi * pct) + 1);
    return lr * a + final_lr * (1 - a);
  };
  if (s < warmup) return lr * double(s) / double(warmup);
  if (type == "cosine") return cos(s - warmup, S - warmup);
  const int64_t decay = int64_t(double(S) * wsd_fraction), stable = S - warmup - decay;
  if (s < warmup + stable) return lr;
  const int64_t k = s - warmup - stable;
  if (wsd_style == "linear") return lr + (final_lr - lr) * double(std::min(k, decay - 1)) / double(decay - 1);
  return cos(k, decay);
}

}  // namespace

TEST(Dialects, TablesAreSortedUniqueAndComplete) {
  for (Framework f : {Framework::TorchTitan, Framework::MaxText}) {
    const auto& keys = dialect_of(f).keys();
    ASSERT_GT(keys.size(), f == Framework::TorchTitan ? 165u : 690u);  // every JobConfig / base.yml key
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i > 0) EXPECT_LT(std::string(keys[i - 1].name), std::string(keys[i].name)) << "sorted, unique";
      EXPECT_NE(std::string(keys[i].note), "") << keys[i].name;
    }
  }
  // Keys Primus's own files write are in the tables.
  for (const char* k :
       {"primus_turbo.enable_primus_turbo", "training.mock_data", "sink_level", "quantize.linear.float8.filter_fqns",
        "compile.enable", "activation_checkpoint.selective_ac_option"})
    EXPECT_NE(find_dialect_key(dialect_of(Framework::TorchTitan), k), nullptr) << k;
  for (const char* k : {"base_config", "trainable", "hf_access_token", "megablox", "ici_tensor_sequence_parallelism",
                        "moe_dispatch_no_expert_sharding", "pure_nnx_decoder", "sharding_tolerance"})
    EXPECT_NE(find_dialect_key(dialect_of(Framework::MaxText), k), nullptr) << k;
  EXPECT_EQ(parse_framework("primus", Origin{}), Framework::Megatron);
  const std::string e = error_of([] { parse_framework("torchtitn", Origin{"x.yaml", 3}); });
  EXPECT_NE(e.find("x.yaml:3: framework 'torchtitn' is not supported (did you mean 'torchtitan'?)"), std::string::npos)
      << e;
}

// A written key that the table applies must reach the translation (translate_dialect checks it):
// a config writing every applied key, at the framework's default, loads.
TEST(Dialects, EveryAppliedKeyIsRead) {
  TempDir d;
  for (Framework f : {Framework::TorchTitan, Framework::MaxText}) {
    YAML::Node ov(YAML::NodeType::Map);
    for (const auto& k : dialect_of(f).keys()) {
      if (k.status != KeyStatus::Applied) continue;
      YAML::Node cur = ov;
      std::string name = k.name;
      for (size_t dot; (dot = name.find('.')) != std::string::npos; name = name.substr(dot + 1)) {
        const std::string head = name.substr(0, dot);
        if (!cur[head]) cur[head] = YAML::Node(YAML::NodeType::Map);
        YAML::Node next = cur[head];
        cur.reset(next);
      }
      cur[name] = YAML::Load(k.value);
    }
    if (f == Framework::TorchTitan) {  // the defaults that are refused here (debugmodel, a Hugging Face dataset)
      ov["model"]["flavor"] = "8B";
      ov["training"]["mock_data"] = true;
    } else {
      ov["model_name"] = "llama3-8b";
      ov["dataset_type"] = "synthetic";
      ov["cosine_learning_rate_final_fraction"] = YAML::Node();
    }
    YAML::Node root;
    root["exp_name"] = "every";
    root["modules"]["pre_trainer"]["framework"] = to_string(f);
    root["modules"]["pre_trainer"]["model"] = f == Framework::TorchTitan ? "llama3.1_8B.yaml" : "llama3_8B.yaml";
    root["modules"]["pre_trainer"]["overrides"] = ov;
    YAML::Emitter e;
    e << root;
    const std::string file = d.write(std::string(to_string(f)) + ".yaml", e.c_str());
    EXPECT_EQ(error_of([&] { load_experiment(file); }), "(no error)") << to_string(f);
  }
}

TEST(Dialects, TorchTitanLayoutAndBatch) {
  TempDir d;
  auto f = d.write("e.yaml", torchtitan("        local_batch_size: 3\n        seq_len: 128\n        steps: 20\n"));
  // Four ranks: data_parallel_shard_degree -1 takes them all, FSDP; the global batch is local x dp.
  ExperimentConfig c = load_experiment(f, {}, 4);
  EXPECT_EQ(c.model, "llama3.1_8B");
  EXPECT_EQ(c.train.data_parallel_sharding_strategy, DpSharding::OptimGradsParams);
  EXPECT_EQ(c.train.micro_batch_size, 3);
  EXPECT_EQ(c.train.global_batch_size, 12);
  EXPECT_EQ(c.train.seq_length, 128);
  EXPECT_EQ(c.train.train_iters, 20);
  EXPECT_TRUE(c.train.bf16);  // mixed_precision_param: bfloat16
  EXPECT_TRUE(c.train.decay_norms_and_biases);
  EXPECT_DOUBLE_EQ(c.train.adam_beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 0.1);
  EXPECT_EQ(c.train.eval_interval, 0);
  EXPECT_TRUE(c.train.torch_fsdp2_reshard_after_forward);  // fsdp_reshard_after_forward: default
  EXPECT_FALSE(load_experiment(f, {{"parallelism.fsdp_reshard_after_forward", "never"}}, 4)
                   .train.torch_fsdp2_reshard_after_forward);
  EXPECT_TRUE(load_experiment(f, {{"parallelism.fsdp_reshard_after_forward", "always"}}, 4)
                  .train.torch_fsdp2_reshard_after_forward);
  EXPECT_NE(error_of([&] { load_experiment(f, {{"parallelism.fsdp_reshard_after_forward", "sometimes"}}, 4); })
                .find("'sometimes' is not one of default, always, never"),
            std::string::npos);
  // tp 2 x pp 2 with pipeline microbatches of 1: the rest is data parallel.
  c = load_experiment(f,
                      {{"parallelism.tensor_parallel_degree", "2"},
                       {"parallelism.pipeline_parallel_degree", "2"},
                       {"parallelism.pipeline_parallel_schedule", "Interleaved1F1B"},
                       {"training.global_batch_size", "12"}},
                      8);
  EXPECT_EQ(c.train.tensor_model_parallel_size, 2);
  EXPECT_TRUE(c.train.sequence_parallel);
  EXPECT_EQ(c.train.pipeline_model_parallel_size, 2);
  EXPECT_EQ(c.train.pipeline_schedule, "interleaved-1f1b");
  EXPECT_EQ(c.train.micro_batch_size, 1);
  EXPECT_EQ(c.train.global_batch_size, 12);
  // Explicit degrees must fill the launch.
  std::string e = error_of([&] { load_experiment(f, {{"parallelism.data_parallel_shard_degree", "4"}}, 2); });
  EXPECT_NE(e.find("'parallelism.data_parallel_shard_degree: 4' is not supported: the degrees ask for 4 ranks"),
            std::string::npos)
      << e;
}

TEST(Dialects, MaxTextLayoutAndBatch) {
  TempDir d;
  auto f = d.write("e.yaml",
                   maxtext("      per_device_batch_size: 2\n      max_target_length: 256\n      steps: 10\n"));
  // ici_fsdp_parallelism -1 (base.yml) takes the four ranks; dcn_data_parallelism -1 is one slice.
  ExperimentConfig c = load_experiment(f, {}, 4);
  EXPECT_EQ(c.model, "llama3_8B");
  EXPECT_FALSE(c.model_spec.use_rope_scaling);
  EXPECT_EQ(c.train.data_parallel_sharding_strategy, DpSharding::OptimGradsParams);
  EXPECT_EQ(c.train.micro_batch_size, 2);
  EXPECT_EQ(c.train.global_batch_size, 8);
  EXPECT_EQ(c.train.recompute_granularity, Recompute::Full);  // remat_policy: full
  EXPECT_EQ(c.train.seed, 0);                                 // init_weights_seed
  // Tensor parallelism: each data-parallel rank takes per_device_batch_size x tp sequences.
  c = load_experiment(f, {{"ici_tensor_parallelism", "2"}, {"gradient_accumulation_steps", "3"}}, 4);
  EXPECT_EQ(c.train.tensor_model_parallel_size, 2);
  EXPECT_EQ(c.train.micro_batch_size, 4);
  EXPECT_EQ(c.train.global_batch_size, 24);
  // A fractional per-device batch, as MaxText allows: 0.5 x 4 devices = 2 sequences.
  c = load_experiment(f,
                      {{"per_device_batch_size", "0.5"},
                       {"ici_fsdp_parallelism", "1"},
                       {"ici_data_parallelism", "2"},
                       {"ici_tensor_parallelism", "2"}},
                      4);
  EXPECT_EQ(c.train.data_parallel_sharding_strategy, DpSharding::NoShard);
  EXPECT_EQ(c.train.micro_batch_size, 1);
  EXPECT_EQ(c.train.global_batch_size, 2);
  // Llama 3.1 names get MaxText's rotary scaling; model keys in MaxText's names override the shapes.
  c = load_experiment(f, {{"model_name", "llama3.1-8b"}, {"base_num_decoder_layers", "2"}, {"head_dim", "64"}}, 1);
  EXPECT_EQ(c.model, "llama3.1_8B");
  EXPECT_TRUE(c.model_spec.use_rope_scaling);
  EXPECT_EQ(c.model_spec.num_layers, 2);
  EXPECT_EQ(c.model_spec.kv_channels, 64);
  c = load_experiment(f, {{"model_name", "llama3.3-70b"}}, 1);  // MaxText scales llama3.1* names only
  EXPECT_EQ(c.model, "llama3.3_70B");
  EXPECT_FALSE(c.model_spec.use_rope_scaling);
}

// torchtitan's schedule on this engine gives torchtitan's learning rate at every step.
TEST(Dialects, TorchTitanScheduleMatchesTorchTitan) {
  TempDir d;
  struct Case {
    int64_t steps, warmup;
    std::optional<double> ratio;
    const char* type;
    double min_factor;
    std::optional<int64_t> total;
  };
  const Case cases[] = {{20, 5, std::nullopt, "linear", 0.0, {}},
                        {20, 5, 0.5, "cosine", 0.1, {}},
                        {20, 0, 0.3, "sqrt", 0.2, {}},
                        {20, 1, 0.25, "linear", 0.0, {}},
                        {20, 30, std::nullopt, "cosine", 0.0, {}},
                        {20, 4, 0.0, "linear", 0.0, {}},
                        {20, 3, 0.5, "cosine", 0.1, int64_t(30)},
                        {7, 2, 0.45, "cosine", 0.0, {}}};
  for (const Case& k : cases) {
    std::string extra = fmt::format(
        "        steps: {}\n      optimizer:\n        lr: 0.003\n      lr_scheduler:\n        warmup_steps: {}\n"
        "        decay_type: {}\n        min_lr_factor: {}\n",
        k.steps, k.warmup, k.type, k.min_factor);
    if (k.ratio) extra += fmt::format("        decay_ratio: {}\n", *k.ratio);
    if (k.total) extra += fmt::format("        total_steps: {}\n", *k.total);
    const ExperimentConfig c = load_experiment(d.write("s.yaml", torchtitan("        seq_len: 64\n" + extra)));
    const LRSchedule s = schedule_of(c.train);
    for (int64_t step = 0; step < k.steps; ++step) {
      const double want = torchtitan_lr(0.003, step, k.total.value_or(k.steps), k.warmup, k.ratio, k.type,
                                        k.min_factor);
      EXPECT_NEAR(s.lr_at(step), want, 1e-15)
          << "warmup " << k.warmup << " ratio " << k.ratio.value_or(-1) << " " << k.type << " step " << step;
    }
  }
}

TEST(Dialects, MaxTextScheduleMatchesMaxText) {
  TempDir d;
  struct Case {
    int64_t steps;
    double warmup_fraction, final_fraction;
    const char* type;
    double wsd_fraction;
    const char* wsd_style;
  };
  const Case cases[] = {{20, 0.1, 0.1, "cosine", 0.1, "linear"},
                        {20, 0.0, 0.0, "cosine", 0.1, "linear"},
                        {30, 0.2, 0.05, "wsd", 0.2, "linear"},
                        {30, 0.1, 0.1, "wsd", 0.3, "cosine"},
                        {9, 0.35, 1.0, "cosine", 0.1, "linear"}};
  for (const Case& k : cases) {
    const std::string extra = fmt::format(
        "      steps: {}\n      learning_rate: 0.002\n      warmup_steps_fraction: {}\n"
        "      learning_rate_final_fraction: {}\n      lr_schedule_type: {}\n      wsd_decay_steps_fraction: {}\n"
        "      wsd_decay_style: {}\n      max_target_length: 64\n      per_device_batch_size: 1\n",
        k.steps, k.warmup_fraction, k.final_fraction, k.type, k.wsd_fraction, k.wsd_style);
    const ExperimentConfig c = load_experiment(d.write("s.yaml", maxtext(extra)));
    const LRSchedule s = schedule_of(c.train);
    for (int64_t step = 0; step < k.steps; ++step)
      EXPECT_NEAR(s.lr_at(step),
                  maxtext_lr(0.002, step, k.steps, k.warmup_fraction, k.final_fraction, k.type, k.wsd_fraction,
                             k.wsd_style),
                  1e-15)
          << k.type << " " << k.wsd_style << " step " << step;
  }
}

// Keys that change the result and are not built are refused by name, with why, in each dialect.
TEST(Dialects, UnbuiltKeysAreRefusedByName) {
  TempDir d;
  struct Case {
    Framework f;
    std::string overrides;  // YAML under `overrides:`, indented by 6
    std::string want;
    int world = 1;
    std::vector<std::pair<std::string, std::string>> cli = {};
  };
  const std::vector<Case> cases = {
      {Framework::TorchTitan,
       "",
       "'training.dtype' is not supported: full bf16 training",
       1,
       {{"training.dtype", "bfloat16"}}},
      {Framework::TorchTitan,
       "      model:\n        converters: [float8]\n      float8:\n        filter_fqns: [output, layers.0]\n",
       "leaving 'layers.0' out of FP8 is not built"},
      {Framework::TorchTitan, "      model:\n        converters: [quantize.linear.mx]\n",
       "'mxfp8_cublas' is not built: this engine's MXFP8 rounds each block's scale up"},
      {Framework::TorchTitan, "      model:\n        converters: [quantize.grouped_mm.float8]\n",
       "the 'quantize.grouped_mm.float8' converter is not built"},
      {Framework::TorchTitan, "      quantize:\n        grouped_mm:\n          float8:\n            fqns: [experts]\n",
       "'quantize.grouped_mm.float8.fqns' is not supported: FP8"},
      {Framework::TorchTitan, "      primus_turbo:\n        enable_attention_float8: true\n",
       "'primus_turbo.enable_attention_float8' is not supported: FP8 attention"},
      {Framework::TorchTitan, "      optimizer:\n        name: Adam\n",
       "'optimizer.name: Adam' is not supported: only AdamW"},
      {Framework::TorchTitan, "      optimizer:\n        early_step_in_backward: true\n",
       "'optimizer.early_step_in_backward' is not supported"},
      {Framework::TorchTitan, "      model:\n        name: llama4\n        flavor: debugmodel\n",
       "torchtitan's llama4 debug flavours (dim 256, 6 layers) have no preset on this engine"},
      {Framework::TorchTitan, "      model:\n        name: gpt_oss\n        flavor: debugmodel\n",
       "torchtitan's gpt_oss debugmodel (dim 256, 4 layers, 8 experts) has no preset on this engine"},
      {Framework::TorchTitan,
       "      model:\n        name: qwen3\n        flavor: 30B-A3B\n        converters: [float8]\n"
       "      float8:\n        filter_fqns: [output]\n",
       "is not supported: FP8 on torchtitan's MoE flavours is not mapped"},
      {Framework::TorchTitan,
       "      model:\n        name: deepseek_v3\n        flavor: 16B\n      primus_turbo:\n"
       "        enable_primus_turbo: true\n        use_turbo_grouped_mm: true\n",
       "'primus_turbo.use_moe_fp8: true' is not supported: Primus-Turbo's FP8 grouped GEMM"},
      {Framework::TorchTitan,
       "      model:\n        name: deepseek_v3\n        flavor: 671B\n      parallelism:\n"
       "        context_parallel_degree: 2\n",
       "without context parallelism", 2},
      {Framework::TorchTitan, "      parallelism:\n        data_parallel_replicate_degree: 2\n", "HSDP", 4},
      {Framework::TorchTitan,
       "      lr_scheduler:\n        total_steps: 5\n",
       "'lr_scheduler.total_steps: 5' is not supported: a schedule shorter than training.steps",
       1,
       {{"training.steps", "10"}}},
      {Framework::TorchTitan, "      validation:\n        enable: true\n", "torchtitan's validation loop"},
      {Framework::TorchTitan, "      fault_tolerance:\n        enable: true\n",
       "'fault_tolerance.enable' is not supported: TorchFT"},
      {Framework::TorchTitan, "      checkpoint:\n        initial_load_path: /ckpt/step-100\n",
       "torchtitan's DCP checkpoints are not read"},
      {Framework::TorchTitan, "      experimental:\n        custom_import: my.model\n",
       "'experimental.custom_import' is not supported"},
      {Framework::TorchTitan,
       "",
       "Hugging Face dataset 'c4_test', which this engine does not read",
       1,
       {{"training.mock_data", "false"}}},
      {Framework::MaxText, "      quantization: nanoo_fp8\n",
       "'quantization: nanoo_fp8' is not supported: flax's delayed scaling (E4M3 forward, E5M2 gradients"},
      {Framework::MaxText, "      quantization: fp8\n",
       "in fp32 once as Transformer Engine does; the numbers would differ. Use this engine's keys instead"},
      {Framework::MaxText, "      quantization: int8\n", "'int8' is not built: of MaxText's modes only FP8 is"},
      {Framework::MaxText, "      dtype: float32\n      weight_dtype: bfloat16\n",
       "'weight_dtype: bfloat16' is not supported: bfloat16 weights computed in float32"},
      {Framework::MaxText, "      mu_dtype: float16\n", "'mu_dtype: float16' is not supported: float32 or bfloat16"},
      {Framework::MaxText, "      num_experts: 8\n", "'num_experts: 8' is not supported: llama3-8b is a dense model here"},
      {Framework::MaxText, "      model_name: deepseek3-671b\n",
       "'model_name: deepseek3-671b' is not supported: MaxText's DeepSeek-V3 and later models"},
      {Framework::MaxText, "      model_name: mixtral-8x7b\n      load_balance_loss_weight: 0.01\n",
       "'load_balance_loss_weight: 0.01' is not supported: MaxText's load-balance loss"},
      {Framework::MaxText, "      model_name: qwen3-235b-a22b\n", "load_balance_loss_weight 0.001"},
      {Framework::MaxText, "      model_name: gemma4-26b\n", "Gemma is not built"},
      {Framework::MaxText, "      model_name: llama4-17b-16e\n", "the model-families issue"},
      {Framework::MaxText, "      dropout_rate: 0.1\n", "'dropout_rate' is not supported: dropout"},
      {Framework::MaxText, "      attention_type: local_sliding\n",
       "'attention_type: local_sliding' is not supported: attention variants other than global"},
      {Framework::MaxText, "      z_loss_multiplier: 0.0001\n", "'z_loss_multiplier' is not supported"},
      {Framework::MaxText, "      opt_type: sgd\n", "'opt_type' is not supported: only AdamW"},
      {Framework::MaxText, "      adamw_mask: [bias, norm]\n", "'adamw_mask' is not supported"},
      {Framework::MaxText, "      rope_type: yarn\n", "'rope_type: yarn' is not supported"},
      {Framework::MaxText, "      mlp_activations: [gelu, linear]\n", "'mlp_activations' is not supported"},
      {Framework::MaxText, "      logits_via_embedding: true\n",
       "normalize_embedding_logits (logits divided by sqrt(emb_dim))"},
      {Framework::MaxText, "      mtp_num_layers: 1\n", "multi-token prediction is not mapped"},
      {Framework::MaxText, "      steps: 10\n      learning_rate_schedule_steps: 5\n",
       "MaxText then trains at learning rate 0"},
      {Framework::MaxText,
       "",
       "'dataset_type: hf' is not supported: MaxText's tfds, hf and grain",
       1,
       {{"dataset_type", "hf"}}},
      {Framework::MaxText, "      ici_data_parallelism: 2\n      ici_fsdp_parallelism: 2\n", "hybrid sharding", 4},
      {Framework::MaxText, "      eval_per_device_batch_size: 4\n",
       "an evaluation batch other than the training batch"},
  };
  for (const Case& k : cases) {
    const std::string text = k.f == Framework::TorchTitan ? torchtitan("") + k.overrides : maxtext(k.overrides);
    const std::string file = d.write("r.yaml", text);
    const std::string e = error_of([&] { load_experiment(file, k.cli, k.world); });
    EXPECT_NE(e.find(k.want), std::string::npos) << k.overrides << "\n -> " << e;
    if (e.find(file) == std::string::npos && e.find("default") == std::string::npos &&
        e.find("the command line") == std::string::npos)
      ADD_FAILURE() << "the error says not where the key was set: " << e;
  }
}

// MaxText's weight_dtype and mu_dtype as the precision-aware optimizer: bf16 parameters keep their
// gradients and AdamW's nu in bf16 (optax), mu in mu_dtype or else weight_dtype's.
// torchtitan's float8 converter quantizes the output layer unless filter_fqns lists "output"
// (torchtitan's default list is empty; Primus's FP8 example keeps it out): fp8_output_layer.
TEST(Dialects, TorchTitanFilterFqnsIsTheFp8OutputLayer) {
  TempDir d;
  const TrainingArgs all =
      load_experiment(d.write("a.yaml", torchtitan("      model:\n        converters: [primus_turbo, quantize.linear.float8]\n")))
          .train;
  EXPECT_EQ(all.fp8, Fp8Mode::Hybrid);
  EXPECT_EQ(all.fp8_recipe, Fp8Recipe::Tensorwise);
  EXPECT_TRUE(all.fp8_output_layer);
  const TrainingArgs kept = load_experiment(d.write("b.yaml", torchtitan("      model:\n        converters: [float8]\n"
                                                                         "      float8:\n        filter_fqns: [output]\n")))
                                .train;
  EXPECT_EQ(kept.fp8, Fp8Mode::Hybrid);
  EXPECT_FALSE(kept.fp8_output_layer);
  // quantize.linear.mx's default list is [output].
  const TrainingArgs mx = load_experiment(d.write("c.yaml", torchtitan("      model:\n        converters: [quantize.linear.mx]\n"
                                                                       "      quantize:\n        linear:\n          mx:\n"
                                                                       "            recipe_name: mxfp8_cublas_rceil\n")))
                              .train;
  EXPECT_EQ(mx.fp8_recipe, Fp8Recipe::Mxfp8);
  EXPECT_FALSE(mx.fp8_output_layer);
  const TrainingArgs off = load_experiment(d.write("e.yaml", torchtitan(""))).train;
  EXPECT_EQ(off.fp8, Fp8Mode::Off);
  EXPECT_FALSE(off.fp8_output_layer);
  // The engine's key alone, without fp8, is refused.
  std::string e = error_of([&] { load_experiment(d.write("f.yaml", torchtitan("")), {{"fp8_output_layer", "true"}}); });
  EXPECT_NE(e.find("fp8_output_layer puts the output layer in FP8 with the linears' recipe, but fp8 is off"),
            std::string::npos)
      << e;
}

TEST(Dialects, MaxTextWeightDtypeIsThePrecisionAwareOptimizer) {
  TempDir d;
  const TrainingArgs bf = load_experiment(d.write("a.yaml", maxtext("      weight_dtype: bfloat16\n"))).train;
  EXPECT_TRUE(bf.bf16);
  EXPECT_TRUE(bf.use_precision_aware_optimizer);
  EXPECT_EQ(bf.main_params_dtype, OptimDtype::Bf16);
  EXPECT_EQ(bf.main_grads_dtype, OptimDtype::Bf16);
  EXPECT_EQ(bf.exp_avg_dtype, OptimDtype::Bf16);
  EXPECT_EQ(bf.exp_avg_sq_dtype, OptimDtype::Bf16);
  const TrainingArgs mu32 =
      load_experiment(d.write("b.yaml", maxtext("      weight_dtype: bfloat16\n      mu_dtype: float32\n"))).train;
  EXPECT_EQ(mu32.exp_avg_dtype, OptimDtype::Fp32);
  EXPECT_EQ(mu32.exp_avg_sq_dtype, OptimDtype::Bf16);
  const TrainingArgs fp = load_experiment(d.write("c.yaml", maxtext(""))).train;  // base.yml: float32
  EXPECT_FALSE(fp.use_precision_aware_optimizer);
  EXPECT_EQ(fp.main_params_dtype, OptimDtype::Fp32);
  EXPECT_EQ(fp.exp_avg_dtype, OptimDtype::Fp32);
  const TrainingArgs mu16 = load_experiment(d.write("e.yaml", maxtext("      mu_dtype: bfloat16\n"))).train;
  EXPECT_TRUE(mu16.use_precision_aware_optimizer);
  EXPECT_EQ(mu16.exp_avg_dtype, OptimDtype::Bf16);
  EXPECT_EQ(mu16.main_params_dtype, OptimDtype::Fp32);
}

TEST(Dialects, CommandLineInBothNamesAndTypos) {
  TempDir d;
  const auto tt = d.write("tt.yaml", torchtitan("        steps: 50\n"));
  EXPECT_EQ(load_experiment(tt, {{"training.steps", "7"}}).train.train_iters, 7);
  EXPECT_EQ(load_experiment(tt, {{"training.local-batch-size", "5"}}).train.micro_batch_size, 5);
  EXPECT_EQ(load_experiment(tt, {{"train_iters", "9"}}).train.train_iters, 9);  // an engine key wins
  EXPECT_EQ(load_experiment(tt, {{"num-layers", "3"}}).model_spec.num_layers, 3);
  std::string e = error_of([&] { load_experiment(tt, {{"training.stepz", "3"}}); });
  EXPECT_NE(e.find("unknown key 'training.stepz' (did you mean 'training.steps'?) in a torchtitan config"),
            std::string::npos)
      << e;
  e = error_of([&] { load_experiment(d.write("typo.yaml", torchtitan("        seq_lenn: 64\n"))); });
  EXPECT_NE(e.find("typo.yaml:10: unknown key 'training.seq_lenn' (did you mean 'training.seq_len'?)"),
            std::string::npos)
      << e;
  const auto mt = d.write("mt.yaml", maxtext("      steps: 50\n"));
  EXPECT_EQ(load_experiment(mt, {{"steps", "6"}}).train.train_iters, 6);
  EXPECT_EQ(load_experiment(mt, {{"base_num_decoder_layers", "4"}}).model_spec.num_layers, 4);
  e = error_of([&] { load_experiment(mt, {{"stepz", "3"}}); });
  EXPECT_NE(e.find("unknown option --stepz on the command line (did you mean 'steps'?)"), std::string::npos) << e;
}

TEST(Dialects, NoEffectKeysListedAndPrintedSideBySide) {
  TempDir d;
  const auto f = d.write("e.yaml",
                         torchtitan("        steps: 50\n        gc_freq: 100\n      compile:\n        enable: true\n"));
  const ExperimentConfig c = load_experiment(f);
  std::set<std::string> listed;
  for (const auto& k : c.no_effect) listed.insert(k.key);
  EXPECT_EQ(listed, (std::set<std::string>{"compile.enable", "training.gc_freq"}));
  const std::string y = c.resolved_yaml();
  EXPECT_NE(y.find("#   compile.enable: true  (a kernel, compiler or backend choice"), std::string::npos) << y;
  EXPECT_NE(y.find("# framework: torchtitan, each key as written -> this engine's key"), std::string::npos) << y;
  EXPECT_NE(y.find("training.steps: 50"), std::string::npos) << y;
  EXPECT_NE(y.find("->  train_iters: 50"), std::string::npos) << y;
  EXPECT_NE(y.find("model.name: llama3, model.flavor: 8B"), std::string::npos) << y;  // from the model file
  EXPECT_NE(y.find("training.local_batch_size: 8 (default)"), std::string::npos) << y;
  EXPECT_NE(y.find("framework: torchtitan\n    model: llama3.1_8B\n"), std::string::npos) << y;
  // An access token is listed, not shown.
  const ExperimentConfig m = load_experiment(d.write("m.yaml", maxtext("      hf_access_token: hf_s3cr3t\n")));
  ASSERT_EQ(m.no_effect.size(), 1u);
  EXPECT_EQ(m.no_effect[0].value, "(hidden)");
  EXPECT_EQ(m.resolved_yaml().find("hf_s3cr3t"), std::string::npos);
}

// The same model described three ways resolves to the same engine config (the losses are compared
// bit for bit in tests/integration/cli/test_dialect_configs.cpp).
TEST(Dialects, ThreeWaysOneEngineConfig) {
  TempDir d;
  const std::string shape =
      "      num_layers: 2\n      hidden_size: 64\n      ffn_hidden_size: 128\n      num_attention_heads: 4\n"
      "      num_query_groups: 2\n      vocab_size: 512\n";
  const auto megatron =
      d.write("m.yaml",
              "exp_name: m\nmodules:\n  pre_trainer:\n    model: llama3.1_8B\n    overrides:\n" + shape +
                  "      seq_length: 32\n      micro_batch_size: 2\n      global_batch_size: 4\n      train_iters: 3\n"
                  "      lr: 1.0e-3\n      lr_decay_style: constant\n      weight_decay: 0.1\n      "
                  "decay_norms_and_biases: true\n"
                  "      adam_beta2: 0.95\n      mock_data: true\n");
  const auto titan = d.write(
      "t.yaml",
      torchtitan("        seq_len: 32\n        local_batch_size: 2\n        global_batch_size: 4\n"
                 "        steps: 3\n        mixed_precision_param: float32\n      optimizer:\n        lr: 1.0e-3\n"
                 "      lr_scheduler:\n        warmup_steps: 0\n        decay_ratio: 0.0\n      debug:\n"
                 "        seed: 1234\n" +
                 shape));
  const auto max = d.write(
      "x.yaml",
      maxtext("      model_name: llama3.1-8b\n      base_emb_dim: 64\n      base_mlp_dim: 128\n"
              "      base_num_query_heads: 4\n      base_num_kv_heads: 2\n      head_dim: 16\n"
              "      base_num_decoder_layers: 2\n      vocab_size: 512\n      max_target_length: 32\n"
              "      per_device_batch_size: 2\n      gradient_accumulation_steps: 2\n      steps: 3\n"
              "      learning_rate: 1.0e-3\n      warmup_steps_fraction: 0.0\n"
              "      learning_rate_final_fraction: 1.0\n      dtype: float32\n      init_weights_seed: 1234\n"));
  const ExperimentConfig m = load_experiment(megatron), t = load_experiment(titan), x = load_experiment(max);
  auto spec = [](const ExperimentConfig& c) {
    ModelSpec s = c.model_spec;
    s.kv_channels = s.head_dim();  // MaxText names the head size, Megatron derives it
    YAML::Emitter e;
    e << model_spec_to_yaml(s);
    return std::string(e.c_str());
  };
  EXPECT_EQ(spec(t), spec(m));
  EXPECT_EQ(spec(x), spec(m));
  for (const ExperimentConfig* c : {&t, &x}) {
    EXPECT_EQ(c->train.micro_batch_size, m.train.micro_batch_size);
    EXPECT_EQ(c->train.global_batch_size, m.train.global_batch_size);
    EXPECT_EQ(c->train.seq_length, m.train.seq_length);
    EXPECT_EQ(c->train.train_iters, m.train.train_iters);
    EXPECT_EQ(c->train.seed, m.train.seed);
    EXPECT_EQ(c->train.bf16, m.train.bf16);
    EXPECT_EQ(c->train.adam_beta1, m.train.adam_beta1);
    EXPECT_EQ(c->train.adam_beta2, m.train.adam_beta2);
    EXPECT_EQ(c->train.adam_eps, m.train.adam_eps);
    EXPECT_EQ(c->train.weight_decay, m.train.weight_decay);
    EXPECT_EQ(c->train.decay_norms_and_biases, m.train.decay_norms_and_biases);
    EXPECT_EQ(c->train.clip_grad, m.train.clip_grad);
    const LRSchedule a = schedule_of(c->train), b = schedule_of(m.train);
    for (int64_t s = 0; s < 3; ++s) EXPECT_EQ(a.lr_at(s), b.lr_at(s)) << s;  // bit for bit
  }
}

TEST(Dialects, TablesInTheDocsMatchTheCode) {
  // regenerate with scripts/regen_config_tables.py.
  std::ifstream in(std::string(PRIMUS_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in);
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  for (Framework f : {Framework::TorchTitan, Framework::MaxText}) {
    const std::string table = dialect_keys_reference(f);
    EXPECT_NE(doc.find(table), std::string::npos) << "docs/config.md's " << to_string(f) << " table is out of date";
  }
  EXPECT_NE(
      dialect_keys_reference(Framework::TorchTitan).find("| `training.steps` | applied | `10000` | train_iters |"),
      std::string::npos);
  EXPECT_NE(dialect_keys_reference(Framework::MaxText).find("| `quantization` | applied | `\"\"` |"),
            std::string::npos);
}

// Primus's top-level `env:` block (some of its MaxText examples set XLA variables): read into the
// config, exported by `train pretrain`; anything but a map of values is an error with its line.
TEST(PrimusEnvBlock, ReadAndChecked) {
  TempDir d;
  const std::string body = "modules:\n  pre_trainer:\n    model: tiny\n    overrides:\n      train_iters: 2\n"
                           "      mock_data: true\n";
  const ExperimentConfig c = load_experiment(d.write("e.yaml", "env:\n  XLA_FLAG_X: \".97\"\n  OTHER: 3\n" + body));
  ASSERT_EQ(c.env.size(), 2u);
  EXPECT_EQ(c.env[0], (std::pair<std::string, std::string>{"XLA_FLAG_X", ".97"}));
  EXPECT_EQ(c.env[1], (std::pair<std::string, std::string>{"OTHER", "3"}));
  std::string e = error_of([&] { load_experiment(d.write("f.yaml", "env: [a, b]\n" + body)); });
  EXPECT_NE(e.find("f.yaml:1: 'env' must be a map of NAME: value"), std::string::npos) << e;
  e = error_of([&] { load_experiment(d.write("g.yaml", "env:\n  A: [1, 2]\n" + body)); });
  EXPECT_NE(e.find("g.yaml:2: env 'A' must be a value"), std::string::npos) << e;
}
