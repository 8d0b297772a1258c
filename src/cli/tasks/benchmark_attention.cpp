// benchmark attention: forward and backward time of self-attention at one shape.
//
//   primus-cli direct -- benchmark attention --seq 8192 --heads 32 --kv-heads 8 --head-dim 128 [--batch 1]
//                                            [--no-causal] [--device auto|cpu|cuda] [--warmup 3] [--iters 10] [--json]
//
// The layout is the models' fused qkv row per token (kernels/cpu/attention.h). On the GPU it runs
// this project's flash attention (cuda::flash_attention_forward/backward, bf16); on the CPU the
// fp32 tiled kernel (cpu::attention_forward/backward), which is causal only. FLOPs: 4*b*h*s*s*d
// forward, halved when causal; the backward counts 2.5x the forward; the same convention as the
// PyTorch peer (benchmarks/cuda/attention_peer.py).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/registry.h"
#include "cli/tasks/bench_common.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/attention.h"

#ifdef PRIMUS_HAVE_CUDA
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/runtime.h"
#endif

namespace primus::cli {
namespace {

using bench::BenchDevice;

struct Options {
  int64_t batch = 1, seq = 4096, heads = 32, kv_heads = 0, head_dim = 0, hidden = 0;
  bool causal = true;
  bench::RunOptions run;
};

struct Times {
  double fwd_ms = 0, bwd_ms = 0;
  std::string device_name;
};

Times run_cpu(const Options& o, int64_t groups, int64_t d) {
  if (!o.causal)
    fail("non-causal attention is not available on the CPU: cpu::attention_forward/backward implement causal "
         "(decoder) attention only; drop --no-causal or use --device cuda");
  cpu::AttentionShape s;
  s.batch = o.batch, s.seq = o.seq, s.heads = o.heads, s.groups = groups, s.head_dim = d;
  const size_t rows = size_t(o.batch * o.seq);
  std::vector<float> qkv(rows * size_t(s.qkv_stride())), out(rows * size_t(o.heads * d)),
      lse(size_t(o.batch * o.heads * o.seq)), dout(out.size()), dqkv(qkv.size());
  const Rng rng(7);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(rng.normal_at(i));
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(rng.normal_at(qkv.size() + i));
  Times t;
  t.device_name = bench::cpu_name();
  t.fwd_ms = bench::cpu_time_ms([&] { cpu::attention_forward<float>(qkv.data(), out.data(), lse.data(), s); },
                                o.run.warmup, o.run.iters);
  t.bwd_ms = bench::cpu_time_ms(
      [&] { cpu::attention_backward<float>(qkv.data(), out.data(), lse.data(), dout.data(), dqkv.data(), s); },
      o.run.warmup, o.run.iters);
  return t;
}

#ifdef PRIMUS_HAVE_CUDA
Times run_cuda(const Options& o, int64_t groups, int64_t d) {
  Times t;
  t.device_name = bench::init_cuda();
  cuda::AttentionDims dims;
  dims.batch = o.batch, dims.seq = o.seq, dims.heads = o.heads, dims.groups = groups, dims.head_dim = d;
  if (std::string why = cuda::flash_attention_unsupported(dims); !why.empty())
    fail("flash attention on the GPU cannot run this shape: {}", why);
  const size_t rows = size_t(o.batch * o.seq);
  const size_t qkv_n = rows * size_t(dims.qkv_stride()), out_n = rows * size_t(o.heads * d);
  cuda::Scratch qkv(qkv_n * 2), out(out_n * 2), dout(out_n * 2), dqkv(qkv_n * 2),
      lse(size_t(o.batch * o.heads * o.seq) * sizeof(float));
  bench::fill_device_random(qkv.get(), qkv.bytes(), true, 1);
  bench::fill_device_random(dout.get(), dout.bytes(), true, 2);
  auto* q = qkv.as<__nv_bfloat16>();
  auto* y = out.as<__nv_bfloat16>();
  auto* dy = dout.as<__nv_bfloat16>();
  auto* dq = dqkv.as<__nv_bfloat16>();
  float* l = lse.as<float>();
  cudaStream_t s = cuda::stream();
  t.fwd_ms = cuda::time_ms([&] { cuda::flash_attention_forward(q, y, l, dims, o.causal, s); }, o.run.warmup,
                           o.run.iters);
  PRIMUS_CUDA_CHECK_LAUNCH();
  t.bwd_ms = cuda::time_ms([&] { cuda::flash_attention_backward(q, y, l, dy, dq, dims, o.causal, s); },
                           o.run.warmup, o.run.iters);
  PRIMUS_CUDA_CHECK_LAUNCH();
  cuda::synchronize();
  return t;
}
#endif

int run(Options o) {
  if (o.batch <= 0) fail("--batch must be positive, got {}", o.batch);
  if (o.seq <= 0) fail("--seq must be positive, got {}", o.seq);
  if (o.heads <= 0) fail("--heads must be positive, got {}", o.heads);
  o.run.check();
  if (o.kv_heads < 0) fail("--kv-heads must be positive, got {}", o.kv_heads);
  const int64_t groups = o.kv_heads ? o.kv_heads : o.heads;
  if (o.heads % groups)
    fail("--heads {} is not a multiple of --kv-heads {}: each key/value head serves heads / kv-heads query heads",
         o.heads, groups);
  if (o.hidden < 0) fail("--hidden must be positive, got {}", o.hidden);
  if (o.head_dim < 0) fail("--head-dim must be positive, got {}", o.head_dim);
  if (o.hidden) {
    if (o.hidden % o.heads) fail("--hidden {} is not divisible by --heads {}: no whole head dimension", o.hidden, o.heads);
    if (o.head_dim && o.head_dim != o.hidden / o.heads)
      fail("--head-dim {} disagrees with --hidden {} / --heads {} = {}", o.head_dim, o.hidden, o.heads,
           o.hidden / o.heads);
    o.head_dim = o.hidden / o.heads;
  }
  if (!o.head_dim) o.head_dim = 128;
  const int64_t d = o.head_dim;

  const BenchDevice dev = bench::resolve_device(o.run.device);
  Times t;
#ifdef PRIMUS_HAVE_CUDA
  t = dev == BenchDevice::CUDA ? run_cuda(o, groups, d) : run_cpu(o, groups, d);
#else
  t = run_cpu(o, groups, d);
#endif
  const bool cuda = dev == BenchDevice::CUDA;
  const double fwd = bench::attention_forward_flops(o.batch, o.seq, o.heads, groups, d, o.causal);
  const double bwd = bench::kAttentionBackwardFactor * fwd;
  const double both_ms = t.fwd_ms + t.bwd_ms;
  if (o.run.json) {
    nlohmann::ordered_json j = {{"op", "attention"},
                                {"device", cuda ? "cuda" : "cpu"},
                                {"device_name", t.device_name},
                                {"dtype", cuda ? "bf16" : "fp32"},
                                {"batch", o.batch},
                                {"seq", o.seq},
                                {"heads", o.heads},
                                {"kv_heads", groups},
                                {"head_dim", d},
                                {"causal", o.causal},
                                {"fwd_ms", t.fwd_ms},
                                {"fwd_tflops", bench::tflops(fwd, t.fwd_ms)},
                                {"bwd_ms", t.bwd_ms},
                                {"bwd_tflops", bench::tflops(bwd, t.bwd_ms)},
                                {"fwdbwd_ms", both_ms},
                                {"fwdbwd_tflops", bench::tflops(fwd + bwd, both_ms)}};
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::cout << fmt::format("attention {} {} batch {} seq {} heads {} kv-heads {} head-dim {} on {} ({})\n",
                           cuda ? "bf16" : "fp32", o.causal ? "causal" : "full", o.batch, o.seq, o.heads, groups, d,
                           cuda ? "cuda" : "cpu", t.device_name);
  std::cout << fmt::format("  forward           {:>10.4f} ms {:>10.4g} TFLOP/s\n", t.fwd_ms, bench::tflops(fwd, t.fwd_ms));
  std::cout << fmt::format("  backward          {:>10.4f} ms {:>10.4g} TFLOP/s\n", t.bwd_ms, bench::tflops(bwd, t.bwd_ms));
  std::cout << fmt::format("  forward+backward  {:>10.4f} ms {:>10.4g} TFLOP/s\n", both_ms,
                           bench::tflops(fwd + bwd, both_ms));
  return 0;
}

TaskRegistrar reg{
    {"benchmark", "attention", "self-attention forward and backward time and TFLOP/s (CPU or GPU flash attention)",
     [](CLI::App& app) -> TaskAction {
       auto o = std::make_shared<Options>();
       app.add_option("--batch", o->batch, "sequences")->capture_default_str();
       app.add_option("--seq", o->seq, "tokens per sequence")->capture_default_str();
       app.add_option("--heads", o->heads, "query heads")->capture_default_str();
       app.add_option("--kv-heads", o->kv_heads, "key/value heads (query groups; default: --heads, no GQA)");
       app.add_option("--head-dim", o->head_dim, "dimension of a head (default: --hidden / --heads, else 128)");
       app.add_option("--hidden", o->hidden, "model width: head dim = hidden / heads (instead of --head-dim)");
       app.add_flag("--causal,!--no-causal", o->causal, "causal (decoder) masking; on by default");
       o->run.add_to(app);
       return [o] { return run(*o); };
     }}};

}  // namespace
}  // namespace primus::cli
