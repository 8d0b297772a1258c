#include "kernels/cpu/ceiling.h"

#include <omp.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/cpu_features.h"

namespace primus::cpu {

namespace {

// A 3 x 3 grid of ymm FMA chains (latency 4, two ports: 8 in flight keep both busy), each row
// and each column with its own operand register: 15 of AVX2's 16 registers.
constexpr int kYmmRows = 3, kYmmCols = 3;

float fma_ymm_loop(long iters) {
  __m256 acc[kYmmRows][kYmmCols], a[kYmmRows], b[kYmmCols];
  for (int i = 0; i < kYmmRows; ++i) a[i] = _mm256_set1_ps(0.999f - 1e-4f * float(i));
  for (int v = 0; v < kYmmCols; ++v) b[v] = _mm256_set1_ps(1e-3f * float(v + 1));
  for (int i = 0; i < kYmmRows; ++i)
    for (int v = 0; v < kYmmCols; ++v) acc[i][v] = _mm256_setzero_ps();
  for (long it = 0; it < iters; ++it)
#pragma GCC unroll 3
    for (int i = 0; i < kYmmRows; ++i)
#pragma GCC unroll 3
      for (int v = 0; v < kYmmCols; ++v) acc[i][v] = _mm256_fmadd_ps(acc[i][v], a[i], b[v]);
  __m256 s = _mm256_setzero_ps();
  for (int i = 0; i < kYmmRows; ++i)
    for (int v = 0; v < kYmmCols; ++v) s = _mm256_add_ps(s, acc[i][v]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

template <class Loop>
double best_gflops(Loop loop, double flops_per_step, int reps, long iters, int threads) {
  double best = 0;
  float sum = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sum)
    sum += loop(iters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops_per_step * double(iters) * threads / s / 1e9);
  }
  volatile float sink = sum;  // the loops' results are used
  (void)sink;
  return best;
}

}  // namespace

std::string ceiling_instruction(bool bf16) {
  const CpuFeatures& f = cpu_features();
  return bf16 && f.avx512_bf16_usable() ? "vdpbf16ps zmm" : f.avx512() ? "vfmadd231ps zmm" : "vfmadd231ps ymm";
}

InstructionCeiling measure_instruction_ceiling(bool bf16, int reps, long iters) {
  InstructionCeiling c;
  c.threads = omp_get_max_threads();
  c.instruction = ceiling_instruction(bf16);
  if (c.instruction == "vdpbf16ps zmm")
    c.gflops = best_gflops(bf16k::dpbf16_zmm_loop, 64.0 * bf16k::ceiling_zmm_chains(), reps, iters, c.threads);
  else if (c.instruction == "vfmadd231ps zmm")
    c.gflops = best_gflops(bf16k::fma_zmm_loop, 32.0 * bf16k::ceiling_zmm_chains(), reps, iters, c.threads);
  else
    c.gflops = best_gflops(fma_ymm_loop, 16.0 * kYmmRows * kYmmCols, reps, iters, c.threads);
  return c;
}

const InstructionCeiling& instruction_ceiling(bool bf16) {
  static const auto get = [](bool b) {
    if (const char* env = std::getenv("PRIMUS_CEILING_GFLOPS"); env && std::atof(env) > 0)
      return InstructionCeiling{std::atof(env), "PRIMUS_CEILING_GFLOPS", omp_get_max_threads()};
    return measure_instruction_ceiling(b);
  };
  if (bf16) {  // each measured on first use only: a bf16 run does not time the fp32 loop
    static const InstructionCeiling b16 = get(true);
    return b16;
  }
  static const InstructionCeiling fp32 = get(false);
  return fp32;
}

}  // namespace primus::cpu
