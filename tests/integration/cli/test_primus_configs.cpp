// Issue 18: Primus's own example configs (tests/integration/primus_configs/, copied unchanged)
// load, print their resolved config and train three iterations, with a tiny model forced by
// command-line overrides in Megatron's dash spelling.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/run_command.h"

namespace fs = std::filesystem;
using namespace primus;

namespace {

const std::string kCli = PRIMUS_CLI_PATH;
const std::string kRoot = PRIMUS_SOURCE_DIR;

test::CommandResult run(const std::string& args) {
  return test::run_command(
      "env -u PRIMUS_WORKSPACE -u PRIMUS_EXP_NAME OMPI_ALLOW_RUN_AS_ROOT=1 "
      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 '" +
      kCli + "' " + args + " 2>&1");
}

// A model of 2 layers of 64 over 512 tokens, 32 positions: seconds on a CPU.
const std::string kTiny =
    " --num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --num-query-groups 2"
    " --vocab-size 512 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4"
    " --train-iters 3 --log-interval 1";

class PrimusConfigs : public ::testing::TestWithParam<const char*> {};

TEST_P(PrimusConfigs, LoadPrintAndTrainThreeIterations) {
  const std::string config = kRoot + "/tests/integration/primus_configs/" + GetParam() + ".yaml";
  const fs::path ws = fs::temp_directory_path() / ("primus-configs-" + std::to_string(::getpid()));
  fs::remove_all(ws);

  const test::CommandResult printed =
      run("direct --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny + " --print-config");
  ASSERT_EQ(printed.code, 0) << printed.out;
  // The no-effect keys are listed, the forced tiny model and the Primus keys we apply are resolved.
  EXPECT_NE(printed.out.find("# accepted with no effect on this engine:"), std::string::npos) << printed.out;
  EXPECT_NE(printed.out.find("#   wandb_project: "), std::string::npos) << printed.out;
  EXPECT_NE(printed.out.find("#   enable_primus_turbo: 'true'"), std::string::npos) << printed.out;
  EXPECT_NE(printed.out.find("model_spec:\n      num_layers: 2\n      hidden_size: 64"), std::string::npos)
      << printed.out;
  EXPECT_NE(printed.out.find("eod_mask_loss: true"), std::string::npos) << printed.out;
  EXPECT_NE(printed.out.find("lr_decay_style: cosine"), std::string::npos) << printed.out;
  EXPECT_NE(printed.out.find("adam_beta2: 0.9"), std::string::npos) << printed.out;

  const test::CommandResult trained =
      run("direct --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny);
  ASSERT_EQ(trained.code, 0) << trained.out;
  // The FP8 twins add fp8: hybrid (applied, docs/fp8.md) and moe_use_legacy_grouped_gemm (no effect).
  const bool fp8 = std::string(GetParam()).find("-FP8-") != std::string::npos;
  EXPECT_NE(trained.out.find(fp8 ? "accepted with no effect on this engine (15 keys)"
                                 : "accepted with no effect on this engine (14 keys)"),
            std::string::npos)
      << trained.out;
  if (fp8) EXPECT_NE(printed.out.find("fp8: hybrid"), std::string::npos) << printed.out;
  // One run folder under the workspace, with three logged iterations of a finite loss.
  fs::path metrics;
  for (const auto& e : fs::directory_iterator(ws))
    if (fs::exists(e.path() / "metrics.jsonl")) metrics = e.path() / "metrics.jsonl";
  ASSERT_FALSE(metrics.empty()) << trained.out;
  std::ifstream in(metrics);
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("lm_loss")) continue;
    ++rows;
    EXPECT_EQ(j["iteration"].get<int>(), rows);
    EXPECT_TRUE(std::isfinite(j["lm_loss"].get<double>()));
    EXPECT_GT(j["lm_loss"].get<double>(), 5.0);  // about ln 512 = 6.24 at the start
  }
  EXPECT_EQ(rows, 3) << trained.out;
  fs::remove_all(ws);
}

// eod_mask_loss (set by all three examples) leaves positions whose input is the eod token out of
// the loss: on mock data over 4 tokens (eod: id 3) the first loss differs from the unmasked one.
TEST(PrimusConfigsEod, MaskChangesTheLoss) {
  const std::string config = kRoot + "/tests/integration/primus_configs/llama2_7B-BF16-pretrain.yaml";
  auto first_loss = [&](const std::string& mask) {
    const fs::path ws = fs::temp_directory_path() / ("primus-eod-" + std::to_string(::getpid()) + mask);
    fs::remove_all(ws);
    const test::CommandResult r = run("direct --workspace " + ws.string() + " -- train pretrain --config " + config +
                                      kTiny + " --vocab-size 4 --bf16 false --eod-mask-loss " + mask);
    EXPECT_EQ(r.code, 0) << r.out;
    std::ifstream in(ws / "llama2_7B-pretrain" / "metrics.jsonl");
    std::string line;
    std::getline(in, line);
    fs::remove_all(ws);
    return line.empty() ? -1.0 : nlohmann::json::parse(line)["lm_loss"].get<double>();
  };
  const double masked = first_loss("true"), unmasked = first_loss("false");
  ASSERT_GT(masked, 0);
  ASSERT_GT(unmasked, 0);
  EXPECT_NE(masked, unmasked);
  EXPECT_NEAR(masked, std::log(4.0), 0.2);  // still a loss over the other tokens
}

// On two ranks the no-effect keys are listed once, and an unsupported key is one error, not one per rank.
TEST(PrimusConfigsRanks, ListedOnceAndRefusedOnce) {
  const std::string config = kRoot + "/tests/integration/primus_configs/llama3.1_8B-BF16-pretrain.yaml";
  const fs::path ws = fs::temp_directory_path() / ("primus-ranks-" + std::to_string(::getpid()));
  fs::remove_all(ws);
  auto count = [](const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t i = text.find(what); i != std::string::npos; i = text.find(what, i + 1)) ++n;
    return n;
  };
  const auto ok = run("direct --nproc 2 --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny +
                      " --use-distributed-optimizer");
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_EQ(count(ok.out, "accepted with no effect on this engine"), 1u) << ok.out;
  const auto bad = run("direct --nproc 2 --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny +
                       " --normalization LayerNorm");
  EXPECT_NE(bad.code, 0);
  EXPECT_EQ(count(bad.out, "'normalization' is not supported"), 1u) << bad.out;
  fs::remove_all(ws);
}

// gpt-oss (docs/model_math.md): Primus's 20B and 120B examples load the gpt_oss_20B / 120B presets
// (OpenAI's models: sinks, windows, biases, the clamped GLU, YaRN) and train two iterations
// shrunk (16 experts of 32, top-4, heads of 16). The 20B one keeps the preset's window on
// alternate layers (forced to 8 keys so that it binds at 32 positions). The 120B one switches
// sinks on through Primus-Turbo's use_sink_attention with sink_sliding_window 0, i.e. sinks and no
// window (as Primus-Turbo trains it); sink_sliding_window 8 puts the window back on alternate
// layers, and a config that also writes window_size is refused naming both.
TEST(PrimusConfigsGptOss, ExamplesTrainTwoIterations) {
  const std::string dir = kRoot + "/tests/integration/primus_configs/";
  const fs::path ws = fs::temp_directory_path() / ("primus-gpt-oss-" + std::to_string(::getpid()));
  const std::string shrink = kTiny +
                             " --train-iters 2 --lr-warmup-iters 0 --lr-decay-iters 100 --kv-channels 16"
                             " --num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 32"
                             " --expert-model-parallel-size 1 --pipeline-model-parallel-size 1"
                             " --virtual-pipeline-model-parallel-size null --profile false";
  auto train = [&](const std::string& args, const std::vector<std::string>& wanted) {
    fs::remove_all(ws);
    const test::CommandResult printed =
        run("direct --workspace " + ws.string() + " -- train pretrain " + args + " --print-config");
    ASSERT_EQ(printed.code, 0) << printed.out;
    for (const std::string& want : wanted) EXPECT_NE(printed.out.find(want), std::string::npos) << want << "\n" << printed.out;
    const test::CommandResult trained = run("direct --workspace " + ws.string() + " -- train pretrain " + args);
    ASSERT_EQ(trained.code, 0) << trained.out;
    EXPECT_NE(trained.out.find("iteration      2/     2"), std::string::npos) << trained.out;
    EXPECT_EQ(trained.out.find("lm loss: nan"), std::string::npos) << trained.out;
    fs::remove_all(ws);
  };
  train("--config " + dir + "gpt_oss_20B-BF16-pretrain.yaml" + shrink + " --window-size \"[8, 0]\"",
        {"model: gpt_oss_20B", "softmax_type: learnable", "window_size: [8, 0]", "window_attn_skip_freq: 2",
         "add_bias_linear: true", "quick_geglu: true", "activation_func_clamp_value: 7",
         "position_embedding_type: yarn", "yarn_correction_range_round_to_int: false", "rotary_base: 150000"});
  const std::string big = "--config " + dir + "gpt_oss_120B-BF16-pretrain.yaml" + shrink;
  train(big, {"model: gpt_oss_120B", "softmax_type: learnable", "quick_geglu: true"});
  train(big + " --sink-sliding-window 8", {"window_size: [8, 0]", "window_attn_skip_freq: 2"});
  const test::CommandResult both = run("direct -- train pretrain " + big + " --window-size \"[8, 0]\" --print-config");
  EXPECT_NE(both.code, 0) << both.out;
  EXPECT_NE(both.out.find("use_sink_attention (Primus-Turbo's switch of gpt-oss's sinks and window) and window_size"),
            std::string::npos)
      << both.out;
}

TEST(PrimusConfigsGptOss, AttentionSinksAndWindowsTrain) {
  const std::string config = kRoot + "/tests/integration/primus_configs/llama2_7B-BF16-pretrain.yaml";
  const fs::path ws = fs::temp_directory_path() / ("primus-gpt-oss-attn-" + std::to_string(::getpid()));
  fs::remove_all(ws);
  const std::string keys = " --softmax-type learnable --window-size \"[8, 0]\" --window-attn-skip-freq 2";
  const test::CommandResult printed =
      run("direct --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny + keys + " --print-config");
  ASSERT_EQ(printed.code, 0) << printed.out;
  EXPECT_NE(printed.out.find("softmax_type: learnable"), std::string::npos) << printed.out;
  EXPECT_NE(printed.out.find("window_size: [8, 0]"), std::string::npos) << printed.out;
  const test::CommandResult trained = run("direct --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny + keys);
  ASSERT_EQ(trained.code, 0) << trained.out;
  EXPECT_NE(trained.out.find("iteration      3/     3"), std::string::npos) << trained.out;
  EXPECT_EQ(trained.out.find("lm loss: nan"), std::string::npos) << trained.out;
  fs::remove_all(ws);
}

// Kimi-K2 (configs/models/kimi_k2.yaml, from Primus's kimi_k2.yaml): the MI355X example loads
// unchanged with the preset's 384 experts and latent attention, and trains shrunk on one process.
TEST(PrimusConfigsKimiK2, LoadsUnchangedAndTrainsShrunk) {
  const std::string config = kRoot + "/tests/integration/primus_configs/kimi_k2-BF16-pretrain.yaml";
  const fs::path ws = fs::temp_directory_path() / ("primus-kimi-" + std::to_string(::getpid()));
  fs::remove_all(ws);
  const test::CommandResult printed =
      run("direct --workspace " + ws.string() + " -- train pretrain --config " + config + " --print-config");
  ASSERT_EQ(printed.code, 0) << printed.out;
  for (const char* want : {"num_attention_heads: 64", "num_experts: 384", "multi_latent_attention: true",
                           "moe_router_num_groups: 0", "vocab_size: 163840"})
    EXPECT_NE(printed.out.find(want), std::string::npos) << want << "\n" << printed.out;
  const test::CommandResult trained = run(
      "direct --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny +
      " --pipeline-model-parallel-size 1 --expert-model-parallel-size 1 --num-experts 16 --moe-ffn-hidden-size 32"
      " --moe-shared-expert-intermediate-size 32 --moe-layer-freq '([0]*1+[1]*1)' --kv-lora-rank 32 --q-lora-rank 32"
      " --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16");
  ASSERT_EQ(trained.code, 0) << trained.out;
  EXPECT_NE(trained.out.find("iteration      3/     3"), std::string::npos) << trained.out;
  fs::remove_all(ws);
}

// DeepSeek-V3 with multi-token prediction (docs/model_math.md): MI355X's example names the
// deepseek_v3 preset, whose one MTP depth (Primus's deepseek_v3.yaml: mtp_num_layers 1) it keeps;
// shrunk to one process (its 32-stage layout unset) it trains with the depth's loss logged apart.
TEST(PrimusConfigsDeepSeekV3, LoadsUnchangedAndTrainsWithItsMtpDepth) {
  const std::string config = kRoot + "/tests/integration/primus_configs/deepseek_v3-BF16-pretrain.yaml";
  const fs::path ws = fs::temp_directory_path() / ("primus-dsv3-" + std::to_string(::getpid()));
  fs::remove_all(ws);
  const test::CommandResult printed =
      run("direct --workspace " + ws.string() + " -- train pretrain --config " + config + " --print-config");
  ASSERT_EQ(printed.code, 0) << printed.out;
  for (const char* want : {"mtp_num_layers: 1", "mtp_loss_scaling_factor: 0.1", "num_experts: 256"})
    EXPECT_NE(printed.out.find(want), std::string::npos) << want << "\n" << printed.out;
  const test::CommandResult trained = run(
      "direct --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny +
      " --pipeline-model-parallel-size 1 --pipeline-model-parallel-layout null --expert-model-parallel-size 1"
      " --num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 32"
      " --moe-layer-freq '([0]*1+[1]*1)' --kv-lora-rank 32 --q-lora-rank 32 --qk-head-dim 16 --qk-pos-emb-head-dim 8"
      " --v-head-dim 16 --moe-router-num-groups 4 --moe-router-group-topk 2");
  ASSERT_EQ(trained.code, 0) << trained.out;
  EXPECT_NE(trained.out.find("iteration      3/     3"), std::string::npos) << trained.out;
  EXPECT_NE(trained.out.find("mtp_1 loss"), std::string::npos) << trained.out;
  fs::remove_all(ws);
}

// Llama 4, GLM-5 and MiniMax-M2.5 (docs/model_math.md): Primus's MI355X examples load unchanged on
// the llama4_17B16E (Meta's Scout: chunked attention, NoPE layers, QK L2-norm, routing on the
// experts' input), glm5 (latent attention) and minimax_m2.5 (partial rotary) presets, and train
// shrunk to one process: Scout with chunks of 16 of the 32 positions and its second layer NoPE.
TEST(PrimusConfigsFamilies, Llama4Glm5AndMiniMaxLoadUnchangedAndTrainShrunk) {
  const std::string one_rank =
      " --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 1"
      " --expert-model-parallel-size 1 --virtual-pipeline-model-parallel-size null"
      " --pipeline-model-parallel-layout null --num-virtual-stages-per-pipeline-rank null"
      " --decoder-first-pipeline-num-layers null --decoder-last-pipeline-num-layers null --profile false"
      " --num-experts 16 --moe-ffn-hidden-size 32 --moe-layer-freq 1";
  struct Case {
    const char* config;
    std::vector<const char*> printed;
    std::string args;
  };
  const std::vector<Case> cases = {
      {"llama4_17B16E-BF16-pretrain.yaml",
       {"attention_chunk_size: 8192", "no_rope_freq: 4", "qk_l2_norm: true", "moe_apply_probs_on_input: true",
        "num_experts: 16", "moe_router_topk: 1"},
       " --moe-shared-expert-intermediate-size 64 --attention-chunk-size 16 --no-rope-freq 2"},
      {"glm5-BF16-pretrain.yaml",
       {"multi_latent_attention: true", "num_experts: 256", "moe_router_topk: 8"},
       " --moe-router-topk 4 --kv-lora-rank 32 --q-lora-rank 32 --qk-head-dim 16 --qk-pos-emb-head-dim 8"
       " --v-head-dim 16"},
      {"minimax_m2.5-BF16-pretrain.yaml",
       {"rotary_percent: 0.5", "num_experts: 256", "qk_layernorm: true"},
       " --moe-router-topk 4 --kv-channels 16"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config);
    const std::string config = kRoot + "/tests/integration/primus_configs/" + c.config;
    const fs::path ws = fs::temp_directory_path() / ("primus-families-" + std::to_string(::getpid()));
    fs::remove_all(ws);
    const test::CommandResult printed =
        run("direct --workspace " + ws.string() + " -- train pretrain --config " + config + " --print-config");
    ASSERT_EQ(printed.code, 0) << printed.out;
    for (const char* want : c.printed) EXPECT_NE(printed.out.find(want), std::string::npos) << want << "\n" << printed.out;
    const test::CommandResult trained =
        run("direct --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny + one_rank + c.args);
    ASSERT_EQ(trained.code, 0) << trained.out;
    EXPECT_NE(trained.out.find("iteration      3/     3"), std::string::npos) << trained.out;
    EXPECT_EQ(trained.out.find("lm loss: nan"), std::string::npos) << trained.out;
    fs::remove_all(ws);
  }
}

// Grok (docs/model_math.md, Grok): Primus's examples name the grok1 and grok2 presets and set
// Megatron's num_virtual_stages_per_pipeline_rank: 4 on pipeline_model_parallel_size: 4 and
// expert_model_parallel_size: 8. Shrunk to two pipeline ranks of 8 layers (4 chunks each: the
// interleaved schedule) and 8 experts of 32, they train with the presets' soft-capping; on one
// process (the virtual stages unset, as a virtual pipeline needs pipeline ranks) too.
TEST(PrimusConfigsGrok, ExamplesTrainWithVirtualStagesAndSoftcaps) {
  const std::string dir = kRoot + "/tests/integration/primus_configs/";
  struct Case {
    std::string config, runtime, args, printed;
  };
  const std::vector<Case> cases = {{"grok2-FP8-pretrain.yaml", " --nproc 2",
                                    " --pipeline-model-parallel-size 2 --num-layers 8", "final_logit_softcapping: 50"},
                                   {"grok1-BF16-pretrain.yaml", "",
                                    " --pipeline-model-parallel-size 1 --num-virtual-stages-per-pipeline-rank null",
                                    "final_logit_softcapping: 0"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config);
    const fs::path ws = fs::temp_directory_path() / ("primus-grok-" + std::to_string(::getpid()));
    fs::remove_all(ws);
    const std::string command = "direct --workspace " + ws.string() + c.runtime + " -- train pretrain --config " + dir +
                                c.config + kTiny + " --moe-ffn-hidden-size 32 --expert-model-parallel-size 1" + c.args;
    const test::CommandResult printed = run(command + " --print-config");
    ASSERT_EQ(printed.code, 0) << printed.out;
    EXPECT_NE(printed.out.find(c.printed), std::string::npos) << printed.out;
    if (c.config.starts_with("grok2")) {
      EXPECT_NE(printed.out.find("virtual_pipeline_model_parallel_size: 4"), std::string::npos) << printed.out;
      EXPECT_NE(printed.out.find("router_logit_softcapping: 30"), std::string::npos) << printed.out;
    }
    const test::CommandResult trained = run(command);
    ASSERT_EQ(trained.code, 0) << trained.out;
    EXPECT_NE(trained.out.find("iteration      3/     3"), std::string::npos) << trained.out;
    EXPECT_EQ(trained.out.find("lm loss: nan"), std::string::npos) << trained.out;
    if (c.config.starts_with("grok2"))
      EXPECT_NE(trained.out.find("interleaved-1f1b over 8 stages (4 chunks per rank)"), std::string::npos)
          << trained.out;
    fs::remove_all(ws);
  }
}

// Primus's Qwen3-30B-A3B config (MI355X), unchanged: Megatron's precision-aware optimizer with bf16
// main gradients and moments (docs/optim.md#low-precision-optimizer-state), enable_experimental
// (no effect here) and the distributed optimizer. Shrunk to the tiny model with 16 experts, one
// rank per parallel dimension, it trains three iterations and says which dtypes it keeps.
TEST(PrimusConfigsPrecisionAware, Qwen3MoeTrainsWithBf16OptimizerState) {
  const std::string config = kRoot + "/tests/integration/primus_configs/qwen3_30B_A3B-BF16-pretrain.yaml";
  const fs::path ws = fs::temp_directory_path() / ("primus-configs-pa-" + std::to_string(::getpid()));
  fs::remove_all(ws);
  const test::CommandResult trained =
      run("direct --workspace " + ws.string() + " -- train pretrain --config " + config + kTiny +
          " --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --context-parallel-size 1"
          " --expert-model-parallel-size 1 --num-experts 16 --moe-router-topk 4 --moe-ffn-hidden-size 32"
          " --moe-layer-freq 1");
  ASSERT_EQ(trained.code, 0) << trained.out;
  EXPECT_NE(trained.out.find("precision-aware optimizer: main_grads_dtype bf16, main_params_dtype fp32, exp_avg_dtype "
                             "bf16, exp_avg_sq_dtype bf16"),
            std::string::npos)
      << trained.out;
  EXPECT_NE(trained.out.find("iteration      3/     3"), std::string::npos) << trained.out;
  EXPECT_EQ(trained.out.find("lm loss: nan"), std::string::npos) << trained.out;
  fs::remove_all(ws);
}

INSTANTIATE_TEST_SUITE_P(Examples, PrimusConfigs,
                         ::testing::Values("llama3.1_8B-BF16-pretrain", "llama2_7B-BF16-pretrain",
                                           "qwen2.5_7B-BF16-pretrain", "llama3.1_8B-FP8-pretrain",
                                           "llama2_7B-FP8-pretrain", "qwen2.5_7B-FP8-pretrain"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '.' || c == '-') c = '_';
                           return n;
                         });

}  // namespace
