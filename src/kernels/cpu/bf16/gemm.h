// bf16 GEMMs on the CPU, the bf16 backend's matrix products:
//   D[M,N] = alpha * op(A) op(B) + beta * C (+ bias[n] on every row)
// A, B row-major bf16 (op = transpose when trans_*); C and D row-major with N columns, both fp32
// or both bf16 (C may be D; C is not read when beta == 0); bias bf16 [N] or null. Products and
// sums run in fp32 and a bf16 D is rounded once, as the reference backend defines.
//
// Two implementations of the same contract, timed side by side by `benchmark gemm --device cpu`:
//   gemm_avx512   this project's kernels: AVX512-BF16 dot products (vdpbf16ps) on packed panels;
//   gemm_onednn   oneDNN's matmul (Debian's libdnnl), which uses AMX tiles where the CPU has them.
// Both need a CPU with AVX512-BF16 (cpu_features.h); gemm() picks one per problem.
#pragma once

#include <cstdint>

namespace primus::cpu::bf16k {

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  const uint16_t* A = nullptr;
  int64_t lda = 0;
  const uint16_t* B = nullptr;
  int64_t ldb = 0;
  const void* C = nullptr;  // fp32 or bf16 like D, leading dimension N
  void* D = nullptr;
  bool f32_out = false;           // C and D fp32 (else bf16)
  const uint16_t* bias = nullptr;  // bf16 [N]
};

void gemm_avx512(const GemmArgs& g);
// gemm_avx512 in slabs of K, one after another, each adding into D, where the operand that every
// outer tile reads again (B with row tiles outer, A with column tiles outer) is more than two
// slab_bytes: that slab of it then stays in the last-level cache instead of streaming from memory
// for every tile (the head's input gradient, 2048 x 768 x 32000, reads the 49 MB weight once per
// 96 rows: 0.76 TFLOP/s whole, 0.94 in 8 MB slabs). fp32 D only, which holds the partial sums
// at the tile's own precision; bf16 D would round between slabs. gemm_avx512 uses 8 MB; tests pass
// less to split small problems.
void gemm_avx512_slabs(const GemmArgs& g, double slab_bytes);
void gemm_onednn(const GemmArgs& g);
// count independent problems as one: their packing, then all their output tiles, shared out
// among the threads in one parallel region (the experts of a mixture-of-experts layer, whose row
// counts are small and uneven). Their D's must not overlap.
void gemm_avx512_grouped(const GemmArgs* g, int64_t count);

enum class GemmImpl { Avx512, OneDnn };
const char* gemm_impl_name(GemmImpl impl);  // "avx512-bf16", "onednn"
// What gemm() runs for g. PRIMUS_CPU_GEMM=avx512|onednn forces one (an unknown value is an error);
// otherwise oneDNN on CPUs with AMX (this project has no AMX kernels of its own), this project's
// kernels elsewhere, for every form and output type: in the training step they were faster on
// llama_100M's GEMMs and level on llama2c_15M's (docs/engine.md, "Which GEMM runs").
GemmImpl gemm_impl_for(const GemmArgs& g);
void gemm(const GemmArgs& g);
// count problems: gemm_avx512_grouped, for every output type (faster than a loop of oneDNN calls
// whose shapes change every step), unless the CPU has AMX or PRIMUS_CPU_GEMM=onednn: then gemm()
// for each.
void gemm_grouped(const GemmArgs* g, int64_t count);

// The machine's practical bf16 GEMM peak: best of `reps` n^3 products (bf16 in, fp32 out) on all
// threads, through either implementation, in GFLOP/s. bf16 runs on the CPU report MFU against it
// (PRIMUS_PEAK_BF16_GFLOPS overrides it), as fp32 runs do against the SGEMM peak.
// The instruction ceiling's AVX-512 loops (kernels/cpu/ceiling.h, bf16/ceiling_avx512.cpp): `iters`
// steps of ceiling_zmm_chains() independent vdpbf16ps (or zmm FMA) chains in registers; the result
// only keeps the work from being optimised away. Only where cpu_features.h finds the instructions.
int ceiling_zmm_chains();
float dpbf16_zmm_loop(long iters);
float fma_zmm_loop(long iters);

double measure_bf16_gemm_peak_gflops(int n = 2048, int reps = 4);
double bf16_gemm_peak_gflops();  // PRIMUS_PEAK_BF16_GFLOPS if set, else measured once (n = 1024) and cached

}  // namespace primus::cpu::bf16k
