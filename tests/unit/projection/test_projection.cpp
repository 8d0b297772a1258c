#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "core/memory.h"
#include "plan/model_walk.h"
#include "projection/projection.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace primus::projection {
namespace {

class Projection : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("primus_projection_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  config::ExperimentConfig config(const std::string& overrides, const std::string& model = "tiny") {
    std::ofstream(dir_ / "exp.yaml") << "exp_name: run\nworkspace: " << (dir_ / "ws").string()
                                     << "\nmodules:\n  pre_trainer:\n    model: " << model
                                     << "\n    overrides:\n      num_layers: 4\n      micro_batch_size: 2\n"
                                     << (overrides.find("global_batch_size") == std::string::npos ? "      global_batch_size: 8\n" : "")
                                     << "      seq_length: 64\n      train_iters: 2\n"
                                        "      log_interval: 1\n      eval_interval: 0\n      mock_data: true\n"
                                     << overrides;
    return config::load_experiment((dir_ / "exp.yaml").string());
  }
  static Target h100(int nodes = 1, int gpus = 8) {
    Target t;
    t.nodes = nodes;
    t.gpus_per_node = gpus;
    t.hardware = *trace::find_hardware("H100");
    return t;
  }
  fs::path dir_;
};

TEST(Comm, RingCollectivesAndTransfers) {
  const Link l{100, 1, "test"};
  EXPECT_DOUBLE_EQ(comm_seconds("all_reduce", 1e9, 8, l), 14e-6 + 2 * 7.0 / 8 * 1e9 / 100e9);
  EXPECT_DOUBLE_EQ(comm_seconds("reduce_scatter", 1e9, 8, l), 7e-6 + 7.0 / 8 * 1e9 / 100e9);
  EXPECT_DOUBLE_EQ(comm_seconds("p2p", 1e6, 2, l), 1e-6 + 1e6 / 100e9);
  EXPECT_DOUBLE_EQ(comm_seconds("all_reduce", 1e9, 1, l), 0.0);
}

// The trainer's measured peak (the tensor pool's, one process on the CPU) against the projection,
// for each recompute setting: the walk of the real passes holds what they hold.
TEST_F(Projection, MemoryMatchesTheTrainersPeakWithin1Percent) {
  // Dense with each recompute setting, an MoE model (every layer routed, top-2 of 8 experts), and
  // the DeepSeek-style one (MLA, a dense first layer, shared expert) with and without recompute,
  // and QK-norm (Qwen3's) on the dense one.
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"tiny", "", ""},           {"tiny", "selective", ""},  {"tiny", "full", ""},
      {"tiny_mixtral", "", ""},   {"tiny_moe", "", ""},       {"tiny_moe", "full", ""},
      {"tiny", "", "      qk_layernorm: true\n"}};
  for (const auto& [model, recompute, extra] : cases) {
    const std::string ov = "      recompute_granularity: \"" + recompute + "\"\n" + extra;
    const config::ExperimentConfig cfg = config(ov, model);
    fs::remove_all(dir_ / "ws");
    reset_peak_host_memory();
    train::pretrain(cfg);
    std::ifstream in(dir_ / "ws" / "run" / "metrics.jsonl");
    std::string line, last;
    while (std::getline(in, line))
      if (line.find("\"peak_memory_bytes\"") != std::string::npos) last = line;  // a step's row, not a save's
    const double measured = nlohmann::json::parse(last)["peak_memory_bytes"].get<double>();
    Target t = h100(1, 1);
    auto p = plan(cfg, t);
    project_memory(p);
    const double projected = p.memory->per_rank[0].peak;
    EXPECT_NEAR(projected, measured, 0.01 * measured) << model << ", recompute '" << recompute << "' " << extra;
    std::printf("%s%s, recompute '%s': measured %.0f, projected %.0f bytes (%+.2f%%)\n", model.c_str(),
                extra.empty() ? "" : " (qk_layernorm)", recompute.c_str(), measured, projected,
                100 * (projected - measured) / measured);
  }
}

TEST_F(Projection, ShardingDividesTheOptimizerState) {
  auto none = plan(config(""), h100(1, 2));
  project_memory(none);
  auto zero = plan(config("      use_distributed_optimizer: true\n"), h100(1, 2));
  project_memory(zero);
  auto fsdp_target = h100(1, 2);
  fsdp_target.sharding = DpSharding::OptimGradsParams;
  auto fsdp = plan(config(""), fsdp_target);
  project_memory(fsdp);
  ASSERT_EQ(none.layout.dp, 2);
  const RankMemory &a = none.memory->per_rank[0], &b = zero.memory->per_rank[0], &c = fsdp.memory->per_rank[0];
  EXPECT_EQ(zero.sharding, DpSharding::Optim);
  EXPECT_DOUBLE_EQ(a.optimizer, 2 * a.parameters);               // two fp32 moments
  EXPECT_NEAR(b.optimizer, 0.5 * a.optimizer, 1024);             // half the moments (the buckets' shards)
  EXPECT_NEAR(b.buffers - a.buffers, 0.5 * a.parameters, 1024);  // the reduce-scatter's receive buffer
  EXPECT_DOUBLE_EQ(b.gradients, a.gradients);
  // FSDP's shards are rows of each tensor: half of each, up to a row and the alignment.
  EXPECT_NEAR(c.parameters, a.parameters / 2, 0.01 * a.parameters);
  EXPECT_NEAR(c.gradients, a.gradients / 2, 0.01 * a.gradients);
  EXPECT_NEAR(c.optimizer, a.optimizer / 2, 0.01 * a.optimizer);
  EXPECT_FALSE(fsdp.memory->notes.empty());
  // The config's strategy is the default, as the trainer resolves it (use_torch_fsdp2 included).
  EXPECT_EQ(plan(config("      use_torch_fsdp2: true\n"), h100(1, 2)).sharding, DpSharding::OptimGradsParams);
  auto zero2 = plan(config("      data_parallel_sharding_strategy: optim_grads\n"), h100(1, 2));
  EXPECT_EQ(zero2.sharding, DpSharding::OptimGrads);
  project_memory(zero2);
  const RankMemory& d = zero2.memory->per_rank[0];
  EXPECT_DOUBLE_EQ(d.gradients, c.gradients);
  EXPECT_DOUBLE_EQ(d.parameters, c.parameters);
  EXPECT_GT(d.working_weights, c.working_weights);  // zero2 keeps the working copy whole
  // A checkpoint save's host memory (an H100: the state is copied to the host first): every
  // strategy writes about half of the dp2 part, 12 bytes an element; async holds a second copy.
  for (const RankMemory* r : {&a, &b, &c, &d}) {
    const double copy = 12.0 * double(r->save.elements);
    EXPECT_NEAR(double(r->save.elements), 0.5 * double(a.parameter_count), 0.02 * double(a.parameter_count));
    EXPECT_DOUBLE_EQ(r->save.sync_bytes, r->save.staging_bytes + copy);
    EXPECT_DOUBLE_EQ(r->save.async_bytes, r->save.sync_bytes + copy);
  }
  const auto j = to_json(none);
  EXPECT_DOUBLE_EQ(j["per_rank"][0]["save_host_bytes_async"].get<double>(), a.save.async_bytes);
  EXPECT_NE(to_text(none).find("host memory of a checkpoint save per rank"), std::string::npos);
}

// 1F1B holds at most pp microbatches on its first rank, GPipe all of them.
TEST_F(Projection, InFlightMicrobatchesComeFromTheSchedule) {
  const std::string pp4 = "      pipeline_model_parallel_size: 4\n      global_batch_size: 16\n";
  auto one = plan(config(pp4 + "      pipeline_schedule: 1f1b\n"), h100(1, 4));
  project_memory(one);
  auto gpipe = plan(config(pp4 + "      pipeline_schedule: gpipe\n"), h100(1, 4));
  project_memory(gpipe);
  EXPECT_EQ(one.layout.microbatches_per_rank, 8);
  EXPECT_EQ(one.memory->per_rank[0].peak_in_flight, 4);
  EXPECT_EQ(one.memory->per_rank[3].peak_in_flight, 1);
  EXPECT_EQ(gpipe.memory->per_rank[0].peak_in_flight, 8);
  EXPECT_GT(gpipe.memory->per_rank[0].activations, one.memory->per_rank[0].activations);
  const auto j = to_json(one);
  ASSERT_EQ(j["per_rank"].size(), 4u);
  EXPECT_GT(j["per_rank"][0]["peak_bytes"].get<double>(), 0.0);
}

TEST_F(Projection, RooflinePerformanceScalesWithDataParallelism) {
  const config::ExperimentConfig cfg = config("      tensor_model_parallel_size: 2\n", "llama2c_15M");
  auto one = plan(cfg, h100(1, 2));
  auto four = plan(cfg, h100(1, 8));
  RooflineOps timer(*trace::find_hardware("H100"));
  project_performance(one, timer);
  project_performance(four, timer);
  ASSERT_EQ(one.layout.dp, 1);
  ASSERT_EQ(four.layout.dp, 4);
  EXPECT_GT(four.performance->tokens_per_s, 2 * one.performance->tokens_per_s);
  EXPECT_GT(one.performance->stages[0].tp_comm, 0.0);
  EXPECT_GT(one.performance->mfu, 0.0);
  EXPECT_LT(one.performance->mfu, 1.0);
  EXPECT_GT(four.performance->dp_total_s, 0.0);
}

// FP8 GEMMs at each machine's FP8 peak where its matrix units take the operands' scaling: tensor
// scales and DeepSeek's blocks on all five, MX blocks only on the MI355X; elsewhere (and on the
// CPU, which emulates FP8 through its bf16 GEMMs) at the bf16 peak.
TEST(Roofline, Fp8GemmsRunAtTheFp8PeakWhereTheMatrixUnitsTakeTheirScales) {
  ops::OpCall g;
  g.op = "gemm";
  g.flops = 2.0 * 8192.0 * 8192.0 * 8192.0;  // compute-bound on every machine
  g.bytes = 3.0 * 8192.0 * 8192.0 * 2.0;
  for (const char* name : {"H100", "H200", "MI300X", "MI325X", "MI355X"}) {
    RooflineOps timer(*trace::find_hardware(name));
    const double bf16 = timer.seconds(g);
    for (const fp8::Granularity s : {fp8::Granularity::Tensor, fp8::Granularity::Tile1x128, fp8::Granularity::Mx32}) {
      ops::OpCall f = g;
      f.fp8 = ops::OpCall::Fp8Operands{{fp8::Format::E4M3, s}, {fp8::Format::E4M3, s}};
      const bool fast = s != fp8::Granularity::Mx32 || std::string(name) == "MI355X";
      EXPECT_NEAR(timer.seconds(f) / bf16, fast ? 0.5 : 1.0, 0.01) << name << " " << fp8::granularity_name(s);
    }
    EXPECT_NE(timer.describe().find("FP8"), std::string::npos) << timer.describe();
  }
  RooflineOps cpu(trace::Hardware{"CPU", "cpu", 1.0, 16, 50});
  ops::OpCall f = g;
  f.fp8 = ops::OpCall::Fp8Operands{};
  EXPECT_EQ(cpu.seconds(f), cpu.seconds(g));
  EXPECT_NE(f.key(), g.key());  // timed apart when measured
}

// The projection's walk marks the FP8 linears' GEMMs with their scaling (and only theirs: the
// attention's and the output layer's stay bf16), so that a target times them at its FP8 peak
// (Roofline.Fp8GemmsRunAtTheFp8PeakWhereTheMatrixUnitsTakeTheirScales).
TEST_F(Projection, TheWalkMarksTheFp8LinearsGemms) {
  auto marked = [&](const std::string& fp8) {
    const auto p = plan(config("      bf16: true\n" + fp8, "llama2c_15M"), h100(1, 1));
    std::map<std::string, int> n;
    for (const auto& rank : p.walks)
      for (const auto& c : rank.chunks)
        for (const auto* pass : {&c.f, &c.b, &c.w})
          for (const ops::OpCall& o : pass->ops)
            if (std::string(o.op) == "gemm") ++n[o.fp8 ? fp8::granularity_name(o.fp8->coarsest()) : "bf16"];
    return n;
  };
  const auto none = marked(""), tensor = marked("      fp8: hybrid\n      fp8_recipe: tensorwise\n");
  const auto blocks = marked("      fp8: e4m3\n      fp8_recipe: blockwise\n");
  const auto mx = marked("      fp8: e4m3\n      fp8_recipe: mxfp8\n");
  EXPECT_EQ(none.size(), 1u);
  // 4 layers x 4 linears x 3 GEMMs in FP8; the output layer's (and nothing else) in bf16.
  EXPECT_EQ(tensor.at("tensor"), 48);
  EXPECT_EQ(tensor.at("bf16") + 48, none.at("bf16"));
  EXPECT_EQ(blocks.at("1x128 tiles"), 48);
  EXPECT_EQ(mx.at("1x32 blocks (E8M0)"), 48);
}

// ZeRO-2 / FSDP's collective schedule (train/sharded_weights.h): with 2 microbatches per rank,
// reducing once per step halves the reduce-scatter time, and keeping FSDP's units gathered from
// forward to backward halves the gathers'. Totals of gradient reduction and gathers at dp 4.
TEST_F(Projection, ShardedScheduleFollowsTheOptions) {
  RooflineOps timer(*trace::find_hardware("H100"));
  const auto dp_total = [&](const std::string& keys) {
    auto p = plan(config("      global_batch_size: 16\n      data_parallel_sharding_strategy: optim_grads_params\n" + keys,
                         "llama2c_15M"),
                  h100(1, 4));
    EXPECT_EQ(p.layout.microbatches_per_rank, 2);
    project_performance(p, timer);
    return p.performance->dp_total_s;
  };
  const double base = dp_total(""), once = dp_total("      reduce_sharded_grads_once_per_step: true\n"),
               kept = dp_total("      torch_fsdp2_reshard_after_forward: false\n"),
               both = dp_total("      reduce_sharded_grads_once_per_step: true\n"
                               "      torch_fsdp2_reshard_after_forward: false\n");
  EXPECT_LT(once, base);
  EXPECT_LT(kept, base);
  EXPECT_NEAR(base - kept, once - both, 1e-9 * base);  // the two savings are independent
}

// The walk of one decoder layer (a chunk of its own, walked as a pipeline stage) under `shape`.
plan::ChunkRecord layer_walk(const ModelSpec& m, plan::RankShape shape, int64_t layer = 0) {
  shape.pipeline = true;
  shape.chunks = {{layer, 1, false, false}};
  return plan::walk_rank(m, shape).chunks.front();
}

int count_ops(const plan::PassRecord& p, const std::string& op) {
  return int(std::count_if(p.ops.begin(), p.ops.end(), [&](const ops::OpCall& o) { return op == o.op; }));
}

double op_flops(const plan::PassRecord& p, const std::string& prefix) {
  double f = 0;
  for (const ops::OpCall& o : p.ops) f += std::string(o.op).rfind(prefix, 0) == 0 ? o.flops : 0.0;
  return f;
}

std::vector<parallel::CommCall> comms_on(const plan::PassRecord& p, const std::string& group) {
  std::vector<parallel::CommCall> v;
  for (const auto& c : p.comms)
    if (c.group == group) v.push_back(c);
  return v;
}

// Context parallel: each rank does 1/cp of the causal attention FLOPs (the ring's three blocks of
// its own chunks and two per other rank, or the whole sequence for heads / cp), receives cp - 1
// key/value blocks in the forward, each while the step's blocks compute, and keeps about 1/cp of
// the activations.
TEST(Walk, ContextParallelSplitsAttentionAndActivations) {
  const ModelSpec m = load_model_spec("tiny_llama");
  plan::RankShape w;
  w.micro_batch_size = 2;
  w.seq_length = 128;
  const plan::ChunkRecord one = layer_walk(m, w);
  EXPECT_EQ(count_ops(one.f, "attention_forward"), 1);
  const double f1 = op_flops(one.f, "attention");
  for (int cp : {2, 4})
    for (bool a2a : {false, true}) {
      w.cp = cp;
      w.cp_comm = a2a ? CpComm::A2A : CpComm::P2P;
      const plan::ChunkRecord part = layer_walk(m, w);
      EXPECT_DOUBLE_EQ(op_flops(part.f, "attention_block") + op_flops(part.f, "attention_forward"), f1 / cp)
          << "cp " << cp << " a2a " << a2a;
      EXPECT_EQ(count_ops(part.f, "attention_block_forward"), a2a ? 0 : 2 * cp + 1);
      int recv = 0, all_to_all = 0;
      for (const auto& c : comms_on(part.f, "cp")) {
        recv += std::string(c.op) == "recv", all_to_all += std::string(c.op) == "all_to_all";
        if (std::string(c.op) == "recv") EXPECT_GT(c.waited, c.issued) << "a ring step's transfer overlaps its blocks";
      }
      EXPECT_EQ(recv, a2a ? 0 : cp - 1);
      EXPECT_EQ(all_to_all, a2a ? 2 : 0);
      // The layer's kept activations scale with its tokens (a2a keeps the whole-sequence qkv and
      // output of its heads as well).
      EXPECT_LT(part.kept_after_f, one.kept_after_f / cp * (a2a ? 1.5 : 1.05)) << "cp " << cp;
      EXPECT_GT(part.kept_after_f, one.kept_after_f / cp * 0.95) << "cp " << cp;
    }
}

// Expert parallel: a rank holds num_experts / ep experts, each with ep times the rows (balanced
// routing), so its expert FLOPs stay and its expert parameters divide; the rows cross the ep group
// once each way per pass (alltoall), or are all-gathered out and reduce-scattered back (allgather).
TEST(Walk, ExpertParallelDividesTheExpertsAndExchangesTheirRows) {
  ModelSpec m = load_model_spec("tiny_mixtral");
  const int64_t E = m.num_experts, C = m.hidden_size;
  plan::RankShape w;
  w.micro_batch_size = 2;
  w.seq_length = 128;
  const plan::ChunkRecord one = layer_walk(m, w);
  EXPECT_TRUE(comms_on(one.f, "ep").empty());
  const double rows = double(w.micro_batch_size * w.seq_length * m.moe_router_topk) * double(C) * 4;  // fp32
  int64_t params_one = 0;
  {
    plan::RankShape s = w;
    s.pipeline = true;
    s.chunks = {{0, 1, false, false}};
    for (const auto& p : plan::walk_rank(m, s).params) params_one += p.numel;
    s.ep = 2;
    int64_t params_two = 0;
    for (const auto& p : plan::walk_rank(m, s).params) params_two += p.numel;
    EXPECT_EQ(params_one - params_two, E / 2 * 3 * m.expert_ffn() * C);
  }
  for (bool allgather : {false, true}) {
    m.moe_token_dispatcher_type = allgather ? "allgather" : "alltoall";
    w.ep = 2;
    const plan::ChunkRecord two = layer_walk(m, w);
    EXPECT_DOUBLE_EQ(op_flops(two.f, "grouped_gemm"), op_flops(one.f, "grouped_gemm")) << "allgather " << allgather;
    EXPECT_DOUBLE_EQ(op_flops(two.b, "grouped_gemm"), op_flops(one.b, "grouped_gemm")) << "allgather " << allgather;
    for (const plan::PassRecord* p : {&two.f, &two.b}) {
      std::vector<std::pair<std::string, double>> moved;
      for (const auto& c : comms_on(*p, "ep"))
        if (c.type != parallel::CommType::I32) moved.emplace_back(c.op, c.bytes);  // (the counts travel as int32)
      const std::vector<std::pair<std::string, double>> want =
          allgather ? std::vector<std::pair<std::string, double>>{{"all_gather", 2 * rows}, {"reduce_scatter", 2 * rows}}
                    : std::vector<std::pair<std::string, double>>{{"all_to_all", rows}, {"all_to_all", rows}};
      EXPECT_EQ(moved, want) << "allgather " << allgather;
    }
  }
}

// expert_tensor_parallel_size = tp: each expert's ffn (and the shared expert's) divided over tp,
// the rows all on every tp rank (gathered under sequence parallelism), the partial outputs summed
// over tp.
TEST(Walk, ExpertTensorParallelSplitsTheExpertsAndSumsTheirOutputs) {
  const ModelSpec m = load_model_spec("tiny_mixtral");
  const int64_t F = m.expert_ffn(), C = m.hidden_size;
  plan::RankShape w;
  w.micro_batch_size = 2;
  w.seq_length = 128;
  w.tp = 2;
  const plan::ChunkRecord whole = layer_walk(m, w);
  w.etp = 2;
  const plan::ChunkRecord split = layer_walk(m, w);
  // Without sequence parallelism both run all N rows: the experts' forward GEMMs halve.
  const double N = double(w.micro_batch_size * w.seq_length), M = N * double(m.moe_router_topk);
  EXPECT_DOUBLE_EQ(op_flops(whole.f, "grouped_gemm") - op_flops(split.f, "grouped_gemm"), 3 * M * double(F * C));
  const auto whole_tp = comms_on(whole.f, "tp"), split_tp = comms_on(split.f, "tp");
  ASSERT_FALSE(split_tp.empty());
  EXPECT_EQ(std::string(split_tp.back().op), "all_reduce");  // the experts' partial outputs
  EXPECT_DOUBLE_EQ(split_tp.back().bytes, N * double(C) * 4);
  EXPECT_GT(split_tp.size(), whole_tp.size());
  w.sequence_parallel = true;
  const auto sp = comms_on(layer_walk(m, w).f, "tp");
  std::vector<std::string> ops;
  for (const auto& c : sp) ops.push_back(c.op);
  EXPECT_EQ(ops.back(), "reduce_scatter");
  EXPECT_NE(std::find(ops.begin(), ops.end(), "all_gather"), ops.end());
}

// QK-norm (Qwen3): a norm over the q heads' and one over the k groups' rows in F, their input
// gradients in B, their weights' in W.
TEST(Walk, QkNormNormalizesTheHeadsAndGroups) {
  ModelSpec m = load_model_spec("tiny");
  plan::RankShape w;
  w.micro_batch_size = 2;
  w.seq_length = 64;
  const plan::ChunkRecord plain = layer_walk(m, w);
  m.qk_layernorm = true;
  const plan::ChunkRecord qk = layer_walk(m, w);
  EXPECT_EQ(count_ops(qk.f, "rmsnorm_forward"), count_ops(plain.f, "rmsnorm_forward") + 2);
  EXPECT_EQ(count_ops(qk.b, "rmsnorm_backward_input"), count_ops(plain.b, "rmsnorm_backward_input") + 2);
  // The norms' weight gradients run in B (model/norm_weight_grad.h: W keeps only a vector each).
  EXPECT_EQ(count_ops(qk.b, "rmsnorm_backward_weight"), count_ops(plain.b, "rmsnorm_backward_weight") + 2);
  EXPECT_EQ(count_ops(qk.w, "rmsnorm_backward_weight"), 0);
  for (const ops::OpCall& o : qk.f.ops)
    if (std::string(o.op) == "rmsnorm_forward" && o.b == m.head_dim())
      EXPECT_TRUE(o.a == 128 * m.num_attention_heads || o.a == 128 * m.query_groups()) << o.a;
  EXPECT_GT(qk.kept_after_f, plain.kept_after_f);
}

TEST_F(Projection, ALayoutThatDoesNotFitTheScaleIsAnError) {
  EXPECT_THROW(plan(config("      tensor_model_parallel_size: 3\n"), h100(1, 8)), Error);
  EXPECT_THROW(parse_sharding("zero3"), Error);
}

// MLA (model/mla.h): its projections' GEMMs in place of qkv (every linear weight's three GEMMs,
// 6 N FLOPs per parameter), the attention on packed heads of width max(qk, v), a group per head.
TEST(Walk, MlaLayerRunsItsProjectionsAndPackedHeads) {
  const ModelSpec m = load_model_spec("tiny_moe");
  ASSERT_TRUE(m.multi_latent_attention);
  ASSERT_GT(m.q_lora_rank, 0);
  plan::RankShape w;
  w.micro_batch_size = 2;
  w.seq_length = 64;
  w.pipeline = true;
  w.chunks = {{0, 1, false, false}};  // the dense first layer
  const plan::RankRecord rec = plan::walk_rank(m, w);
  const plan::ChunkRecord& dense = rec.chunks.front();
  double gemm = 0, weights = 0;
  for (const plan::PassRecord* p : {&dense.f, &dense.b, &dense.w}) gemm += op_flops(*p, "gemm");
  for (const StoredParam& p : rec.params)
    if (p.shape.size() == 2) weights += double(p.numel);
  EXPECT_DOUBLE_EQ(gemm, 6 * 128.0 * weights);
  int attention = 0;
  for (const ops::OpCall& o : dense.f.ops)
    if (std::string(o.op) == "attention_forward") {
      ++attention;
      EXPECT_EQ(o.c, m.num_attention_heads);
      EXPECT_EQ(o.d, m.num_attention_heads) << "a group per head";
      EXPECT_EQ(o.e, std::max(m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim));
    }
  EXPECT_EQ(attention, 1);
  EXPECT_GT(count_ops(dense.f, "copy"), 0) << "the heads packed by device copies";
}

}  // namespace
}  // namespace primus::projection
