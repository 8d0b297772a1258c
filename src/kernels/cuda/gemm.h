// GEMM on the GPU through cuBLASLt, with a tuning cache.
//
// Problems are row-major, as everywhere in this project:
//   D[m, n] = alpha * op(A) op(B) + beta * C  (+ bias[n] added to every row)
//   op(A) is [m, k]: A is [m, k] (lda >= k), or [k, m] (lda >= m) when trans_a
//   op(B) is [k, n]: B is [k, n] (ldb >= n), or [n, k] (ldb >= k) when trans_b
//   C and D are [m, n] with ldc, ldd >= n; C may be D (accumulate) or another matrix (a residual)
// A and B are bf16 (or both fp32); C and D share one type, bf16 or fp32; accumulation is fp32.
// Internally the row-major product is cuBLASLt's column-major D^T = op(B)^T op(A)^T.
//
// Algorithm choice: cuBLASLt's heuristic gives candidate algorithms for a problem. The tuning
// cache maps a problem key (see key()) to the fastest candidate as measured on this GPU:
//   - offline: `primus-cli direct -- benchmark gemm --tune --shapes-from <config>` times every
//     candidate for each GEMM of a model and writes the winners to a JSON file;
//   - online (set_online_tuning): the first call of a new problem times the candidates and keeps
//     the best for the rest of the run;
//   - otherwise the heuristic's first choice.
// Training loads the cache file named by gemm_tuning_cache (config) or PRIMUS_GEMM_CACHE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace primus::cuda {

enum class GemmType : uint8_t { BF16, F32 };

struct GemmProblem {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;  // 0: the tight value for the shape
  GemmType ab = GemmType::BF16;                // A and B
  GemmType cd = GemmType::BF16;                // C and D
  bool bias = false;                           // bias[n], of type ab, added to every row of D
  bool accumulate = false;                     // beta != 0 (C is read)

  // e.g. "bf16:bf16:NT:m8192:n3072:k2048:lda..:bias0:acc1": what the cache is keyed on.
  std::string key() const;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// The problem with its leading dimensions filled in and checked (throws primus::Error naming
// the field when a dimension is non-positive or a leading dimension is too small).
GemmProblem normalized(GemmProblem p);

// Runs one GEMM on `stream` (the compute stream when null). A bias pointer is read only when
// p.bias; C only when p.accumulate (beta is then used; else beta is taken as 0).
void gemm(const GemmProblem& p, float alpha, const void* A, const void* B, float beta, const void* C, void* D,
          const void* bias, cudaStream_t stream = nullptr);

// ---- tuning ----
struct GemmCandidateTime {
  int index = 0;        // position in the heuristic's list
  double ms = 0;        // mean time, or < 0 when the candidate failed to run
};
struct GemmTuneResult {
  std::string key;
  std::vector<GemmCandidateTime> candidates;
  int best = -1;        // index into candidates of the fastest, -1 when none ran
  double heuristic_ms = 0;  // the heuristic's first choice
  double best_ms = 0;
};

// Times up to `max_candidates` heuristic candidates for p (on scratch buffers it allocates, filled
// with random values) and records the fastest in the in-memory cache.
GemmTuneResult tune_gemm(const GemmProblem& p, int max_candidates = 16, int warmup = 3, int iters = 10);

// Reads a cache file written by save_gemm_cache(); entries for another GPU model or another
// cuBLASLt version are ignored with a warning. Throws primus::Error for a malformed file.
// Returns the number of entries taken.
int load_gemm_cache(const std::string& path);
void save_gemm_cache(const std::string& path);
void set_online_tuning(bool on, int max_candidates = 8);
int gemm_cache_size();
void clear_gemm_cache();

// Dense bf16 GEMM throughput measured on an n^3 problem (TFLOP/s), for MFU on GPUs that the
// data-sheet table in runtime.cpp does not know.
double measure_bf16_peak_tflops(int n = 8192);

}  // namespace primus::cuda
