// gemm(): which implementation of gemm.h runs, and the measured bf16 GEMM peak.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/cpu_features.h"

namespace primus::cpu::bf16k {

namespace {

enum class Forced { None, Avx512, OneDnn };

Forced forced_impl() {
  static const Forced f = [] {
    const char* env = std::getenv("PRIMUS_CPU_GEMM");
    const std::string v = env ? env : "";
    if (v.empty() || v == "auto") return Forced::None;
    if (v == "avx512") return Forced::Avx512;
    if (v == "onednn") return Forced::OneDnn;
    fail("PRIMUS_CPU_GEMM='{}': expected auto, avx512 or onednn", v);
  }();
  return f;
}

}  // namespace

const char* gemm_impl_name(GemmImpl impl) { return impl == GemmImpl::OneDnn ? "onednn" : "avx512-bf16"; }

GemmImpl gemm_impl_for(const GemmArgs& g) {
  switch (forced_impl()) {
    case Forced::Avx512: return GemmImpl::Avx512;
    case Forced::OneDnn: return GemmImpl::OneDnn;
    case Forced::None: break;
  }
  (void)g;
  return cpu_features().amx_usable() ? GemmImpl::OneDnn : GemmImpl::Avx512;
}

void gemm(const GemmArgs& g) {
  // An empty inner dimension (an expert without rows, in a weight gradient) is D = beta C + bias,
  // which oneDNN 2.6 does not take (it stops on a division by zero).
  if (gemm_impl_for(g) == GemmImpl::OneDnn && g.K > 0)
    gemm_onednn(g);
  else
    gemm_avx512(g);
}

void gemm_grouped(const GemmArgs* g, int64_t count) {
  // This project's grouped kernel for every form, also the fp32-output weight gradients for
  // which gemm() picks oneDNN: with the row counts changing every step, oneDNN compiles a
  // primitive per expert and shape, and the grouped kernel was 1.2-1.7x faster than that loop
  // (`bench_grouped_gemm`, docs/moe.md). oneDNN where it has AMX, or where forced.
  const Forced f = forced_impl();
  if (f == Forced::Avx512 || (f == Forced::None && !cpu_features().amx_usable())) {
    gemm_avx512_grouped(g, count);
    return;
  }
  for (int64_t i = 0; i < count; ++i) gemm(g[i]);
}

double measure_bf16_gemm_peak_gflops(int n, int reps) {
  std::vector<uint16_t> a(size_t(n) * n, 0x3f80), b(size_t(n) * n, 0x3f00);  // 1.0 and 0.5
  std::vector<float> c(size_t(n) * n);
  GemmArgs g;
  g.M = g.N = g.K = n;
  g.A = a.data(), g.B = b.data(), g.lda = g.ldb = n;
  g.D = c.data(), g.f32_out = true;
  double best = 0;
  for (int r = 0; r < reps; ++r)
    for (auto run : {gemm_avx512, gemm_onednn}) {
      const auto t0 = std::chrono::steady_clock::now();
      run(g);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 2.0 * n * n * n / s / 1e9);
    }
  return best;
}

double bf16_gemm_peak_gflops() {
  static const double peak = [] {
    if (const char* env = std::getenv("PRIMUS_PEAK_BF16_GFLOPS"); env && std::atof(env) > 0) return std::atof(env);
    return measure_bf16_gemm_peak_gflops(1024, 4);
  }();
  return peak;
}

}  // namespace primus::cpu::bf16k
