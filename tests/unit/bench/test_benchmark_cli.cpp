// `primus-cli direct -- benchmark gemm | attention` end to end on the CPU: tiny shapes give positive
// TFLOP/s, the GEMM list of an experiment config, and bad arguments (or a GPU that is not there)
// fail with a message naming the problem and a non-zero exit.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "support/run_command.h"

namespace {

using Result = primus::test::CommandResult;

// stdout only unless `with_stderr`; run in a temporary folder because the runtime writes a run
// folder there.
Result cli(const std::string& args, bool with_stderr = false) {
  return primus::test::run_command("cd '" + testing::TempDir() + "' && " + std::string(PRIMUS_CLI_PATH) +
                                   " direct --no-watch -- benchmark " + args + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string kTinyConfig = std::string(PRIMUS_SOURCE_DIR) + "/examples/tiny_llama_cpu.yaml";

}  // namespace

TEST(BenchmarkGemmCli, CpuFp32GivesPositiveThroughput) {
  Result r = cli("gemm -M 64 -N 48 -K 32 --dtype fp32 --device cpu --warmup 1 --iters 3 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["op"], "gemm");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["m"], 64);
  EXPECT_EQ(j["n"], 48);
  EXPECT_EQ(j["k"], 32);
  EXPECT_GT(j["ms"].get<double>(), 0);
  EXPECT_GT(j["tflops"].get<double>(), 0);
  EXPECT_NEAR(j["tflops"].get<double>() * j["ms"].get<double>() * 1e9, 2.0 * 64 * 48 * 32, 1e-3);
}

TEST(BenchmarkGemmCli, CpuTransposedText) {
  Result r = cli("gemm -M 33 -N 17 -K 9 --trans-a --trans-b --dtype fp32 --device cpu --iters 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r.out, "gemm fp32 TT m=33 n=17 k=9 on cpu")) << r.out;
  EXPECT_TRUE(has(r.out, "TFLOP/s")) << r.out;
}

TEST(BenchmarkGemmCli, CpuBf16RunsBothImplementationsOrSaysWhyNot) {
  // The CPU bf16 backend's two GEMMs, side by side; a CPU without AVX512-BF16 gets the reason.
  Result r = cli("gemm -M 37 -N 53 -K 19 --dtype bf16 --device cpu --warmup 1 --iters 2 --json", true);
  if (r.code != 0) {
    EXPECT_TRUE(has(r.out, "needs AVX512-BF16")) << r.out;
    EXPECT_TRUE(has(r.out, "--dtype fp32")) << r.out;
    return;
  }
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["dtype"], "bf16");
  EXPECT_EQ(j["out_dtype"], "bf16");
  EXPECT_GT(j["tflops"].get<double>(), 0);
  EXPECT_GT(j["peak_tflops"].get<double>(), 0);
  EXPECT_GT(j["peak_share"].get<double>(), 0);
  ASSERT_EQ(j["impls"].size(), 2u);
  EXPECT_EQ(j["impls"][0]["impl"], "avx512-bf16");
  EXPECT_EQ(j["impls"][1]["impl"], "onednn");
  bool backend_listed = false;
  for (const auto& x : j["impls"]) {
    EXPECT_GT(x["tflops"].get<double>(), 0);
    backend_listed |= x["impl"] == j["impl"];
  }
  EXPECT_TRUE(backend_listed) << j.dump();
  Result f = cli("gemm -M 16 -N 16 -K 16 --out-dtype fp32 --device cpu --iters 1", true);
  if (f.code == 0) EXPECT_TRUE(has(f.out, "gemm bf16>fp32 NN m=16 n=16 k=16 on cpu")) << f.out;
}

// --dtype fp8: each recipe quantizes both operands along K and runs the backend's FP8 GEMM (on the
// CPU the exact emulation through the bf16 GEMM) beside the bf16 GEMM of the same operands. The
// FP8 result's error against fp32 must exceed the bf16 result's (the quantization happened) and
// stay within what E4M3 rounding gives (a scale left out of alpha gives errors of order 1 or more).
// E4M3 rounds each operand to 3 mantissa bits (relative error up to 2^-4); on zero-mean data the
// sum's relative error is about the products' (random signs: no averaging out), measured 0.034 to
// 0.036 for every recipe on this shape (bf16: 0.0017, its output's rounding); bound 0.06.
TEST(BenchmarkGemmCli, CpuFp8EachRecipeQuantizesAndReportsItsError) {
  for (const char* recipe : {"delayed", "tensorwise", "blockwise", "mxfp8"}) {
    for (const char* trans : {"", " --trans-a --trans-b"}) {
      Result r = cli(std::string("gemm -M 48 -N 80 -K 272 --dtype fp8 --recipe ") + recipe + trans +
                         " --device cpu --warmup 1 --iters 2 --json",
                     true);
      if (r.code != 0) {  // a CPU without AVX512-BF16 has no bf16 backend to emulate FP8 with
        EXPECT_TRUE(has(r.out, "needs AVX512-BF16")) << r.out;
        return;
      }
      SCOPED_TRACE(std::string(recipe) + trans);
      auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
      EXPECT_EQ(j["dtype"], "fp8");
      EXPECT_EQ(j["recipe"], recipe);
      EXPECT_EQ(j["format"], "e4m3");
      EXPECT_EQ(j["emulated"], true);
      for (const char* key : {"ms", "tflops", "quantize_ms", "total_ms", "total_tflops", "bf16_ms", "speedup_vs_bf16"})
        EXPECT_GT(j[key].get<double>(), 0) << key;
      EXPECT_NEAR(j["total_ms"].get<double>(), j["ms"].get<double>() + j["quantize_ms"].get<double>(), 1e-9);
      const double e8 = j["rel_error"].get<double>(), e16 = j["bf16_rel_error"].get<double>();
      EXPECT_LT(e16, 4e-3) << j.dump();
      EXPECT_GT(e8, 3 * e16) << j.dump();
      EXPECT_GT(e8, 0.01) << j.dump();
      EXPECT_LT(e8, 0.06) << j.dump();
    }
  }
  Result t = cli("gemm -M 16 -N 16 -K 64 --dtype fp8 --device cpu --iters 1", true);
  if (t.code == 0) {
    EXPECT_TRUE(has(t.out, "gemm fp8 tensorwise (E4M3 x E4M3) NN m=16 n=16 k=64 on cpu")) << t.out;
    EXPECT_TRUE(has(t.out, "exact emulation through the bf16 GEMM")) << t.out;
    EXPECT_TRUE(has(t.out, "relative error against fp32 of the unquantized operands: fp8 ")) << t.out;
  }
}

TEST(BenchmarkGemmCli, CpuCompareTimesBothOnAModelsGemms) {
  Result r = cli("gemm --shapes-from " + kTinyConfig + " --compare --device cpu --iters 1", true);
  if (r.code != 0) {
    EXPECT_TRUE(has(r.out, "needs AVX512-BF16")) << r.out;
    return;
  }
  for (const char* part : {"self_attention.linear_qkv forward", "output_layer weight grad", "avx512-bf16 everywhere",
                           "onednn everywhere", "the backend's choice", "the faster of the two"})
    EXPECT_TRUE(has(r.out, part)) << part << "\n" << r.out;
}

TEST(BenchmarkGemmCli, DeviceCudaWithoutGpuIsAClearError) {
  Result r = cli("gemm -M 8 -N 8 -K 8 --dtype fp32 --device cuda --iters 1 --json", true);
  if (r.code == 0) GTEST_SKIP() << "this machine has a usable GPU";
  EXPECT_TRUE(has(r.out, "error: --device cuda:")) << r.out;
  // auto falls back to the CPU.
  Result a = cli("gemm -M 8 -N 8 -K 8 --dtype fp32 --device auto --iters 1 --json");
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(nlohmann::json::parse(a.out)["device"], "cpu");
}

TEST(BenchmarkGemmCli, BadArgumentsAreErrors) {
  struct Bad {
    std::string args, says;
  };
  for (const Bad& b : std::vector<Bad>{
           {"gemm -M -5 -N 8 -K 8 --device cpu", "-M must be positive, got -5"},
           {"gemm -M 8 -N 0 -K 8 --device cpu", "-N must be positive, got 0"},
           {"gemm -M 8 -N 8 -K 0 --device cpu", "-K must be positive"},
           {"gemm -M 8 -N 8 -K 8 --iters 0 --device cpu", "--iters must be at least 1"},
           {"gemm -M 8 -N 8 -K 8 --dtype fp16 --device cpu", "--dtype must be bf16, fp32 or fp8, got 'fp16'"},
           {"gemm -M 8 -N 8 -K 8 --out-dtype fp16 --device cpu", "--out-dtype must be bf16 or fp32"},
           {"gemm -M 8 -N 8 -K 8 --dtype fp8 --recipe hybrid --device cpu",
            "--recipe must be one of delayed, tensorwise, blockwise, mxfp8, got 'hybrid'"},
           {"gemm -M 8 -N 8 -K 8 --recipe blockwise --device cpu", "--recipe blockwise needs --dtype fp8"},
           {"gemm -M 8 -N 8 -K 8 --dtype fp8 --out-dtype fp32 --device cpu", "--out-dtype is for --dtype bf16"},
           {"gemm --compare -M 8 -N 8 -K 8 --device cpu", "--shapes-from"},
           {"gemm --shapes-from " + kTinyConfig + " --compare --dtype fp32 --device cpu", "--dtype must be bf16"},
           {"gemm -M 8 -N 8 -K 8 --device tpu", "--device must be auto, cpu or cuda"},
           {"gemm --list", "--shapes-from"},
           {"gemm --tune -M 8 -N 8 -K 8 --device cpu", "--shapes-from"},
           {"gemm --shapes-from " + kTinyConfig, "add --list"},
           {"gemm --shapes-from " + kTinyConfig + " --tune --device cpu", "needs the GPU"},
           {"gemm --shapes-from /no/such/config.yaml --list", "/no/such/config.yaml"},
       }) {
    Result r = cli(b.args, true);
    EXPECT_NE(r.code, 0) << b.args << "\n" << r.out;
    EXPECT_TRUE(has(r.out, b.says)) << b.args << " should say '" << b.says << "':\n" << r.out;
  }
}

TEST(BenchmarkGemmCli, ListsTheGemmsOfAnExperimentConfig) {
  // tiny_llama: 4 layers, hidden 256, ffn 768, 8 heads / 4 groups (head dim 32), vocab 2048, an
  // untied output layer; bf16; micro batch 8 x seq 128 = 1024 rows; the logits fit, so one
  // vocabulary chunk. The list is the model's own passes walked (plan/gemm_list.h), named by the
  // weight each GEMM reads or whose gradient it writes.
  Result r = cli("gemm --shapes-from " + kTinyConfig + " --list --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model"], "tiny_llama");
  EXPECT_EQ(j["rows"], 1024);
  EXPECT_EQ(j["vocab_chunk"], 2048);
  const auto& g = j["gemms"];
  ASSERT_EQ(g.size(), 15u);  // the 4 linears' 3 GEMMs each, the output layer's 3
  auto find = [&](const std::string& what) {
    for (const auto& x : g)
      if (x["what"] == what) return x;
    ADD_FAILURE() << "no " << what << " in " << g.dump();
    return nlohmann::json();
  };
  EXPECT_EQ(g[0]["what"], "self_attention.linear_qkv forward");  // the order the step runs them
  const auto qkv = find("self_attention.linear_qkv forward");
  EXPECT_EQ(qkv["op"], "NT");
  EXPECT_EQ(qkv["m"], 1024);
  EXPECT_EQ(qkv["n"], 256 + 2 * 128);
  EXPECT_EQ(qkv["k"], 256);
  EXPECT_EQ(qkv["count"], 4);
  EXPECT_EQ(qkv["in_dtype"], "bf16");
  EXPECT_EQ(find("mlp.linear_fc1 forward")["n"], 2 * 768);  // gate and up
  const auto fc2w = find("mlp.linear_fc2 weight grad");
  EXPECT_EQ(fc2w["op"], "TN");
  EXPECT_EQ(fc2w["out_dtype"], "fp32");
  EXPECT_EQ(fc2w["accumulate"], true);
  const auto logits = find("output_layer forward");
  EXPECT_EQ(logits["n"], 2048);
  EXPECT_EQ(logits["count"], 1);
  EXPECT_EQ(logits["out_dtype"], "fp32");
  double flops = 0;
  for (const auto& x : g) flops += x["flops"].get<double>();
  EXPECT_DOUBLE_EQ(j["flops_per_microbatch"].get<double>(), flops);

  Result t = cli("gemm --shapes-from " + kTinyConfig + " --list --vocab-chunk 512");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_TRUE(has(t.out, "vocab chunk 512")) << t.out;
  EXPECT_TRUE(has(t.out, "self_attention.linear_qkv forward")) << t.out;
  EXPECT_TRUE(has(t.out, "output_layer weight grad")) << t.out;
}

TEST(BenchmarkAttentionCli, CpuForwardAndBackward) {
  Result r = cli("attention --batch 2 --seq 32 --heads 4 --kv-heads 2 --head-dim 8 --dtype fp32 --device cpu --warmup 1 "
                 "--iters 2 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["dtype"], "fp32");
  EXPECT_EQ(j["op"], "attention");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["causal"], true);
  EXPECT_EQ(j["kv_heads"], 2);
  for (const char* k : {"fwd_ms", "fwd_tflops", "bwd_ms", "bwd_tflops", "fwdbwd_ms", "fwdbwd_tflops"})
    EXPECT_GT(j[k].get<double>(), 0) << k;
  // 4*b*h*s*s*d, halved when causal; the backward 2.5x.
  const double fwd = 4.0 * 2 * 4 * 32 * 32 * 8 * 0.5;
  EXPECT_NEAR(j["fwd_tflops"].get<double>() * j["fwd_ms"].get<double>() * 1e9, fwd, 1e-3);
  EXPECT_NEAR(j["bwd_tflops"].get<double>() * j["bwd_ms"].get<double>() * 1e9, 2.5 * fwd, 1e-3);

  Result t = cli("attention --seq 16 --heads 2 --hidden 32 --dtype fp32 --device cpu --iters 1");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_TRUE(has(t.out, "heads 2 kv-heads 2 head-dim 16 on cpu")) << t.out;
  EXPECT_TRUE(has(t.out, "forward+backward")) << t.out;
}

TEST(BenchmarkAttentionCli, CpuBf16RunsOrSaysWhyNot) {
  // bf16, the default, runs the CPU bf16 backend's kernels and reports the share of the bf16 peak.
  Result r = cli("attention --batch 1 --seq 40 --heads 4 --kv-heads 2 --head-dim 64 --device cpu --warmup 1 --iters 2 "
                 "--json",
                 true);
  if (r.code != 0) {
    EXPECT_TRUE(has(r.out, "needs AVX512-BF16")) << r.out;
    return;
  }
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["dtype"], "bf16");
  for (const char* k : {"fwd_tflops", "bwd_tflops", "peak_tflops", "fwd_peak_share", "fwdbwd_peak_share"})
    EXPECT_GT(j[k].get<double>(), 0) << k;
}

TEST(BenchmarkAttentionCli, BadArgumentsAreErrors) {
  struct Bad {
    std::string args, says;
  };
  for (const Bad& b : std::vector<Bad>{
           {"attention --seq 16 --heads 4 --kv-heads 3 --head-dim 8 --device cpu", "not a multiple of --kv-heads 3"},
           {"attention --seq 16 --heads 3 --hidden 100 --device cpu", "--hidden 100 is not divisible by --heads 3"},
           {"attention --seq 16 --heads 4 --hidden 64 --head-dim 8 --device cpu", "disagrees"},
           {"attention --seq 0 --heads 4 --head-dim 8 --device cpu", "--seq must be positive"},
           {"attention --seq 16 --heads -2 --head-dim 8 --device cpu", "--heads must be positive"},
           {"attention --seq 16 --heads 4 --head-dim 8 --no-causal --device cpu", "non-causal"},
           {"attention --seq 16 --heads 4 --head-dim 8 --dtype fp16 --device cpu", "--dtype must be bf16 or fp32"},
       }) {
    Result r = cli(b.args, true);
    EXPECT_NE(r.code, 0) << b.args << "\n" << r.out;
    EXPECT_TRUE(has(r.out, b.says)) << b.args << " should say '" << b.says << "':\n" << r.out;
  }
}

TEST(BenchmarkAttentionCli, DeviceCudaWithoutGpuIsAClearError) {
  Result r = cli("attention --seq 16 --heads 2 --head-dim 64 --device cuda --iters 1", true);
  if (r.code == 0) GTEST_SKIP() << "this machine has a usable GPU";
  EXPECT_TRUE(has(r.out, "error: --device cuda:")) << r.out;
}

// `benchmark gemm --shapes-from X` lists exactly the GEMMs a profiled step of X runs: a dense, an
// MLA + MoE and a MoE config each trained for two steps with the second profiled, every "gemm"
// event of the trace (M, N, K and, for the experts' grouped GEMMs, the problems) against the
// list's GEMMs times the step's microbatches. A grouped call's problems are the experts that got
// rows: the MoE runs route by noise (moe_router_force_load_balancing), which leaves none empty,
// as the list's balanced routing does.
TEST(BenchmarkGemmCli, ListsExactlyTheGemmsOfAProfiledStep) {
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t>;
  for (const char* model : {"tiny_llama", "tiny_moe", "tiny_mixtral"}) {
    const std::string dir = testing::TempDir() + "/gemms_" + model;
    primus::test::run_command("rm -rf '" + dir + "' && mkdir -p '" + dir + "'");
    const std::string config = dir + "/exp.yaml";
    std::ofstream(config)
        << "exp_name: step\nworkspace: " << dir << "/ws\nmodules:\n  pre_trainer:\n    model: " << model
        << "\n    overrides:\n      micro_batch_size: 2\n      global_batch_size: 4\n"
           "      seq_length: 64\n      train_iters: 2\n      log_interval: 1\n      eval_interval: 0\n"
           "      save_interval: 0\n      mock_data: true\n      bf16: false\n      profile: true\n"
           "      profile_step_start: 1\n      profile_step_end: 2\n"
        << (std::string(model) == "tiny_llama" ? "" : "      moe_router_force_load_balancing: true\n");
    const auto train = primus::test::run_command("cd '" + dir + "' && OMP_NUM_THREADS=1 " +
                                                 std::string(PRIMUS_CLI_PATH) +
                                                 " direct --no-watch -- train pretrain --config '" + config + "' 2>&1");
    ASSERT_EQ(train.code, 0) << train.out;
    std::map<Key, int64_t> traced, listed;
    const auto trace = nlohmann::json::parse(std::ifstream(dir + "/ws/step/trace/rank-0.json"));
    for (const auto& e : trace["traceEvents"]) {
      if (!e.contains("args") || !e["args"].contains("op") || e["args"]["op"] != "gemm" ||
          e.value("cat", "") != "compute")
        continue;
      const auto& a = e["args"];
      ++traced[{a["M"].get<int64_t>(), a["N"].get<int64_t>(), a["K"].get<int64_t>(), a.value("groups", int64_t(0))}];
    }
    Result r = cli("gemm --shapes-from " + config + " --list --json");
    ASSERT_EQ(r.code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    const int64_t micro = j["microbatches_per_step"].get<int64_t>();
    for (const auto& g : j["gemms"])
      if (!g["grouped"].get<bool>())
        listed[{g["m"].get<int64_t>(), g["n"].get<int64_t>(), g["k"].get<int64_t>(), 0}] += micro *
                                                                                            g["count"].get<int64_t>();
    for (const auto& g : j["grouped_calls"])
      listed[{g["m"].get<int64_t>(), g["n"].get<int64_t>(), g["k"].get<int64_t>(), g["groups"].get<int64_t>()}] +=
          micro * g["count"].get<int64_t>();
    EXPECT_FALSE(traced.empty()) << model;
    EXPECT_EQ(listed, traced) << model;
    if (std::string(model) != "tiny_llama") {
      EXPECT_FALSE(j["grouped_calls"].empty()) << model;
    }
  }
}
