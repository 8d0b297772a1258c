// benchmark attention: forward and backward time of self-attention at one shape.
//
//   primus-cli direct -- benchmark attention --seq 8192 --heads 32 --kv-heads 8 --head-dim 128 [--batch 1]
//                                            [--no-causal] [--dtype bf16|fp32] [--device auto|cpu|cuda]
//                                            [--documents N] [--warmup 3] [--iters 10] [--json]
//
// --documents N packs N equal documents into each sequence (attention within each document, the
// kernels' doc_start: kernels/cpu/attention.h) and times that beside, in the same run, causal
// attention over the whole sequence and the documents alone (batch x N sequences of seq / N: the
// same work without packing); its FLOPs count the documents' causal attention only.
// The layout is the models' fused qkv row per token (kernels/cpu/attention.h). On the GPU it runs
// this project's flash attention (cuda::flash_attention_forward/backward, bf16); on the CPU, causal
// only, the bf16 backend's kernels (--dtype bf16, the default: AVX512-BF16, with the share of the
// bf16 GEMM peak measured in the same run) or the fp32 tiled kernel (--dtype fp32,
// cpu::attention_forward/backward). FLOPs: 4*b*h*s*s*d
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
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/bf16/kernels.h"

#ifdef PRIMUS_HAVE_CUDA
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/runtime.h"
#endif

namespace primus::cli {
namespace benchmark_attention_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

using bench::BenchDevice;

struct Options {
  int64_t batch = 1, seq = 4096, heads = 32, kv_heads = 0, head_dim = 0, hidden = 0;
  int64_t documents = 1;  // equal documents packed into each sequence
  bool causal = true;
  std::string dtype = "bf16";
  bench::RunOptions run;
};

struct Times {
  double fwd_ms = 0, bwd_ms = 0;
  double causal_fwd_ms = 0, causal_bwd_ms = 0;  // --documents > 1: the whole sequence's causal attention
  double alone_fwd_ms = 0, alone_bwd_ms = 0;    // --documents > 1: the documents as sequences of their own
  std::string device_name;
  double peak_tflops = 0;  // CPU bf16: the bf16 GEMM peak measured in the same run
};

// Each row's document start for o.documents equal documents per sequence.
std::vector<int32_t> document_starts(const Options& o) {
  std::vector<int32_t> st(size_t(o.batch * o.seq));
  const int64_t len = o.seq / o.documents;
  for (int64_t r = 0; r < o.batch * o.seq; ++r) st[size_t(r)] = int32_t((r % o.seq) / len * len);
  return st;
}

Times run_cpu(const Options& o, int64_t groups, int64_t d) {
  if (!o.causal)
    fail("non-causal attention is not available on the CPU: cpu::attention_forward/backward implement causal "
         "(decoder) attention only; drop --no-causal or use --device cuda");
  cpu::AttentionShape s;
  s.batch = o.batch, s.seq = o.seq, s.heads = o.heads, s.groups = groups, s.head_dim = d;
  const size_t rows = size_t(o.batch * o.seq);
  const size_t qkv_n = rows * size_t(s.qkv_stride()), out_n = rows * size_t(o.heads * d);
  const Rng rng(7);
  Times t;
  t.device_name = bench::cpu_name();
  const std::vector<int32_t> starts = document_starts(o);
  const cpu::Documents packed{o.documents > 1 ? starts.data() : nullptr, 0};
  cpu::AttentionShape alone = s;  // the documents as sequences of their own: the same rows
  alone.batch = o.batch * o.documents, alone.seq = o.seq / o.documents;
  if (o.dtype == "bf16") {
    std::string why;
    if (!cpu::Bf16Backend::supported(&why))
      fail("bf16 attention on the CPU runs on the bf16 backend, which needs AVX512-BF16: {}. Use --dtype fp32 on "
           "this CPU",
           why);
    std::vector<uint16_t> qkv(qkv_n), out(out_n), dout(out_n), dqkv(qkv_n);
    std::vector<float> lse(size_t(o.batch * o.heads * o.seq));
    for (size_t i = 0; i < qkv_n; ++i) qkv[i] = bf16::from_float(float(rng.normal_at(i))).bits;
    for (size_t i = 0; i < out_n; ++i) dout[i] = bf16::from_float(float(rng.normal_at(qkv_n + i))).bits;
    auto time = [&](const cpu::AttentionShape& a, const cpu::Documents& docs, double& fwd_ms, double& bwd_ms) {
      fwd_ms = bench::cpu_time_ms([&] { cpu::bf16k::attention_forward(qkv.data(), out.data(), lse.data(), a, docs); },
                                  o.run.warmup, o.run.iters);
      bwd_ms = bench::cpu_time_ms(
          [&] { cpu::bf16k::attention_backward(qkv.data(), out.data(), lse.data(), dout.data(), dqkv.data(), a, docs); },
          o.run.warmup, o.run.iters);
    };
    time(s, packed, t.fwd_ms, t.bwd_ms);
    if (o.documents > 1) {
      time(s, {}, t.causal_fwd_ms, t.causal_bwd_ms);
      time(alone, {}, t.alone_fwd_ms, t.alone_bwd_ms);
    }
    t.peak_tflops = cpu::bf16k::measure_bf16_gemm_peak_gflops(2048, 4) / 1e3;
    return t;
  }
  std::vector<float> qkv(qkv_n), out(out_n), lse(size_t(o.batch * o.heads * o.seq)), dout(out.size()), dqkv(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(rng.normal_at(i));
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(rng.normal_at(qkv.size() + i));
  auto time = [&](const cpu::AttentionShape& a, const cpu::Documents& docs, double& fwd_ms, double& bwd_ms) {
    fwd_ms = bench::cpu_time_ms([&] { cpu::attention_forward<float>(qkv.data(), out.data(), lse.data(), a, docs); },
                                o.run.warmup, o.run.iters);
    bwd_ms = bench::cpu_time_ms(
        [&] { cpu::attention_backward<float>(qkv.data(), out.data(), lse.data(), dout.data(), dqkv.data(), a, docs); },
        o.run.warmup, o.run.iters);
  };
  time(s, packed, t.fwd_ms, t.bwd_ms);
  if (o.documents > 1) {
    time(s, {}, t.causal_fwd_ms, t.causal_bwd_ms);
    time(alone, {}, t.alone_fwd_ms, t.alone_bwd_ms);
  }
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
  const std::vector<int32_t> starts = document_starts(o);
  cuda::Scratch doc_start(starts.size() * sizeof(int32_t));
  cuda::copy_to_device(doc_start.get(), starts.data(), doc_start.bytes());
  auto time = [&](const cuda::AttentionDims& a, double& fwd_ms, double& bwd_ms) {
    fwd_ms = cuda::time_ms([&] { cuda::flash_attention_forward(q, y, l, a, o.causal, s); }, o.run.warmup, o.run.iters);
    PRIMUS_CUDA_CHECK_LAUNCH();
    bwd_ms = cuda::time_ms([&] { cuda::flash_attention_backward(q, y, l, dy, dq, a, o.causal, s); }, o.run.warmup,
                           o.run.iters);
    PRIMUS_CUDA_CHECK_LAUNCH();
  };
  cuda::AttentionDims packed = dims, alone = dims;
  if (o.documents > 1) packed.doc_start = doc_start.as<int32_t>();
  alone.batch = o.batch * o.documents, alone.seq = o.seq / o.documents;
  time(packed, t.fwd_ms, t.bwd_ms);
  if (o.documents > 1) {
    time(dims, t.causal_fwd_ms, t.causal_bwd_ms);
    time(alone, t.alone_fwd_ms, t.alone_bwd_ms);
  }
  cuda::synchronize();
  return t;
}
#endif

int run(Options o) {
  if (o.batch <= 0) fail("--batch must be positive, got {}", o.batch);
  if (o.dtype != "bf16" && o.dtype != "fp32") fail("--dtype must be bf16 or fp32, got '{}'", o.dtype);
  if (o.seq <= 0) fail("--seq must be positive, got {}", o.seq);
  if (o.heads <= 0) fail("--heads must be positive, got {}", o.heads);
  o.run.check();
  if (o.kv_heads < 0) fail("--kv-heads must be positive, got {}", o.kv_heads);
  const int64_t groups = o.kv_heads ? o.kv_heads : o.heads;
  if (o.heads % groups)
    fail("--heads {} is not a multiple of --kv-heads {}: each key/value head serves heads / kv-heads query heads",
         o.heads, groups);
  if (o.hidden < 0) fail("--hidden must be positive, got {}", o.hidden);
  if (o.documents < 1 || o.seq % o.documents != 0)
    fail("--documents {} must be positive and divide --seq {} (equal documents per sequence)", o.documents, o.seq);
  if (o.documents > 1 && !o.causal) fail("--documents packs causal documents: drop --no-causal");
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
  if (cuda && o.dtype != "bf16") fail("--device cuda: flash attention on the GPU is bf16 (--dtype bf16)");
  // Packed: the documents' causal attention, documents times that of one document's length.
  const double fwd = double(o.documents) *
                     bench::attention_forward_flops(o.batch, o.seq / o.documents, o.heads, groups, d, o.causal);
  const double bwd = bench::kAttentionBackwardFactor * fwd;
  const double both_ms = t.fwd_ms + t.bwd_ms;
  auto share = [&](double flops, double ms) { return t.peak_tflops > 0 ? bench::tflops(flops, ms) / t.peak_tflops : 0.0; };
  if (o.run.json) {
    nlohmann::ordered_json j = {{"op", "attention"},
                                {"device", cuda ? "cuda" : "cpu"},
                                {"device_name", t.device_name},
                                {"dtype", o.dtype},
                                {"batch", o.batch},
                                {"seq", o.seq},
                                {"heads", o.heads},
                                {"kv_heads", groups},
                                {"head_dim", d},
                                {"causal", o.causal},
                                {"documents", o.documents},
                                {"fwd_ms", t.fwd_ms},
                                {"fwd_tflops", bench::tflops(fwd, t.fwd_ms)},
                                {"bwd_ms", t.bwd_ms},
                                {"bwd_tflops", bench::tflops(bwd, t.bwd_ms)},
                                {"fwdbwd_ms", both_ms},
                                {"fwdbwd_tflops", bench::tflops(fwd + bwd, both_ms)}};
    if (o.documents > 1) {
      j["causal_fwd_ms"] = t.causal_fwd_ms;
      j["causal_bwd_ms"] = t.causal_bwd_ms;
      j["alone_fwd_ms"] = t.alone_fwd_ms;
      j["alone_bwd_ms"] = t.alone_bwd_ms;
    }
    if (t.peak_tflops > 0) {
      j["peak_tflops"] = t.peak_tflops;
      j["fwd_peak_share"] = share(fwd, t.fwd_ms);
      j["bwd_peak_share"] = share(bwd, t.bwd_ms);
      j["fwdbwd_peak_share"] = share(fwd + bwd, both_ms);
    }
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::cout << fmt::format("attention {} {} batch {} seq {} heads {} kv-heads {} head-dim {}{} on {} ({})\n",
                           o.dtype, o.causal ? "causal" : "full", o.batch, o.seq, o.heads, groups, d,
                           o.documents > 1 ? fmt::format(", {} documents of {} per sequence", o.documents,
                                                         o.seq / o.documents)
                                           : std::string(),
                           cuda ? "cuda" : "cpu", t.device_name);
  auto line = [&](const char* what, double flops, double ms) {
    std::cout << fmt::format("  {:<17} {:>10.4f} ms {:>10.4g} TFLOP/s{}\n", what, ms, bench::tflops(flops, ms),
                             t.peak_tflops > 0 ? fmt::format(" {:>5.0f}% of the bf16 GEMM peak", 100 * share(flops, ms))
                                               : std::string());
  };
  line("forward", fwd, t.fwd_ms);
  line("backward", bwd, t.bwd_ms);
  line("forward+backward", fwd + bwd, both_ms);
  if (o.documents > 1) {
    std::cout << fmt::format("  causal attention over the whole sequence, same run: forward {:.4f} ms, backward "
                             "{:.4f} ms; packed takes {:.1f}% and {:.1f}% of it\n",
                             t.causal_fwd_ms, t.causal_bwd_ms, 100 * t.fwd_ms / t.causal_fwd_ms,
                             100 * t.bwd_ms / t.causal_bwd_ms);
    std::cout << fmt::format("  the documents alone ({} sequences of {}), same run: forward {:.4f} ms, backward "
                             "{:.4f} ms\n",
                             o.batch * o.documents, o.seq / o.documents, t.alone_fwd_ms, t.alone_bwd_ms);
  }
  if (t.peak_tflops > 0)
    std::cout << fmt::format("  bf16 GEMM peak {:.4g} TFLOP/s (2048^3 best of 4, measured now)\n", t.peak_tflops);
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
       app.add_option("--documents", o->documents,
                      "equal documents packed into each sequence, attention within each; > 1 also times causal "
                      "attention over the whole sequence in the same run")
           ->capture_default_str();
       app.add_option("--dtype", o->dtype, "bf16 (CPU: the bf16 backend's kernels) or fp32 (CPU only)")
           ->capture_default_str();
       o->run.add_to(app);
       return [o] { return run(*o); };
     }}};

}  // namespace
}  // namespace primus::cli
