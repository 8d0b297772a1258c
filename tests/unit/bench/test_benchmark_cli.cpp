// `primus-cli direct -- benchmark gemm | attention` end to end on the CPU: tiny shapes give positive
// TFLOP/s, the GEMM list of an experiment config, and bad arguments (or a GPU that is not there)
// fail with a message naming the problem and a non-zero exit.
#include <gtest/gtest.h>

#include <string>

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

TEST(BenchmarkGemmCli, CpuCompareTimesBothOnAModelsGemms) {
  Result r = cli("gemm --shapes-from " + kTinyConfig + " --compare --device cpu --iters 1", true);
  if (r.code != 0) {
    EXPECT_TRUE(has(r.out, "needs AVX512-BF16")) << r.out;
    return;
  }
  for (const char* part : {"layer qkv forward", "head weight grad", "avx512-bf16 everywhere", "onednn everywhere",
                           "the backend's choice", "the faster of the two"})
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
           {"gemm -M 8 -N 8 -K 8 --dtype fp16 --device cpu", "--dtype must be bf16 or fp32"},
           {"gemm -M 8 -N 8 -K 8 --out-dtype fp16 --device cpu", "--out-dtype must be bf16 or fp32"},
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
  // tiny_llama: 4 layers, hidden 256, ffn 768, 8 heads / 4 groups (head dim 32), vocab 2048;
  // micro batch 8 x seq 128 = 1024 rows; the logits fit, so one vocabulary chunk.
  Result r = cli("gemm --shapes-from " + kTinyConfig + " --list --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model"], "tiny_llama");
  EXPECT_EQ(j["rows"], 1024);
  EXPECT_EQ(j["vocab_chunk"], 2048);
  const auto& g = j["gemms"];
  ASSERT_EQ(g.size(), 15u);
  EXPECT_EQ(g[0]["what"], "layer qkv forward");
  EXPECT_EQ(g[0]["op"], "NT");
  EXPECT_EQ(g[0]["m"], 1024);
  EXPECT_EQ(g[0]["n"], 256 + 2 * 128);
  EXPECT_EQ(g[0]["k"], 256);
  EXPECT_EQ(g[0]["count"], 4);
  EXPECT_EQ(g[2]["n"], 2 * 768);  // fc1 forward: gate and up
  EXPECT_EQ(g[8]["op"], "TN");    // fc2 weight grad
  EXPECT_EQ(g[8]["out_dtype"], "fp32");
  EXPECT_EQ(g[8]["accumulate"], true);
  EXPECT_EQ(g[12]["what"], "head logits");
  EXPECT_EQ(g[12]["n"], 2048);
  EXPECT_EQ(g[12]["count"], 1);
  double flops = 0;
  for (const auto& x : g) flops += x["flops"].get<double>();
  EXPECT_DOUBLE_EQ(j["flops_per_microbatch"].get<double>(), flops);

  Result t = cli("gemm --shapes-from " + kTinyConfig + " --list --vocab-chunk 512");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_TRUE(has(t.out, "vocab chunk 512")) << t.out;
  EXPECT_TRUE(has(t.out, "layer qkv forward")) << t.out;
  EXPECT_TRUE(has(t.out, "head weight grad")) << t.out;
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
