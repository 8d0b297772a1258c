// Issue 21, finding 5: no memory estimate before building a model; `--num_layers 2000` allocated
// 12.5 GB over 53 s and ended in a bare std::bad_alloc. The estimate runs before any allocation:
// the model walked on the shape-only backend (plan/model_walk.h).
#include <gtest/gtest.h>

#include <chrono>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/model_spec.h"
#include "parallel/recording_process_group.h"
#include "plan/memory_estimate.h"
#include "plan/parallel_layout.h"
#include "train/dp_strategy.h"
#include "trainer_fixture.h"

using namespace primus;

namespace {

plan::MemoryEstimate estimate(const config::ExperimentConfig& cfg, int world, bool mixed = false) {
  const plan::ParallelLayout layout = plan::plan_layout(cfg.train, cfg.model_spec, world);
  return plan::estimate_memory(cfg.model_spec, layout, cfg.train, mixed);
}

}  // namespace

TEST(MemoryEstimate, ParametersAndBytesPerParameterFollowThePrecisionAndTheLayout) {
  test::TinyExperiment exp;
  const auto cfg = exp.load({{"num_layers", "4"}});
  const int64_t total = model_stats(cfg.model_spec, cfg.train.seq_length).parameters;
  const auto fp32 = estimate(cfg, 1);
  EXPECT_EQ(fp32.parameters, total);
  // value, gradient, two moments (and the flat layout's alignment gaps)
  EXPECT_NEAR(fp32.bytes_per_parameter(), 16.0, 0.1);
  EXPECT_GT(fp32.activation_bytes, 0.0);
  const auto mixed = estimate(cfg, 1, true);
  EXPECT_NEAR(mixed.bytes_per_parameter(), 18.0, 0.1);       // + the bf16 working copy
  EXPECT_LT(mixed.activation_bytes, fp32.activation_bytes);  // bf16 activations
  // ZeRO-1 over dp 2 halves the moments; tp 2 halves what a rank holds (norms aside).
  const auto zero = estimate(exp.load({{"num_layers", "4"}, {"use_distributed_optimizer", "true"}}), 2);
  EXPECT_NEAR(zero.bytes_per_parameter(), 12.0, 0.1);
  const auto tp2 = estimate(exp.load({{"num_layers", "4"}, {"tensor_model_parallel_size", "2"}}), 2);
  EXPECT_NEAR(double(tp2.parameters), total / 2.0, total * 0.02);
  // Full recompute keeps only each layer's input from its F to its B; its peak is then the
  // backward's rebuilt layer beside the head's logits (which this small model's 256-entry
  // vocabulary makes a large share).
  const auto full = estimate(exp.load({{"num_layers", "4"}, {"recompute_granularity", "full"}}), 1);
  EXPECT_LT(full.activation_bytes, fp32.activation_bytes / 2);
}

TEST(MemoryEstimate, AnAbsurdModelIsRefusedWithTheNumbersAndTheKeys) {
  test::TinyExperiment exp;
  // 2000 layers of a 16384-wide model: a hundred terabytes, walked without allocating any of it.
  const auto cfg = exp.load({{"num_layers", "2000"},
                             {"hidden_size", "16384"},
                             {"ffn_hidden_size", "53248"},
                             {"num_attention_heads", "128"},
                             {"num_query_groups", "128"}});
  const auto e = estimate(cfg, 1);
  EXPECT_GT(e.total_bytes(), 1e14);
  try {
    plan::check_memory(e, 1, uint64_t(24) << 30, "host memory (MemAvailable)");
    ADD_FAILURE() << "no error";
  } catch (const Error& err) {
    const std::string m = err.what();
    for (const char* want : {"needs about", "host memory (MemAvailable) has 24.00 GiB free", "num_layers",
                             "micro_batch_size", "tensor_model_parallel_size", "recompute_granularity", "optimizer state"})
      EXPECT_NE(m.find(want), std::string::npos) << want << " in: " << m;
  }
  // The tiny model fits easily; two ranks on one host count twice.
  const auto tiny = estimate(exp.load(), 1);
  EXPECT_NO_THROW(plan::check_memory(tiny, 2, uint64_t(1) << 30, "host"));
  EXPECT_THROW(plan::check_memory(tiny, 2, uint64_t(tiny.total_bytes() * 1.5), "host"), Error);
  EXPECT_NO_THROW(plan::check_memory(e, 1, 0, "unknown"));  // nothing known: no check
  EXPECT_GT(plan::host_available_bytes(), uint64_t(1) << 20);
}

// MoE under tp and ep: the routed experts are divided by ep, and whole on every tp rank with the
// router, the shared expert and the norms; only the vocabulary and the attention and dense MLP
// linears are divided by tp. (An estimate that divided everything by tp undercounted MoE ranks; one
// that ignored ep counted every expert on every rank and refused runs that fit.)
TEST(MemoryEstimate, MoeExpertsAreDividedByEpAndWholeOnEveryTpRank) {
  test::TinyExperiment exp;
  const std::vector<std::pair<std::string, std::string>> moe = {
      {"num_layers", "4"},        {"num_experts", "4"}, {"moe_ffn_hidden_size", "32"}, {"moe_router_topk", "2"},
      {"moe_layer_freq", "2"},    {"moe_shared_expert_intermediate_size", "32"}};
  auto with = [&](std::vector<std::pair<std::string, std::string>> extra) {
    auto o = moe;
    o.insert(o.end(), extra.begin(), extra.end());
    return exp.load(o);
  };
  const auto cfg = with({});
  int64_t total = 0, experts = 0, split = 0, shared = 0;
  for (const auto& p : model_parameter_layout(cfg.model_spec)) {
    total += p.numel;
    if (p.expert >= 0) experts += p.numel;
    if (p.name.find(".shared_experts.") != std::string::npos) shared += p.numel;
    const bool dense_mlp = p.name.find(".mlp.linear_fc") != std::string::npos;
    if (p.name.starts_with("embedding.") || p.name.starts_with("output_layer.") ||
        p.name.find(".linear_qkv.") != std::string::npos || p.name.find(".linear_proj.") != std::string::npos ||
        dense_mlp)
      split += p.numel;
  }
  ASSERT_GT(experts, 0);
  EXPECT_EQ(estimate(cfg, 1).parameters, total);
  EXPECT_EQ(estimate(with({{"expert_model_parallel_size", "2"}, {"global_batch_size", "8"}}), 4).parameters,
            total - experts / 2);
  EXPECT_EQ(estimate(with({{"tensor_model_parallel_size", "2"}, {"expert_tensor_parallel_size", "1"}}), 2).parameters,
            total - split / 2);
  // expert_tensor_parallel_size = tp (the default): the routed and shared experts are split too.
  ASSERT_GT(shared, 0);
  EXPECT_EQ(estimate(with({{"tensor_model_parallel_size", "2"}}), 2).parameters,
            total - split / 2 - experts / 2 - shared / 2);
  EXPECT_EQ(estimate(with({{"tensor_model_parallel_size", "2"}, {"expert_model_parallel_size", "2"},
                           {"global_batch_size", "8"}}),
                     4)
                .parameters,
            total - split / 2 - 3 * experts / 4 - shared / 2);
  // Activations: the MoE block's saves grow with the routed choices per token, stay under full
  // recompute (the block keeps its own), and a tp rank saves them for all rows unless sequence
  // parallelism splits the rows.
  const auto top1 = estimate(with({{"moe_router_topk", "1"}}), 1), top2 = estimate(cfg, 1);
  EXPECT_GT(top2.activation_bytes, top1.activation_bytes);
  const auto full = estimate(with({{"recompute_granularity", "full"}}), 1);
  const auto dense_full = estimate(exp.load({{"num_layers", "4"}, {"recompute_granularity", "full"}}), 1);
  EXPECT_GT(full.activation_bytes, 1.5 * dense_full.activation_bytes);
  const auto tp2 = estimate(with({{"tensor_model_parallel_size", "2"}, {"expert_tensor_parallel_size", "1"}}), 2);
  const auto tp2_sp = estimate(
      with({{"tensor_model_parallel_size", "2"}, {"sequence_parallel", "true"}, {"expert_tensor_parallel_size", "1"}}),
      2);
  EXPECT_GT(tp2.activation_bytes, tp2_sp.activation_bytes);
  // Split experts save less per routed row than whole ones (their gate|up and activation divided).
  EXPECT_LT(estimate(with({{"tensor_model_parallel_size", "2"}}), 2).activation_bytes, tp2.activation_bytes);
}

// The weights, gradients and optimizer state the estimate counts are what the data-parallel
// strategy of each sharding holds (DataParallelStrategy::memory(), which the log's peak split
// reports): each strategy built for rank 0 of dp 4, dense and with experts over ep 2, on groups
// that record instead of communicating, with fp32, bf16 and fp8 AdamW moments (the precision-aware
// optimizer: half and a quarter of the optimizer bytes, and fp8's scale per tensor piece), and under LoRA (the frozen
// base without gradient shards or moments under ZeRO-2 / FSDP, ZeRO-1 run as no_shard; with experts, their adapters
// packed over edp). (The estimate runs before any strategy exists, and at scales where none could be built, so it sizes
// the same buffers from the walk.)
TEST(MemoryEstimate, WeightsGradientsAndOptimizerStateAreWhatTheStrategyHolds) {
  test::TinyExperiment exp;
  const std::vector<std::pair<std::string, std::string>> moe = {{"num_experts", "4"},
                                                                {"moe_ffn_hidden_size", "32"},
                                                                {"moe_router_topk", "2"},
                                                                {"moe_layer_freq", "2"},
                                                                {"expert_model_parallel_size", "2"}};
  for (const char* sharding : {"no_shard", "optim", "optim_grads", "optim_grads_params"})
    for (const bool experts : {false, true})
      for (const int state : {0, 1, 2})  // fp32, bf16, fp8 moments
        for (const bool lora : {false, true}) {
          const bool bf16_state = state == 1, fp8_state = state == 2;
          if (lora && state != 0) continue;
          std::vector<std::pair<std::string, std::string>> keys = {{"num_layers", "4"},
                                                                   {"global_batch_size", "8"},
                                                                   {"data_parallel_sharding_strategy", sharding}};
          if (experts) keys.insert(keys.end(), moe.begin(), moe.end());
          if (lora)  // (with experts, the routed experts' adapters over ep 2 among them)
            keys.insert(keys.end(), {{"modules.pre_trainer.overrides.lora.enabled", "true"},
                                     {"lora.dim", "4"},
                                     {"lora.target_modules", "[linear_qkv,linear_proj,linear_fc1,linear_fc2]"}});
          if (state != 0)
            keys.insert(keys.end(), {{"use_precision_aware_optimizer", "true"},
                                     {"exp_avg_dtype", bf16_state ? "bf16" : "fp8"},
                                     {"exp_avg_sq_dtype", bf16_state ? "bf16" : "fp8"}});
          const auto cfg = exp.load(keys);
          SCOPED_TRACE(std::string(sharding) + (experts ? " with experts over ep 2" : " dense") +
                       (bf16_state  ? ", bf16 moments"
                        : fp8_state ? ", fp8 moments"
                                    : "") +
                       (lora ? ", LoRA" : ""));
          const plan::ParallelLayout layout = plan::plan_layout(cfg.train, cfg.model_spec, 4);
          const plan::MemoryEstimate e = plan::estimate_memory(cfg.model_spec, layout, cfg.train, false);

          parallel::CommLog log;
          auto group = [&](const char* name, int size) {
            return std::make_unique<parallel::RecordingProcessGroup>(name, size, 0, log, Device::CPU);
          };
          parallel::MeshGroups g;
          g.tp = group("tp", 1), g.cp = group("cp", 1), g.pp = group("pp", 1), g.mp = group("mp", 1);
          g.dp = group("dp", layout.dp), g.dp_cp = group("dp_cp", layout.dp);
          g.ep = group("ep", layout.ep), g.edp = group("edp", layout.dp / layout.ep);
          g.edp_cp = group("edp_cp", layout.dp / layout.ep);
          LlamaOptions options;
          options.resident_weights = !layout.shard_gradients();
          options.lora = cfg.train.lora;
          ModelPartition part;
          part.ep_size = layout.ep;
          part.ep_group = g.ep.get();
          LlamaModel model(cfg.model_spec, cpu::cpu_backend(), Precision::Fp32, options, part);
          AdamWOptions adam;
          if (state != 0) adam.exp_avg_dtype = adam.exp_avg_sq_dtype = bf16_state ? DType::BF16 : DType::F8E4M3;
          const auto strategy = train::make_dp_strategy(
              {model, layout, g, parallel::MeshCoord{}, adam, cfg.train.ddp_bucket_size, true, 1});
          const train::DpMemory held = strategy->memory();
          // The estimate rounds each buffer up to the host pool's 64 bytes.
          EXPECT_NEAR(e.parameter_bytes + e.working_bytes, held.parameters, 256);
          EXPECT_NEAR(e.gradient_bytes, held.gradients, 256);
          EXPECT_NEAR(e.optimizer_bytes, held.optimizer, 256);
          // A checkpoint save: the elements the strategy writes (its shard_state), exactly, and the
          // host memory the save reports for them (12 bytes each, the staging buffer; on the CPU
          // nothing is copied for a sync save).
          const plan::SaveMemory save =
              plan::estimate_save_memory(plan::walk_ranks(cfg.model_spec, layout, cfg.train, Precision::Fp32).front(),
                                         layout, cfg.train, layout.sharding, false);
          const train::DpShardState shard = strategy->shard_state();
          EXPECT_EQ(save.elements, shard.numel());
          const double copy = 12.0 * double(shard.numel());
          EXPECT_EQ(save.staging_bytes, std::min(copy, double(4u << 20)));
          EXPECT_EQ(save.async_bytes, save.sync_bytes + copy);
          if (state != 0) {  // bf16: half the fp32 state; fp8: a quarter, and a scale per tensor piece
            auto fp32_keys = keys;
            fp32_keys.resize(fp32_keys.size() - 3);
            const auto fp32 = exp.load(fp32_keys);
            const plan::MemoryEstimate f = plan::estimate_memory(fp32.model_spec, layout, fp32.train, false);
            const double scales = fp8_state ? 8.0 * double(model.params().infos().size()) : 0.0;
            EXPECT_NEAR(e.optimizer_bytes, (bf16_state ? 0.5 : 0.25) * f.optimizer_bytes, 512 + scales);
            EXPECT_GT(e.optimizer_bytes, 0);
          }
        }
}

// ZeRO-2 / FSDP collective schedule (train/sharded_weights.h, ShardedSchedule), counted on groups that
// record instead of communicating: two microbatches of the tiny model at dp 2. By default every unit
// is reduce-scattered once per microbatch and FSDP gathers a unit for its forward and again for its
// backward; reduce_sharded_grads_once_per_step reduces each unit once per step, and
// torch_fsdp2_reshard_after_forward false gathers each unit once per microbatch. The memory that
// costs (the whole gradients through the step) is in the estimate and in the strategy's split alike.
TEST(ShardedSchedule, FewerCollectivesWhereAskedAndTheirMemoryInTheEstimate) {
  test::TinyExperiment exp;
  struct Count {
    int64_t gathers = 0, reductions = 0, units = 0;
    double gradient_bytes = 0, estimated_gradient_bytes = 0;
  };
  auto run = [&](const char* sharding, bool once_per_step, bool reshard) {
    const auto cfg = exp.load({{"num_layers", "4"},
                               {"global_batch_size", "8"},
                               {"micro_batch_size", "2"},
                               {"data_parallel_sharding_strategy", sharding},
                               {"reduce_sharded_grads_once_per_step", once_per_step ? "true" : "false"},
                               {"torch_fsdp2_reshard_after_forward", reshard ? "true" : "false"}});
    const plan::ParallelLayout layout = plan::plan_layout(cfg.train, cfg.model_spec, 2);
    EXPECT_EQ(layout.microbatches_per_rank, 2);
    parallel::CommLog log;
    auto group = [&](const char* name, int size) {
      return std::make_unique<parallel::RecordingProcessGroup>(name, size, 0, log, Device::CPU);
    };
    parallel::MeshGroups g;
    g.tp = group("tp", 1), g.cp = group("cp", 1), g.pp = group("pp", 1), g.mp = group("mp", 1);
    g.dp = group("dp", 2), g.dp_cp = group("dp_cp", 2), g.ep = group("ep", 1), g.edp = group("edp", 2);
    g.edp_cp = group("edp_cp", 2);
    LlamaOptions options;
    options.resident_weights = false;
    LlamaModel model(cfg.model_spec, cpu::cpu_backend(), Precision::Fp32, options);
    train::DpSetup setup{model, layout, g, parallel::MeshCoord{}, AdamWOptions{}, 0, true, 1};
    setup.reduce_sharded_grads_once_per_step = cfg.train.reduce_sharded_grads_once_per_step;
    setup.reshard_after_forward = cfg.train.torch_fsdp2_reshard_after_forward;
    const auto strategy = train::make_dp_strategy(setup);
    const size_t before = log.calls().size();
    strategy->begin_step();
    const int64_t b = 2, s = cfg.train.seq_length;
    std::vector<int32_t> tokens(size_t(b * s)), targets(size_t(b * s));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t(i % 50), targets[i] = int32_t((i + 1) % 50);
    for (int mb = 0; mb < 2; ++mb) {
      LlamaContext ctx;
      model.forward(ctx, tokens.data(), targets.data(), b, s);
      model.backward(ctx, 0.5);
    }
    strategy->finish_gradients();
    Count c;
    c.units = int64_t(model.weight_units().size());
    for (size_t i = before; i < log.calls().size(); ++i) {
      const std::string op = log.calls()[i].op;
      c.gathers += op == "all_gather";
      c.reductions += op == "reduce_scatter";
    }
    c.gradient_bytes = strategy->memory().gradients;
    c.estimated_gradient_bytes = plan::estimate_memory(cfg.model_spec, layout, cfg.train, false).gradient_bytes;
    return c;
  };
  for (const char* sharding : {"optim_grads", "optim_grads_params"}) {
    SCOPED_TRACE(sharding);
    const Count per_mb = run(sharding, false, true), per_step = run(sharding, true, true);
    const int64_t units = per_mb.units;  // the embedding, the blocks, the head
    EXPECT_EQ(units, 4 + 2);
    EXPECT_EQ(per_mb.reductions, 2 * units);
    EXPECT_EQ(per_step.reductions, units);
    EXPECT_EQ(per_step.gathers, per_mb.gathers);
    // 4 bytes per parameter more, in the strategy's split and in the estimate alike.
    const double whole = per_step.gradient_bytes - per_mb.gradient_bytes;
    EXPECT_GT(whole, 0);
    EXPECT_NEAR(per_step.estimated_gradient_bytes - per_mb.estimated_gradient_bytes, whole, 128);
    EXPECT_NEAR(per_step.estimated_gradient_bytes, per_step.gradient_bytes, 256);
  }
  const Count reshard = run("optim_grads_params", false, true), keep = run("optim_grads_params", false, false);
  EXPECT_EQ(keep.gathers, 2 * keep.units);  // once per unit and microbatch
  EXPECT_GT(reshard.gathers, keep.gathers);
  EXPECT_EQ(keep.reductions, reshard.reductions);
  EXPECT_EQ(run("optim_grads", false, false).gathers, 0);  // ZeRO-2 keeps its whole weights: no key to act on
}
