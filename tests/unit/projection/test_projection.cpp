#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/memory.h"
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
// for each recompute setting.
TEST_F(Projection, MemoryMatchesTheTrainersPeakWithin10Percent) {
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
    EXPECT_NEAR(projected, measured, 0.10 * measured) << model << ", recompute '" << recompute << "' " << extra;
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
  fsdp_target.sharding = Sharding::Fsdp;
  auto fsdp = plan(config(""), fsdp_target);
  project_memory(fsdp);
  ASSERT_EQ(none.layout.dp, 2);
  const RankMemory &a = none.memory->per_rank[0], &b = zero.memory->per_rank[0], &c = fsdp.memory->per_rank[0];
  EXPECT_EQ(zero.sharding, Sharding::Zero1);
  EXPECT_DOUBLE_EQ(a.optimizer, 2 * a.parameters);       // two fp32 moments
  EXPECT_DOUBLE_EQ(b.optimizer, 0.5 * a.optimizer + 0.25 * a.parameters * 2);  // half the moments, the shard buffer
  EXPECT_DOUBLE_EQ(b.gradients, a.gradients);
  EXPECT_DOUBLE_EQ(c.parameters, a.parameters / 2);
  EXPECT_DOUBLE_EQ(c.gradients, a.gradients / 2);
  EXPECT_DOUBLE_EQ(c.optimizer, a.optimizer / 2);
  EXPECT_FALSE(fsdp.memory->notes.empty());
  // The config's strategy is the default, as the trainer resolves it (use_torch_fsdp2 included).
  EXPECT_EQ(plan(config("      use_torch_fsdp2: true\n"), h100(1, 2)).sharding, Sharding::Fsdp);
  auto zero2 = plan(config("      data_parallel_sharding_strategy: optim_grads\n"), h100(1, 2));
  EXPECT_EQ(zero2.sharding, Sharding::Zero2);
  project_memory(zero2);
  const RankMemory& d = zero2.memory->per_rank[0];
  EXPECT_DOUBLE_EQ(d.gradients, a.gradients / 2);
  EXPECT_DOUBLE_EQ(d.parameters, a.parameters / 2);
  EXPECT_GT(d.working_weights, c.working_weights);  // zero2 keeps the working copy whole
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

// Context parallel: each rank does 1/cp of the causal attention FLOPs (the ring's two diagonal
// blocks and 2 cp - 1 full ones, or the whole sequence for heads / cp), passes cp - 1 key/value
// blocks around in the forward, and keeps about 1/cp of the activations.
TEST(Workload, ContextParallelSplitsAttentionAndActivations) {
  ModelSpec m = load_model_spec("tiny_llama");
  WorkloadShape w;
  w.micro_batch_size = 2;
  w.seq_length = 128;
  auto attention_flops = [](const PassWork& p, int* blocks) {
    double f = 0;
    for (const OpSpec& o : p.ops)
      if (o.op.rfind("attention", 0) == 0) f += o.flops, *blocks += o.op != "attention_merge";
    return f;
  };
  const PartWork one = layer_work(m, w);
  int n1 = 0;
  const double f1 = attention_flops(one.f, &n1);
  EXPECT_EQ(n1, 1);
  for (int cp : {2, 4})
    for (bool a2a : {false, true}) {
      w.cp = cp;
      w.cp_a2a = a2a;
      const PartWork part = layer_work(m, w);
      int blocks = 0;
      EXPECT_DOUBLE_EQ(attention_flops(part.f, &blocks), f1 / cp) << "cp " << cp << " a2a " << a2a;
      EXPECT_EQ(blocks, a2a ? 1 : 2 + 2 * cp - 1);
      int p2p = 0, a2a_comms = 0;
      for (const CommSpec& c : part.f.comms) p2p += c.op == "p2p", a2a_comms += c.op == "all_to_all";
      EXPECT_EQ(p2p, a2a ? 0 : cp - 1);
      EXPECT_EQ(a2a_comms, a2a ? 2 : 0);
      for (const CommSpec& c : part.f.comms) EXPECT_TRUE(c.cp);
      // The layer's kept activations scale with its tokens (a2a keeps the whole-sequence qkv and
      // output of its heads as well).
      EXPECT_LT(part.kept_after_f, one.kept_after_f / cp * (a2a ? 1.5 : 1.05)) << "cp " << cp;
      EXPECT_GT(part.kept_after_f, one.kept_after_f / cp * 0.95) << "cp " << cp;
    }
}

// Expert parallel: a rank holds num_experts / ep experts, each with ep times the rows (balanced
// routing), so its expert FLOPs stay and its expert parameters divide; the rows cross the ep group
// once each way per pass (alltoall), or are all-gathered out and reduce-scattered back (allgather).
TEST(Workload, ExpertParallelDividesTheExpertsAndExchangesTheirRows) {
  const ModelSpec m = load_model_spec("tiny_mixtral");
  ASSERT_GT(m.num_experts, 1);
  const int64_t E = m.num_experts, C = m.hidden_size;
  EXPECT_EQ(layer_parameters(m, 1, true, 1) - layer_parameters(m, 1, true, 2), E / 2 * 3 * m.expert_ffn() * C);
  EXPECT_EQ(layer_tensors(m, true, 1) - layer_tensors(m, true, 2), E);  // two weights per expert
  WorkloadShape w;
  w.micro_batch_size = 2;
  w.seq_length = 128;
  auto gemms = [](const PassWork& p) {
    int n = 0;
    for (const OpSpec& o : p.ops) n += o.op == "gemm";
    return n;
  };
  const PartWork one = layer_work(m, w, true);
  for (const PassWork* p : {&one.f, &one.b})
    for (const CommSpec& c : p->comms) EXPECT_FALSE(c.ep) << c.op;
  const double rows = double(w.micro_batch_size * w.seq_length * m.moe_router_topk) * double(C) * 4;  // fp32
  for (bool allgather : {false, true}) {
    w.ep = 2;
    w.ep_allgather = allgather;
    const PartWork two = layer_work(m, w, true);
    EXPECT_DOUBLE_EQ(two.f.flops(), one.f.flops()) << "allgather " << allgather;
    EXPECT_DOUBLE_EQ(two.b.flops(), one.b.flops()) << "allgather " << allgather;
    EXPECT_EQ(gemms(one.f) - gemms(two.f), E) << "half the experts' two GEMMs";
    for (const PassWork* p : {&two.f, &two.b}) {
      std::vector<std::pair<std::string, double>> ep_comms;
      for (const CommSpec& c : p->comms)
        if (c.ep) ep_comms.emplace_back(c.op, c.bytes);
      const std::vector<std::pair<std::string, double>> want =
          allgather ? std::vector<std::pair<std::string, double>>{{"all_gather", 2 * rows}, {"reduce_scatter", 2 * rows}}
                    : std::vector<std::pair<std::string, double>>{{"all_to_all", rows}, {"all_to_all", rows}};
      EXPECT_EQ(ep_comms, want) << "allgather " << allgather;
    }
  }
}

// expert_tensor_parallel_size = tp: each expert's ffn (and the shared expert's) divided over tp,
// the rows all on every tp rank (gathered under sequence parallelism), the partial outputs and
// input gradients summed over tp.
TEST(Workload, ExpertTensorParallelSplitsTheExpertsAndSumsTheirOutputs) {
  const ModelSpec m = load_model_spec("tiny_mixtral");
  const int64_t E = m.num_experts, C = m.hidden_size, F = m.expert_ffn(), Fs = m.moe_shared_expert_intermediate_size;
  EXPECT_EQ(layer_parameters(m, 2, true, 1, 1) - layer_parameters(m, 2, true, 1, 2), E * 3 * (F / 2) * C + 3 * (Fs / 2) * C);
  EXPECT_EQ(layer_parameters(m, 1, true, 1, 2), layer_parameters(m, 1, true, 1, 1)) << "etp means nothing at tp 1";
  WorkloadShape w;
  w.micro_batch_size = 2;
  w.seq_length = 128;
  w.tp = 2;
  const PartWork whole = layer_work(m, w, true);
  w.etp = 2;
  const PartWork split = layer_work(m, w, true);
  // Without sequence parallelism both run all N rows: the experts' forward GEMMs halve.
  const double N = double(w.micro_batch_size * w.seq_length), M = N * double(m.moe_router_topk);
  auto gemm_flops = [](const PassWork& p) {
    double f = 0;
    for (const OpSpec& o : p.ops) f += o.op == "gemm" ? o.flops : 0.0;
    return f;
  };
  EXPECT_DOUBLE_EQ(gemm_flops(whole.f) - gemm_flops(split.f), 3 * M * double(F * C) + 3 * N * double(Fs * C));
  auto tp_comms = [](const PassWork& p) {
    std::vector<std::string> v;
    for (const CommSpec& c : p.comms)
      if (!c.ep && !c.cp) v.push_back(c.op);
    return v;
  };
  const double nc = N * double(C) * 4;  // an fp32 [N, C]
  ASSERT_EQ(tp_comms(split.f).size(), tp_comms(whole.f).size() + 1);
  EXPECT_EQ(tp_comms(split.f).back(), "all_reduce");
  EXPECT_DOUBLE_EQ(split.f.comms.back().bytes, nc);
  EXPECT_EQ(tp_comms(split.b).size(), tp_comms(whole.b).size() + 2) << "the dots and the input gradient";
  w.sequence_parallel = true;
  const PartWork sp = layer_work(m, w, true);
  const std::vector<std::string> f = tp_comms(sp.f);
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f[f.size() - 2], "all_gather");
  EXPECT_EQ(f.back(), "reduce_scatter");
}

// QK-norm (Qwen3): a norm over the q heads' and one over the k groups' rows in F, their input
// gradients in B, their weights' in W; the two weights whole on every tp rank.
TEST(Workload, QkNormNormalizesTheHeadsAndGroups) {
  ModelSpec m = load_model_spec("tiny");
  WorkloadShape w;
  w.micro_batch_size = 2;
  w.seq_length = 64;
  auto count = [](const PassWork& p, const std::string& op) {
    return std::count_if(p.ops.begin(), p.ops.end(), [&](const OpSpec& o) { return o.op == op; });
  };
  const PartWork plain = layer_work(m, w);
  m.qk_layernorm = true;
  const PartWork qk = layer_work(m, w);
  EXPECT_EQ(count(qk.f, "rmsnorm_forward"), count(plain.f, "rmsnorm_forward") + 2);
  EXPECT_EQ(count(qk.b, "rmsnorm_backward_input"), count(plain.b, "rmsnorm_backward_input") + 2);
  EXPECT_EQ(count(qk.w, "rmsnorm_backward_weight"), count(plain.w, "rmsnorm_backward_weight") + 2);
  for (const OpSpec& o : qk.f.ops)
    if (o.op == "rmsnorm_forward" && o.b == m.head_dim())
      EXPECT_TRUE(o.a == 128 * m.num_attention_heads || o.a == 128 * m.query_groups()) << o.a;
  EXPECT_GT(qk.kept_after_f, plain.kept_after_f);
  EXPECT_EQ(layer_parameters(m, 2), layer_parameters(load_model_spec("tiny"), 2) + 2 * m.head_dim());
}

TEST_F(Projection, ALayoutThatDoesNotFitTheScaleIsAnError) {
  EXPECT_THROW(plan(config("      tensor_model_parallel_size: 3\n"), h100(1, 8)), Error);
  EXPECT_THROW(parse_sharding("zero3"), Error);
}

// MLA (model/mla.h): its projections' GEMMs in place of qkv (every linear weight's three GEMMs,
// 6 N FLOPs per parameter), the attention on packed heads of width max(qk, v), the up projections
// divided over tp and the down projections whole.
TEST(Workload, MlaLayerRunsItsProjectionsAndPackedHeads) {
  ModelSpec m = load_model_spec("tiny_moe");
  ASSERT_TRUE(m.multi_latent_attention);
  ASSERT_GT(m.q_lora_rank, 0);
  WorkloadShape w;
  w.micro_batch_size = 2;
  w.seq_length = 64;
  const double N = 128;
  auto gemm_flops = [](const PartWork& p) {
    double f = 0;
    for (const PassWork* pass : {&p.f, &p.b, &p.w})
      for (const OpSpec& o : pass->ops) f += o.op == "gemm" ? o.flops : 0.0;
    return f;
  };
  const int64_t C = m.hidden_size, norms = 2 * C + m.q_lora_rank + m.kv_lora_rank;  // qk_layernorm: latent norms
  const PartWork dense = layer_work(m, w, false);
  EXPECT_DOUBLE_EQ(gemm_flops(dense), 6 * N * double(layer_parameters(m, 1) - norms));
  int attention = 0;
  for (const OpSpec& o : dense.f.ops)
    if (o.op == "attention_forward") {
      ++attention;
      EXPECT_EQ(o.c, m.num_attention_heads);
      EXPECT_EQ(o.d, m.num_attention_heads) << "a group per head";
      EXPECT_EQ(o.e, std::max(m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim));
    }
  EXPECT_EQ(attention, 1);
  // tp 2: the up projections and linear_proj halve, the down projections stay whole.
  const int64_t H = m.num_attention_heads, qk = m.qk_head_dim + m.qk_pos_emb_head_dim;
  const int64_t split = H * qk * m.q_lora_rank + H * (m.qk_head_dim + m.v_head_dim) * m.kv_lora_rank +
                        C * H * m.v_head_dim + 3 * m.ffn_hidden_size * C;
  EXPECT_EQ(layer_parameters(m, 1) - layer_parameters(m, 2), split / 2);
}

}  // namespace
}  // namespace primus::projection
