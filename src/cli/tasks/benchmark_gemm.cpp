// benchmark gemm: the throughput of one GEMM shape, or the tuning of every GEMM of a model.
//
//   primus-cli direct -- benchmark gemm -M 4096 -N 4096 -K 4096 [--dtype bf16|fp32|fp8] [--trans-a] [--trans-b]
//                                       [--recipe delayed|tensorwise|blockwise|mxfp8]   (fp8)
//                                       [--device auto|cpu|cuda] [--warmup 3] [--iters 10] [--json]
//   primus-cli direct -- benchmark gemm --shapes-from <experiment.yaml> --list      (any machine)
//   primus-cli direct -- benchmark gemm --shapes-from <experiment.yaml> --tune [--output gemm_cache.json]
//                                       [--max-candidates 16]                          (GPU)
//   primus-cli direct -- benchmark gemm --shapes-from <experiment.yaml> --compare --device cpu  (CPU bf16)
//
// One shape: D[M,N] = op(A) op(B), TFLOP/s = 2*M*N*K / time. On the CPU, fp32 goes through OpenBLAS
// (cpu::gemm) and bf16 through the bf16 backend's two GEMMs (kernels/cpu/bf16/gemm.h: this
// project's AVX512-BF16 kernels and oneDNN, AMX where the CPU has it), timed side by side, with the
// one the backend runs for this problem and the share of the bf16 GEMM peak measured in the same
// run (bf16 out by default, --out-dtype fp32 for fp32 out). On the GPU (cuda::gemm, bf16 in and
// out or fp32), cuBLASLt's heuristic candidates are timed first, then the GEMM runs with the
// fastest: the report shows the heuristic's first choice beside the best candidate.
//
// --dtype fp8 runs the GEMM the way the model's FP8 linears do, through the op set
// (Backend::quantize_fp8 of both operands along K, then Backend::gemm_fp8; run_fp8_shape below),
// beside the bf16 GEMM of the same operands, with both results' error against fp32.
//
// --shapes-from lists the GEMMs that one microbatch of the config's model runs on one
// tensor-parallel rank, through every pipeline stage (plan/gemm_list.h): the real model walked on
// the shape-only backend, so the list is what a profiled step runs, in the config's precision
// (--tune and --compare: in bf16), with its layout, recompute and the head's vocabulary chunks as
// the model chooses them (--vocab-chunk forces chunks of that width). --tune times the candidates
// of each distinct problem and writes the winners to a cache file that training reads
// (gemm_tuning_cache). --compare times the CPU's two bf16 GEMMs on each distinct problem: the
// measurement behind the backend's choice between them.
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/registry.h"
#include "cli/tasks/bench_common.h"
#include "config/choices.h"
#include "config/experiment.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/ceiling.h"
#include "kernels/cpu/gemm.h"
#include "model/linears.h"
#include "model/llama.h"
#include "plan/gemm_list.h"
#include "plan/model_options.h"
#include "plan/parallel_layout.h"

#ifdef PRIMUS_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/runtime.h"
#endif

namespace primus::cli {
namespace benchmark_gemm_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

using bench::BenchDevice;

struct Options {
  int64_t m = 4096, n = 4096, k = 4096;
  std::string dtype = "bf16";
  std::string out_dtype;  // CPU bf16: bf16 (default) or fp32
  std::string recipe;     // fp8: empty is tensorwise
  bool trans_a = false, trans_b = false;
  bench::RunOptions run;
  // model shapes
  std::string shapes_from;
  bool list = false, tune = false, compare = false;
  std::string output = "gemm_cache.json";
  bool output_given = false;
  int max_candidates = 16;
  int64_t vocab_chunk = 0;  // 0: as the mixed model chooses
};

using plan::op_name;

// --recipe: the config's names (config/choices.h); only with --dtype fp8.
Fp8Recipe fp8_recipe(const Options& o) {
  if (o.recipe.empty()) return Fp8Recipe::Tensorwise;
  const std::optional<Fp8Recipe> r = config::find_choice<Fp8Recipe>(o.recipe);
  if (!r) fail("--recipe must be one of {}, got '{}'", config::choice_list<Fp8Recipe>(), o.recipe);
  return *r;
}

void check_common(const Options& o) {
  o.run.check();
  if (o.max_candidates < 1) fail("--max-candidates must be at least 1, got {}", o.max_candidates);
  if (o.dtype != "bf16" && o.dtype != "fp32" && o.dtype != "fp8")
    fail("--dtype must be bf16, fp32 or fp8, got '{}'", o.dtype);
  if (!o.recipe.empty() && o.dtype != "fp8") fail("--recipe {} needs --dtype fp8 (got --dtype {})", o.recipe, o.dtype);
  if (o.dtype == "fp8") {
    fp8_recipe(o);
    if (!o.out_dtype.empty())
      fail("--out-dtype is for --dtype bf16: an FP8 GEMM writes bf16, as the model's linears do");
    if (!o.shapes_from.empty()) fail("--dtype fp8 times one shape: drop --shapes-from");
  }
  if (!o.out_dtype.empty() && o.out_dtype != "bf16" && o.out_dtype != "fp32")
    fail("--out-dtype must be bf16 or fp32, got '{}'", o.out_dtype);
  if (o.dtype == "fp32" && o.out_dtype == "bf16") fail("--out-dtype bf16 needs --dtype bf16");
}

// ---- one shape ----

// CPU bf16: one implementation's mean time.
struct CpuImplTime {
  cpu::bf16k::GemmImpl impl;
  double ms = 0;
};

struct ShapeResult {
  double ms = 0;
  std::string device_name;
  // CPU bf16: both implementations, the one the backend runs, the measured bf16 GEMM peak
  std::vector<CpuImplTime> cpu_impls;
  cpu::bf16k::GemmImpl backend_impl = cpu::bf16k::GemmImpl::Avx512;
  double peak_tflops = 0;
  cpu::InstructionCeiling ceiling;  // CPU bf16: the vdpbf16ps register loop, measured in the same run
  // GPU only: the tuning that chose the algorithm
  bool tuned = false;
  double heuristic_ms = 0, best_ms = 0;
  int candidates = 0, best_index = -1;
  std::string best_algo, heuristic_algo;
};

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  const Rng rng(seed);
  for (size_t i = 0; i < n; ++i) v[i] = float(2.0 * ((rng.at(i) >> 11) * 0x1.0p-53) - 1.0);
  return v;
}

// bf16 on the CPU: the bf16 backend's two GEMMs (kernels/cpu/bf16/gemm.h), timed side by side in
// alternation, against the machine's bf16 GEMM peak measured in the same run.
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  const std::vector<float> f = random_floats(n, seed);
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = bf16::from_float(f[i]).bits;
  return b;
}

void require_cpu_bf16() {
  std::string why;
  if (!cpu::Bf16Backend::supported(&why))
    fail("bf16 GEMMs on the CPU run on the bf16 backend, which needs AVX512-BF16: {}. Use --dtype fp32 on this CPU, "
         "or --device cuda on a GPU machine",
         why);
}

// Mean ms of each implementation on one problem: `iters` runs each after `warmup`, the two
// interleaved round by round so that both see the same machine.
std::vector<CpuImplTime> time_cpu_bf16(const cpu::bf16k::GemmArgs& g, int warmup, int iters) {
  std::vector<CpuImplTime> t{{cpu::bf16k::GemmImpl::Avx512}, {cpu::bf16k::GemmImpl::OneDnn}};
  auto run = [&](cpu::bf16k::GemmImpl impl) {
    impl == cpu::bf16k::GemmImpl::OneDnn ? cpu::bf16k::gemm_onednn(g) : cpu::bf16k::gemm_avx512(g);
  };
  for (int i = 0; i < warmup; ++i)
    for (const auto& x : t) run(x.impl);
  std::vector<double> total(t.size(), 0.0);
  for (int i = 0; i < iters; ++i)
    for (size_t k = 0; k < t.size(); ++k) total[k] += bench::cpu_time_ms([&] { run(t[k].impl); }, 0, 1);
  for (size_t k = 0; k < t.size(); ++k) t[k].ms = total[k] / iters;
  return t;
}

ShapeResult run_cpu_shape(const Options& o) {
  ShapeResult r;
  r.device_name = bench::cpu_name();
  const int64_t M = o.m, N = o.n, K = o.k;
  const int64_t lda = o.trans_a ? M : K, ldb = o.trans_b ? K : N;
  if (o.dtype == "fp32") {
    std::vector<float> A = random_floats(size_t(M * K), 1), B = random_floats(size_t(K * N), 2), C(size_t(M * N));
    r.ms = bench::cpu_time_ms(
        [&] { cpu::gemm<float>(o.trans_a, o.trans_b, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), N); },
        o.run.warmup, o.run.iters);
    return r;
  }
  require_cpu_bf16();
  const std::vector<uint16_t> A = random_bf16(size_t(M * K), 1), B = random_bf16(size_t(K * N), 2);
  const bool f32_out = o.out_dtype == "fp32";
  std::vector<uint16_t> D16(f32_out ? 0 : size_t(M * N));
  std::vector<float> D32(f32_out ? size_t(M * N) : 0);
  cpu::bf16k::GemmArgs g;
  g.trans_a = o.trans_a, g.trans_b = o.trans_b, g.M = M, g.N = N, g.K = K;
  g.A = A.data(), g.lda = lda, g.B = B.data(), g.ldb = ldb;
  g.D = f32_out ? static_cast<void*>(D32.data()) : static_cast<void*>(D16.data());
  g.f32_out = f32_out;
  r.cpu_impls = time_cpu_bf16(g, o.run.warmup, o.run.iters);
  r.backend_impl = cpu::bf16k::gemm_impl_for(g);
  for (const auto& x : r.cpu_impls)
    if (x.impl == r.backend_impl) r.ms = x.ms;
  r.peak_tflops = cpu::bf16k::measure_bf16_gemm_peak_gflops(2048, 4) / 1e3;
  r.ceiling = cpu::measure_instruction_ceiling(true);
  return r;
}

#ifdef PRIMUS_HAVE_CUDA
cuda::GemmProblem cuda_problem(const Options& o) {
  cuda::GemmProblem p;
  p.trans_a = o.trans_a;
  p.trans_b = o.trans_b;
  p.m = o.m, p.n = o.n, p.k = o.k;
  p.ab = p.cd = o.dtype == "bf16" ? cuda::GemmType::BF16 : cuda::GemmType::F32;
  return cuda::normalized(p);
}

ShapeResult run_cuda_shape(const Options& o) {
  ShapeResult r;
  r.device_name = bench::init_cuda();
  const cuda::GemmProblem p = cuda_problem(o);
  const cuda::GemmTuneResult t = cuda::tune_gemm(p, o.max_candidates, o.run.warmup, o.run.iters);
  r.tuned = true;
  r.heuristic_ms = t.heuristic_ms;
  r.best_ms = t.best_ms;
  r.candidates = int(t.candidates.size());
  r.best_index = t.candidates[size_t(t.best)].index;
  r.best_algo = t.candidates[size_t(t.best)].algo;
  r.heuristic_algo = t.candidates.front().algo;
  // The GEMM as training runs it: cuda::gemm on real buffers, with the algorithm just tuned.
  const size_t es = o.dtype == "bf16" ? 2 : 4;
  const bool bf = o.dtype == "bf16";
  cuda::Scratch A(size_t(p.m * p.k) * es), B(size_t(p.k * p.n) * es), D(size_t(p.m * p.n) * es);
  bench::fill_device_random(A.get(), A.bytes(), bf, 1);
  bench::fill_device_random(B.get(), B.bytes(), bf, 2);
  r.ms = cuda::time_ms([&] { cuda::gemm(p, 1.0f, A.get(), B.get(), 0.0f, nullptr, D.get(), nullptr); },
                       o.run.warmup, o.run.iters);
  cuda::synchronize();
  if (o.output_given) {
    cuda::save_gemm_cache(o.output);
    std::cerr << fmt::format("tuned algorithm saved to {}\n", o.output);
  }
  return r;
}
#endif

// ---- one shape in FP8 ----
//
// D = op(A) op(B) as the model's FP8 linears run a GEMM (model/linears.cpp): each bf16 operand
// quantized along K by Backend::quantize_fp8 (E4M3 both), then Backend::gemm_fp8 with the
// operands' Fp8Operand and alpha = the product of the inverse tensor scales. A plays the
// activation, B the weight: the granularity is Linears::granularity's for x and W (tensor for
// delayed and tensorwise, 1 x 128 tiles for A and 128 x 128 blocks for B under blockwise, 1 x 32
// MX blocks under mxfp8). Delayed: the scale the first (current-scaling) quantization found is
// then given to every timed one, as a delayed scale whose history holds that amax. Beside it, the
// bf16 GEMM of the same operands on the same backend, and both results' relative (Frobenius)
// error against the fp32 GEMM of the unquantized (bf16) operands.

struct Fp8Result {
  std::string device_name, backend_name;
  double gemm_ms = 0, quantize_ms = 0, bf16_ms = 0;
  double err_fp8 = 0, err_bf16 = 0;
};

template <class Fn>
double time_on(bool cuda, Fn&& fn, int warmup, int iters) {
#ifdef PRIMUS_HAVE_CUDA
  if (cuda) return cuda::time_ms(fn, warmup, iters);
#endif
  (void)cuda;
  return bench::cpu_time_ms(fn, warmup, iters);
}

// The operands of one shape on a backend (bf16, the values the bf16 GEMM multiplies too), their
// quantized copies, the two results, and the fp32 reference on the host.
class Fp8Gemm {
 public:
  Fp8Gemm(ops::Backend& be, const Options& o) : be_(be), o_(o), recipe_(fp8_recipe(o)) {
    const std::vector<uint16_t> a = random_bf16(size_t(o.m * o.k), 1), b = random_bf16(size_t(o.k * o.n), 2);
    A_ = upload(a, o.trans_a ? Shape{o.k, o.m} : Shape{o.m, o.k});
    B_ = upload(b, o.trans_b ? Shape{o.n, o.k} : Shape{o.k, o.n});
    QA_ = be.empty(A_.shape(), DType::BF16);
    QB_ = be.empty(B_.shape(), DType::BF16);
    D8_ = be.empty({o.m, o.n}, DType::BF16);
    D16_ = be.empty({o.m, o.n}, DType::BF16);
    reference_ = reference(a, b);
    if (recipe_ == Fp8Recipe::Delayed) {  // the first call's current scales, given from then on
      quantize();
      scale_a_ = 1.0f / inv_a_, scale_b_ = 1.0f / inv_b_;
    }
  }
  // Both operands, along K: op(A) [M, K] reduces over A's columns unless A is stored [K, M];
  // op(B) [K, N] over B's rows unless B is stored [N, K].
  void quantize() {
    const ops::Backend::Fp8Quantized qa = be_.quantize_fp8(A_, kFormat, fp8_granularity(recipe_, false), !o_.trans_a,
                                                           scale_a_, QA_);
    const ops::Backend::Fp8Quantized qb = be_.quantize_fp8(B_, kFormat, fp8_granularity(recipe_, true), o_.trans_b,
                                                           scale_b_, QB_);
    inv_a_ = 1.0f / qa.scale, inv_b_ = 1.0f / qb.scale;
    pair_ = {{kFormat, fp8_granularity(recipe_, false), qa.block_scales},
             {kFormat, fp8_granularity(recipe_, true), qb.block_scales}};
  }
  void gemm_fp8() { be_.gemm_fp8(pair_, o_.trans_a, o_.trans_b, inv_a_ * inv_b_, QA_, QB_, 0.0f, {}, D8_, {}); }
  void gemm_bf16() { be_.gemm(o_.trans_a, o_.trans_b, 1.0f, A_, B_, 0.0f, {}, D16_, {}); }
  double error_fp8() const { return error(D8_); }
  double error_bf16() const { return error(D16_); }

 private:
  static constexpr fp8::Format kFormat = fp8::Format::E4M3;
  Tensor upload(const std::vector<uint16_t>& v, const Shape& shape) const {
    Tensor h = Tensor::empty(shape, DType::BF16);
    std::memcpy(h.raw(), v.data(), v.size() * sizeof(uint16_t));
    return h.to(be_.device());
  }
  std::vector<float> reference(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) const {
    std::vector<float> fa(a.size()), fb(b.size()), d(size_t(o_.m * o_.n));
    for (size_t i = 0; i < a.size(); ++i) fa[i] = bf16_bits_to_float(a[i]);
    for (size_t i = 0; i < b.size(); ++i) fb[i] = bf16_bits_to_float(b[i]);
    cpu::gemm<float>(o_.trans_a, o_.trans_b, o_.m, o_.n, o_.k, 1.0f, fa.data(), o_.trans_a ? o_.m : o_.k, fb.data(),
                     o_.trans_b ? o_.k : o_.n, 0.0f, d.data(), o_.n);
    return d;
  }
  double error(const Tensor& D) const {
    const Tensor h = D.to(Device::CPU);
    const bf16* d = h.data<bf16>();
    double num = 0, den = 0;
    for (size_t i = 0; i < reference_.size(); ++i) {
      const double e = double(d[i].to_float()) - double(reference_[i]);
      num += e * e, den += double(reference_[i]) * double(reference_[i]);
    }
    return den > 0 ? std::sqrt(num / den) : 0.0;
  }

  ops::Backend& be_;
  const Options& o_;
  Fp8Recipe recipe_;
  Tensor A_, B_, QA_, QB_, D8_, D16_;
  std::vector<float> reference_;
  float scale_a_ = 0, scale_b_ = 0;  // 0: current scaling; delayed: the first call's
  float inv_a_ = 1, inv_b_ = 1;
  ops::Backend::Fp8Pair pair_;
};

// The backend the shape runs on: the GPU's, or the CPU's bf16 backend (its FP8 GEMM the exact
// emulation through its bf16 GEMM, docs/fp8.md).
std::unique_ptr<ops::Backend> fp8_backend(BenchDevice dev, std::string& device_name) {
#ifdef PRIMUS_HAVE_CUDA
  if (dev == BenchDevice::CUDA) {
    device_name = bench::init_cuda();
    int n = 0;
    PRIMUS_CUDA_CHECK(cudaGetDeviceCount(&n));
    return std::make_unique<cuda::CudaBackend>(discover_launch_env().local_rank % std::max(n, 1));
  }
#endif
  (void)dev;
  require_cpu_bf16();
  device_name = bench::cpu_name();
  return std::make_unique<cpu::Bf16Backend>();
}

Fp8Result run_fp8(const Options& o, BenchDevice dev) {
  Fp8Result r;
  const std::unique_ptr<ops::Backend> be = fp8_backend(dev, r.device_name);
  r.backend_name = be->name();
  const bool cuda = dev == BenchDevice::CUDA;
  Fp8Gemm g(*be, o);
  r.quantize_ms = time_on(
      cuda, [&] { g.quantize(); }, o.run.warmup, o.run.iters);
  r.gemm_ms = time_on(
      cuda, [&] { g.gemm_fp8(); }, o.run.warmup, o.run.iters);
  r.bf16_ms = time_on(
      cuda, [&] { g.gemm_bf16(); }, o.run.warmup, o.run.iters);
  be->synchronize();
  r.err_fp8 = g.error_fp8();
  r.err_bf16 = g.error_bf16();
  return r;
}

int run_fp8_shape(const Options& o, BenchDevice dev) {
  const Fp8Result r = run_fp8(o, dev);
  const bool cuda = dev == BenchDevice::CUDA;
  const double flops = 2.0 * double(o.m) * double(o.n) * double(o.k), total = r.gemm_ms + r.quantize_ms;
  const char* recipe = fp8_recipe_name(fp8_recipe(o));
  const char* how = cuda ? "cuBLASLt's FP8 GEMM where it takes the problem (else the bf16 GEMM, said once in the log)"
                         : "exact emulation through the bf16 GEMM (docs/fp8.md)";
  if (o.run.json) {
    const nlohmann::ordered_json j = {{"op", "gemm"},
                                      {"device", cuda ? "cuda" : "cpu"},
                                      {"device_name", r.device_name},
                                      {"backend", r.backend_name},
                                      {"dtype", "fp8"},
                                      {"recipe", recipe},
                                      {"format", "e4m3"},
                                      {"emulated", !cuda},
                                      {"trans_a", o.trans_a},
                                      {"trans_b", o.trans_b},
                                      {"m", o.m},
                                      {"n", o.n},
                                      {"k", o.k},
                                      {"ms", r.gemm_ms},
                                      {"tflops", bench::tflops(flops, r.gemm_ms)},
                                      {"quantize_ms", r.quantize_ms},
                                      {"total_ms", total},
                                      {"total_tflops", bench::tflops(flops, total)},
                                      {"bf16_ms", r.bf16_ms},
                                      {"bf16_tflops", bench::tflops(flops, r.bf16_ms)},
                                      {"speedup_vs_bf16", r.gemm_ms > 0 ? r.bf16_ms / r.gemm_ms : 0.0},
                                      {"rel_error", r.err_fp8},
                                      {"bf16_rel_error", r.err_bf16}};
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::cout << fmt::format("gemm fp8 {} (E4M3 x E4M3) {} m={} n={} k={} on {} ({}, {}): {}\n", recipe,
                           op_name(o.trans_a, o.trans_b), o.m, o.n, o.k, cuda ? "cuda" : "cpu", r.device_name,
                           r.backend_name, how);
  std::cout << fmt::format("  gemm_fp8 {:.4f} ms, {:.4g} TFLOP/s; quantization {:.4f} ms per call (A and B); total "
                           "{:.4f} ms, {:.4g} TFLOP/s\n",
                           r.gemm_ms, bench::tflops(flops, r.gemm_ms), r.quantize_ms, total,
                           bench::tflops(flops, total));
  std::cout << fmt::format(
      "  bf16 GEMM {:.4f} ms, {:.4g} TFLOP/s: fp8 x{:.3f} (GEMM alone), x{:.3f} (with quantization)\n", r.bf16_ms,
      bench::tflops(flops, r.bf16_ms), r.gemm_ms > 0 ? r.bf16_ms / r.gemm_ms : 0.0,
      total > 0 ? r.bf16_ms / total : 0.0);
  std::cout << fmt::format("  relative error against fp32 of the unquantized operands: fp8 {:.3e}, bf16 {:.3e}\n",
                           r.err_fp8, r.err_bf16);
  return 0;
}

int run_shape(const Options& o) {
  if (o.m <= 0) fail("-M must be positive, got {}", o.m);
  if (o.n <= 0) fail("-N must be positive, got {}", o.n);
  if (o.k <= 0) fail("-K must be positive, got {}", o.k);
  if (o.tune) fail("--tune times the GEMMs of a model: give --shapes-from <experiment config> (one shape is always "
                   "tuned on the GPU; --output saves it)");
  const BenchDevice dev = bench::resolve_device(o.run.device);
  if (o.dtype == "fp8") return run_fp8_shape(o, dev);
  ShapeResult r;
#ifdef PRIMUS_HAVE_CUDA
  if (dev == BenchDevice::CUDA) r = run_cuda_shape(o);
  else r = run_cpu_shape(o);
#else
  (void)dev;
  r = run_cpu_shape(o);
#endif
  const bool cuda = dev == BenchDevice::CUDA;
  const double flops = 2.0 * double(o.m) * double(o.n) * double(o.k);
  const std::string out_dtype = cuda || o.out_dtype.empty() ? o.dtype : o.out_dtype;
  auto share = [&](double ms) { return r.peak_tflops > 0 ? bench::tflops(flops, ms) / r.peak_tflops : 0.0; };
  auto ceiling_share = [&](double ms) {
    return r.ceiling.gflops > 0 ? bench::tflops(flops, ms) * 1e3 / r.ceiling.gflops : 0.0;
  };
  if (o.run.json) {
    nlohmann::ordered_json j = {{"op", "gemm"},
                                {"device", cuda ? "cuda" : "cpu"},
                                {"device_name", r.device_name},
                                {"dtype", o.dtype},
                                {"out_dtype", out_dtype},
                                {"trans_a", o.trans_a},
                                {"trans_b", o.trans_b},
                                {"m", o.m},
                                {"n", o.n},
                                {"k", o.k},
                                {"ms", r.ms},
                                {"tflops", bench::tflops(flops, r.ms)}};
    if (!r.cpu_impls.empty()) {
      j["impl"] = cpu::bf16k::gemm_impl_name(r.backend_impl);
      j["peak_tflops"] = r.peak_tflops;
      j["peak_share"] = share(r.ms);
      j["ceiling_instruction"] = r.ceiling.instruction;
      j["ceiling_tflops"] = r.ceiling.gflops / 1e3;
      j["ceiling_share"] = ceiling_share(r.ms);
      for (const auto& x : r.cpu_impls)
        j["impls"].push_back({{"impl", cpu::bf16k::gemm_impl_name(x.impl)},
                              {"ms", x.ms},
                              {"tflops", bench::tflops(flops, x.ms)},
                              {"peak_share", share(x.ms)},
                              {"ceiling_share", ceiling_share(x.ms)}});
    }
    if (r.tuned) {
      j["heuristic_ms"] = r.heuristic_ms;
      j["heuristic_tflops"] = bench::tflops(flops, r.heuristic_ms);
      j["best_ms"] = r.best_ms;
      j["best_tflops"] = bench::tflops(flops, r.best_ms);
      j["best_candidate"] = r.best_index;
      j["candidates"] = r.candidates;
      j["best_algo"] = r.best_algo;
      j["heuristic_algo"] = r.heuristic_algo;
    }
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::cout << fmt::format("gemm {}{} {} m={} n={} k={} on {} ({}): {:.4f} ms, {:.4g} TFLOP/s\n", o.dtype,
                           out_dtype != o.dtype ? ">" + out_dtype : "", op_name(o.trans_a, o.trans_b), o.m, o.n, o.k,
                           cuda ? "cuda" : "cpu", r.device_name, r.ms, bench::tflops(flops, r.ms));
  if (!r.cpu_impls.empty()) {
    std::cout << fmt::format("  the bf16 backend runs {}; {:.0f}% of the machine's bf16 GEMM peak ({:.4g} TFLOP/s, "
                             "2048^3 best of 4, measured now)\n",
                             cpu::bf16k::gemm_impl_name(r.backend_impl), 100 * share(r.ms), r.peak_tflops);
    std::cout << fmt::format("  {:.0f}% of the instruction ceiling ({} on {} threads: {:.4g} TFLOP/s, measured now)\n",
                             100 * ceiling_share(r.ms), r.ceiling.instruction, r.ceiling.threads,
                             r.ceiling.gflops / 1e3);
    for (const auto& x : r.cpu_impls)
      std::cout << fmt::format("  {:<12} {:>10.4f} ms {:>10.4g} TFLOP/s {:>5.0f}% of peak {:>5.0f}% of ceiling\n",
                               cpu::bf16k::gemm_impl_name(x.impl), x.ms, bench::tflops(flops, x.ms), 100 * share(x.ms),
                               100 * ceiling_share(x.ms));
  }
  if (r.tuned)
    std::cout << fmt::format(
        "  cuBLASLt heuristic's choice {:.4f} ms ({:.4g} TFLOP/s); best of {} candidates: #{} {:.4f} ms ({:.4g} "
        "TFLOP/s, x{:.3f})\n  best: {}\n",
        r.heuristic_ms, bench::tflops(flops, r.heuristic_ms), r.candidates, r.best_index, r.best_ms,
        bench::tflops(flops, r.best_ms), r.best_ms > 0 ? r.heuristic_ms / r.best_ms : 0.0, r.best_algo);
  return 0;
}

// ---- the GEMMs of a model ----

struct ModelGemms {
  std::string model;
  int64_t micro_batch = 0, seq = 0, rows = 0, microbatches = 1;
  int64_t vocab_chunk = 0;  // the output layer's logits GEMM's width
  bool recompute = false;
  std::vector<plan::GemmEntry> gemms, grouped;
};

// bf16: the GEMMs in bf16 mixed precision whatever the config says (tuning and --compare).
ModelGemms model_gemms(const Options& o, bool bf16) {
  const config::ExperimentConfig cfg = config::load_experiment(o.shapes_from);
  const ModelSpec& spec = cfg.model_spec;
  config::TrainingArgs a = cfg.train;
  if (bf16) a.bf16 = true;
  if (o.vocab_chunk < 0) fail("--vocab-chunk must be positive, got {}", o.vocab_chunk);
  LlamaOptions options = plan::model_options(a);  // the trainer's
  if (o.vocab_chunk > 0) {  // the head in chunks of that width, whether or not its logits would fit
    options.vocab_chunk = o.vocab_chunk;
    options.logits_memory_budget = 0;
  }
  // One data-parallel replica of the model-parallel ranks (and the expert-parallel ones).
  const int64_t world = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size *
                        std::max<int64_t>(a.expert_model_parallel_size, 1);
  const plan::ParallelLayout layout = plan::plan_layout(a, spec, int(world));
  const plan::GemmList list = plan::model_gemms(spec, layout, a, &options);
  ModelGemms g;
  g.model = spec.name;
  g.micro_batch = list.micro_batch;
  g.seq = list.seq;
  g.rows = list.rows;
  g.microbatches = list.microbatches;
  for (const auto& e : list.gemms)  // the head's chunk: its logits GEMM (the output layer, or the tied embedding)
    if (g.vocab_chunk == 0 && e.trans_b && !e.trans_a &&
        (e.what.starts_with("output_layer ") || e.what.starts_with("embedding.word_embeddings ")))
      g.vocab_chunk = e.n;
  g.recompute = list.recompute;
  g.gemms = list.gemms;
  g.grouped = list.grouped;
  return g;
}

struct Distinct {
  plan::GemmEntry g;               // the first GEMM with this problem
  std::vector<std::string> whats;  // every GEMM with it
  int64_t count = 0;               // runs per microbatch, all of them
};

// GEMMs with the same problem (same key) merged, in first-seen order.
std::vector<Distinct> distinct_gemms(const std::vector<plan::GemmEntry>& gemms) {
  std::vector<Distinct> out;
  std::map<std::string, size_t> index;
  for (const auto& g : gemms) {
    const std::string key = fmt::format("{}{}:{}:{}:{}:{}:{}:{}:{}", g.trans_a, g.trans_b, g.m, g.n, g.k,
                                        plan::types_name(g), plan::fp8_operands_name(g), g.bias, g.accumulate);
    auto [it, fresh] = index.emplace(key, out.size());
    if (fresh) out.push_back({g, {}, 0});
    out[it->second].whats.push_back(g.what);
    out[it->second].count += g.count;
  }
  return out;
}

bool f32_out(const plan::GemmEntry& g) { return g.out == DType::F32; }

int run_list(const Options& o, const ModelGemms& mg) {
  const std::vector<Distinct> d = distinct_gemms(mg.gemms);
  double total = 0;
  for (const auto& g : mg.gemms) total += g.flops();
  auto entry = [](const plan::GemmEntry& g) {
    nlohmann::ordered_json e = {{"what", g.what},
                                {"op", op_name(g.trans_a, g.trans_b)},
                                {"m", g.m},
                                {"n", g.n},
                                {"k", g.k},
                                {"in_dtype", dtype_name(g.in)},
                                {"out_dtype", dtype_name(g.out)},
                                {"bias", g.bias},
                                {"accumulate", g.accumulate},
                                {"grouped", g.grouped},
                                {"count", g.count},
                                {"flops", g.flops()}};
    if (g.groups > 0) e["groups"] = g.groups;
    if (g.fp8)
      e["fp8_scaling"] = fp8::granularity_name(g.fp8->coarsest()), e["fp8_operands"] = plan::fp8_operands_name(g);
    return e;
  };
  if (o.run.json) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array(), grouped = nlohmann::ordered_json::array();
    for (const auto& g : mg.gemms) list.push_back(entry(g));
    for (const auto& g : mg.grouped) grouped.push_back(entry(g));
    nlohmann::ordered_json j = {{"model", mg.model},
                                {"micro_batch_size", mg.micro_batch},
                                {"seq_length", mg.seq},
                                {"rows", mg.rows},
                                {"microbatches_per_step", mg.microbatches},
                                {"vocab_chunk", mg.vocab_chunk},
                                {"recompute_forward", mg.recompute},
                                {"distinct", d.size()},
                                {"flops_per_microbatch", total},
                                {"gemms", list},
                                {"grouped_calls", grouped}};
    std::cout << j.dump(2) << std::endl;
    return 0;
  }
  std::cout << fmt::format("GEMMs of one microbatch of {} (micro batch {}, seq {}: N = {} rows; vocab chunk {}{}): "
                           "{} GEMMs, {} distinct problems, {:.4g} TFLOP per microbatch, {} microbatches per step\n",
                           mg.model, mg.micro_batch, mg.seq, mg.rows, mg.vocab_chunk,
                           mg.recompute ? "; full recompute" : "", mg.gemms.size(), d.size(), total / 1e12,
                           mg.microbatches);
  std::cout << fmt::format("  {:<48} {:>2} {:<10} {:<6} {:>8} {:>8} {:>8} {:>6} {:>12}\n", "what", "op", "types", "",
                           "m", "n", "k", "runs", "GFLOP/run");
  for (const auto& g : mg.gemms)
    std::cout << fmt::format("  {:<48} {:>2} {:<10} {:<6} {:>8} {:>8} {:>8} {:>6} {:>12.3f}\n", g.what,
                             op_name(g.trans_a, g.trans_b), plan::types_name(g), plan::extras_name(g), g.m, g.n, g.k,
                             g.count, 2.0 * double(g.m) * double(g.n) * double(g.k) / 1e9);
  return 0;
}

// --compare: both CPU bf16 implementations on every distinct GEMM of the model, side by side,
// and what the bf16 backend's choice (gemm_impl_for) costs against the faster of the two. An FP8
// GEMM (fp8>bf16) is the same bf16 GEMM on the CPU: the exact emulation multiplies its quantized
// operands as bf16 values (docs/fp8.md); their quantization is not in these times.
int run_compare_cpu(const Options& o, const ModelGemms& mg) {
  require_cpu_bf16();
  const std::vector<Distinct> d = distinct_gemms(mg.gemms);
  const double peak = cpu::bf16k::measure_bf16_gemm_peak_gflops(2048, 4) / 1e3;
  (o.run.json ? std::cerr : std::cout) << fmt::format(
      "{} distinct GEMMs of {} (micro batch {}, seq {}: N = {}; vocab chunk {}) on the CPU ({}), both bf16 "
      "implementations interleaved, {} runs each; bf16 GEMM peak {:.4g} TFLOP/s (2048^3, measured now)\n",
      d.size(), mg.model, mg.micro_batch, mg.seq, mg.rows, mg.vocab_chunk, bench::cpu_name(), o.run.iters, peak);
  if (!o.run.json)
    std::cout << fmt::format("  {:<36} {:>2} {:<10} {:<6} {:>6} {:>6} {:>6} {:>5} {:>11} {:>11} {:>7}  {}\n", "what", "op",
                             "types", "", "m", "n", "k", "runs", "avx512 TF/s", "onednn TF/s", "faster", "backend");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  double t_own = 0, t_dnnl = 0, t_backend = 0, t_best = 0, flops_total = 0;
  uint64_t seed = 1;
  for (const auto& x : d) {
    const plan::GemmEntry& lg = x.g;
    const int64_t M = lg.m, N = lg.n, K = lg.k;
    const std::vector<uint16_t> A = random_bf16(size_t(M * K), seed++), B = random_bf16(size_t(K * N), seed++),
                                bias = random_bf16(size_t(N), seed++);
    std::vector<uint16_t> D16(f32_out(lg) ? 0 : size_t(M * N));
    std::vector<float> D32(f32_out(lg) ? size_t(M * N) : 0);
    cpu::bf16k::GemmArgs g;
    g.trans_a = lg.trans_a, g.trans_b = lg.trans_b, g.M = M, g.N = N, g.K = K;
    g.A = A.data(), g.lda = lg.trans_a ? M : K, g.B = B.data(), g.ldb = lg.trans_b ? K : N;
    g.D = f32_out(lg) ? static_cast<void*>(D32.data()) : static_cast<void*>(D16.data());
    g.f32_out = f32_out(lg);
    g.beta = lg.accumulate ? 1.0f : 0.0f;
    g.C = lg.accumulate ? g.D : nullptr;
    g.bias = lg.bias ? bias.data() : nullptr;
    const std::vector<CpuImplTime> t = time_cpu_bf16(g, 1, o.run.iters);
    const double flops = 2.0 * double(M) * double(N) * double(K);
    const cpu::bf16k::GemmImpl chosen = cpu::bf16k::gemm_impl_for(g);
    const double own = t[0].ms, dnnl = t[1].ms, backend = chosen == cpu::bf16k::GemmImpl::OneDnn ? dnnl : own;
    const double n = double(x.count);
    t_own += own * n, t_dnnl += dnnl * n, t_backend += backend * n, t_best += std::min(own, dnnl) * n;
    flops_total += flops * n;
    const char* faster = own <= dnnl ? "avx512-bf16" : "onednn";
    if (o.run.json) {
      rows.push_back({{"what", x.whats.front()},
                      {"op", op_name(lg.trans_a, lg.trans_b)},
                      {"m", M},
                      {"n", N},
                      {"k", K},
                      {"out_dtype", dtype_name(lg.out)},
                      {"count", x.count},
                      {"avx512_ms", own},
                      {"onednn_ms", dnnl},
                      {"faster", faster},
                      {"backend", cpu::bf16k::gemm_impl_name(chosen)}});
    } else {
      std::cout << fmt::format(
          "  {:<36} {:>2} {:<10} {:<6} {:>6} {:>6} {:>6} {:>5} {:>11.3f} {:>11.3f} {:>7.2f}x {}\n", x.whats.front(),
          op_name(lg.trans_a, lg.trans_b), plan::types_name(lg), plan::extras_name(lg), M, N, K, x.count,
          bench::tflops(flops, own), bench::tflops(flops, dnnl), std::max(own, dnnl) / std::min(own, dnnl),
          std::string(cpu::bf16k::gemm_impl_name(chosen)) + (backend > std::min(own, dnnl) ? " (slower)" : ""));
    }
  }
  if (o.run.json) {
    nlohmann::ordered_json j = {{"model", mg.model},       {"peak_tflops", peak},
                                {"avx512_ms", t_own},      {"onednn_ms", t_dnnl},
                                {"backend_ms", t_backend}, {"best_ms", t_best},
                                {"flops", flops_total},    {"gemms", rows}};
    std::cout << j.dump(2) << std::endl;
    return 0;
  }
  auto line = [&](const char* what, double ms) {
    std::cout << fmt::format("  {:<28} {:>9.2f} ms per microbatch  {:>7.3f} TFLOP/s  {:>4.0f}% of peak\n", what, ms,
                             bench::tflops(flops_total, ms), 100 * bench::tflops(flops_total, ms) / peak);
  };
  line("avx512-bf16 everywhere", t_own);
  line("onednn everywhere", t_dnnl);
  line("the backend's choice", t_backend);
  line("the faster of the two", t_best);
  return 0;
}

#ifdef PRIMUS_HAVE_CUDA
cuda::GemmProblem problem_of(const plan::GemmEntry& g) {
  cuda::GemmProblem p;
  p.trans_a = g.trans_a;
  p.trans_b = g.trans_b;
  p.m = g.m, p.n = g.n, p.k = g.k;
  p.ab = cuda::GemmType::BF16;
  p.cd = f32_out(g) ? cuda::GemmType::F32 : cuda::GemmType::BF16;
  p.bias = g.bias;
  p.accumulate = g.accumulate;
  return cuda::normalized(p);
}

// An FP8 GEMM's problem as the CUDA backend runs it: cuBLASLt's FP8 problem, or, where cuBLASLt
// refuses the pair on this GPU, the bf16 GEMM of the emulation (gemm.h: fp8_gemm_refusal).
cuda::GemmProblem fp8_problem_of(const plan::GemmEntry& g, std::string& runs) {
  const cuda::GemmProblem bf16 = problem_of(g);
  const auto& [fa, fb] = *g.fp8;
  if (const char* why = cuda::fp8_gemm_refusal(fa, fb, bf16.m, bf16.n)) {
    runs = fmt::format("the exact emulation's bf16 GEMM: {}", why);
    return bf16;
  }
  runs = "cuBLASLt's FP8 GEMM";
  return cuda::normalized(cuda::fp8_gemm_problem(bf16, fa, fb));
}

int run_tune(const Options& o, const ModelGemms& mg) {
  const std::string device_name = bench::init_cuda();
  const std::vector<Distinct> d = distinct_gemms(mg.gemms);
  (o.run.json ? std::cerr : std::cout) << fmt::format(
      "tuning {} distinct GEMMs of {} (micro batch {}, seq {}: N = {}; vocab chunk {}) on {}, up to {} cuBLASLt "
      "candidates each\n",
      d.size(), mg.model, mg.micro_batch, mg.seq, mg.rows, mg.vocab_chunk, device_name, o.max_candidates);
  if (!o.run.json)
    std::cout << fmt::format("  {:<36} {:>2} {:<10} {:<6} {:>8} {:>8} {:>8} {:>5} {:>10} {:>10} {:>8} {:>9}\n", "what",
                             "op", "types", "", "m", "n", "k", "cands", "heur ms", "best ms", "speed-up", "TFLOP/s");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  double heur_total = 0, best_total = 0, flops_total = 0;
  for (const auto& x : d) {
    std::string runs;
    const cuda::GemmProblem p = x.g.fp8 ? fp8_problem_of(x.g, runs) : problem_of(x.g);
    const cuda::GemmTuneResult r = cuda::tune_gemm(p, o.max_candidates, o.run.warmup, o.run.iters);
    const double flops = 2.0 * double(x.g.m) * double(x.g.n) * double(x.g.k);  // an FP8 p's k is padded
    heur_total += r.heuristic_ms * double(x.count);
    best_total += r.best_ms * double(x.count);
    flops_total += flops * double(x.count);
    std::string whats;
    for (size_t i = 0; i < x.whats.size(); ++i) whats += (i ? ", " : "") + x.whats[i];
    if (o.run.json) {
      rows.push_back({{"what", whats},
                      {"key", r.key},
                      {"m", p.m},
                      {"n", p.n},
                      {"k", p.k},
                      {"count", x.count},
                      {"candidates", r.candidates.size()},
                      {"heuristic_ms", r.heuristic_ms},
                      {"best_ms", r.best_ms},
                      {"best_candidate", r.candidates[size_t(r.best)].index},
                      {"best_algo", r.candidates[size_t(r.best)].algo},
                      {"tflops", bench::tflops(flops, r.best_ms)}});
      if (x.g.fp8) rows.back()["fp8_runs"] = runs;
    } else {
      std::cout << fmt::format("  {:<36} {:>2} {:<10} {:<6} {:>8} {:>8} {:>8} {:>5} {:>10.4f} {:>10.4f} {:>7.3f}x "
                               "{:>9.1f}\n",
                               x.whats.front(), op_name(p.trans_a, p.trans_b), plan::types_name(x.g),
                               plan::extras_name(x.g), p.m, p.n, p.k, r.candidates.size(), r.heuristic_ms, r.best_ms,
                               r.best_ms > 0 ? r.heuristic_ms / r.best_ms : 0.0, bench::tflops(flops, r.best_ms));
      for (size_t i = 1; i < x.whats.size(); ++i) std::cout << fmt::format("    (also {})\n", x.whats[i]);
      if (x.g.fp8) std::cout << fmt::format("    ({}: {})\n", plan::fp8_operands_name(x.g), runs);
    }
  }
  cuda::save_gemm_cache(o.output);
  if (o.run.json) {
    nlohmann::ordered_json j = {{"model", mg.model},
                                {"device_name", device_name},
                                {"output", o.output},
                                {"heuristic_ms_per_microbatch", heur_total},
                                {"best_ms_per_microbatch", best_total},
                                {"flops_per_microbatch", flops_total},
                                {"gemms", rows}};
    std::cout << j.dump(2) << std::endl;
    return 0;
  }
  std::cout << fmt::format("GEMM time per microbatch: heuristic {:.2f} ms ({:.1f} TFLOP/s), tuned {:.2f} ms ({:.1f} "
                           "TFLOP/s), x{:.3f}\n",
                           heur_total, bench::tflops(flops_total, heur_total), best_total,
                           bench::tflops(flops_total, best_total), best_total > 0 ? heur_total / best_total : 0.0);
  std::cout << fmt::format("saved {} entries to {} (training reads it with gemm_tuning_cache: {})\n",
                           cuda::gemm_cache_size(), o.output, o.output);
  return 0;
}
#endif

int run(const Options& o) {
  check_common(o);
  if (o.shapes_from.empty()) {
    if (o.list) fail("--list lists the GEMMs of a model: give --shapes-from <experiment config>");
    if (o.compare) fail("--compare times the GEMMs of a model: give --shapes-from <experiment config>");
    return run_shape(o);
  }
  if (int(o.list) + int(o.tune) + int(o.compare) > 1) fail("--list, --tune and --compare: choose one");
  if (o.compare) {
    if (o.dtype != "bf16") fail("--compare times the CPU's bf16 GEMMs: --dtype must be bf16");
    if (bench::resolve_device(o.run.device) != BenchDevice::CPU)
      fail("--compare times the CPU's two bf16 GEMMs: add --device cpu");
    return run_compare_cpu(o, model_gemms(o, true));
  }
  if (!o.list && !o.tune)
    fail("--shapes-from {}: add --list (print the model's GEMMs), --tune (time them on the GPU and save the "
         "fastest algorithms) or --compare (time the CPU's two bf16 GEMMs on them)",
         o.shapes_from);
  if (o.list) return run_list(o, model_gemms(o, false));
  if (o.dtype != "bf16") fail("--tune --shapes-from tunes the bf16 mixed-precision model's GEMMs: --dtype must be bf16");
  if (o.run.device == "cpu") fail("--tune times cuBLASLt's algorithms: it needs the GPU, not --device cpu");
#ifdef PRIMUS_HAVE_CUDA
  if (!cuda::available()) fail("--tune needs a GPU: {}", cuda::unavailable_reason());
  return run_tune(o, model_gemms(o, true));
#else
  fail("--tune needs a GPU, and this primus-cli was built without the CUDA backend (no nvcc at build time)");
#endif
}

TaskRegistrar reg{
    {"benchmark", "gemm", "GEMM throughput of one shape (CPU or GPU), or the GEMMs of a model listed or tuned",
     [](CLI::App& app) -> TaskAction {
       auto o = std::make_shared<Options>();
       app.add_option("-M", o->m, "rows of D and op(A)")->capture_default_str();
       app.add_option("-N", o->n, "columns of D and op(B)")->capture_default_str();
       app.add_option("-K", o->k, "the inner dimension")->capture_default_str();
       app.add_option("--dtype", o->dtype, "bf16 or fp32 (in and out), or fp8 (quantized operands, bf16 out)")
           ->capture_default_str();
       app.add_option("--recipe", o->recipe, "--dtype fp8: delayed, tensorwise (default), blockwise or mxfp8");
       app.add_option("--out-dtype", o->out_dtype, "CPU, bf16 inputs: bf16 (default) or fp32 outputs");
       app.add_flag("--trans-a", o->trans_a, "A is stored [K, M] (op(A) = A^T)");
       app.add_flag("--trans-b", o->trans_b, "B is stored [N, K] (op(B) = B^T), as a linear layer's weight");
       o->run.add_to(app);
       app.add_option("--shapes-from", o->shapes_from, "an experiment config: its model's GEMMs (with --list or --tune)");
       app.add_flag("--list", o->list, "with --shapes-from: print the GEMMs, no timing (any machine)");
       app.add_flag("--tune", o->tune, "with --shapes-from: time cuBLASLt's candidates for each GEMM (GPU) and save the fastest");
       app.add_flag("--compare", o->compare,
                    "with --shapes-from and --device cpu: time both CPU bf16 GEMMs (avx512-bf16, onednn) on each GEMM");
       app.add_option("--output", o->output, "the tuning cache file to write")->capture_default_str()->each([o](const std::string&) {
         o->output_given = true;
       });
       app.add_option("--max-candidates", o->max_candidates, "cuBLASLt heuristic candidates timed per GEMM")
           ->capture_default_str();
       app.add_option("--vocab-chunk", o->vocab_chunk,
                      "with --shapes-from: the head's vocabulary chunk (default: as the bf16 model chooses)");
       return [o] { return run(*o); };
     }}};

}  // namespace
}  // namespace primus::cli
