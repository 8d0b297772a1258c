// GEMM on the GPU through cuBLASLt, with a tuning cache.
//
// Problems are row-major, as everywhere in this project:
//   D[m, n] = alpha * op(A) op(B) + beta * C  (+ bias[n] added to every row)
//   op(A) is [m, k]: A is [m, k] (lda >= k), or [k, m] (lda >= m) when trans_a
//   op(B) is [k, n]: B is [k, n] (ldb >= n), or [n, k] (ldb >= k) when trans_b
//   C and D are [m, n] with ldc, ldd >= n; C may be D (accumulate) or another matrix (a residual)
// A and B are bf16 (or both fp32); C and D share one type, bf16 or fp32; accumulation is fp32
// (CUBLAS_COMPUTE_32F: no TF32 for fp32 inputs), alpha and beta are fp32.
// FP8 (sm_89 and later): A and B of E4M3 or E5M2 bytes (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3; not
// E5M2 x E5M2), C and D bf16 or fp32, a bias of bf16, fp32 accumulation without FAST_ACCUM. cuBLASLt
// takes FP8 in the TN format only (its A transposed, its B not), which row-major is A [m, k] and
// B [n, k] (trans_a false, trans_b true: x W^T), and lda and ldb multiples of 16; normalized()
// refuses anything else by name. The tensor scales are the caller's, in alpha.
// Block-scaled FP8 (sm_90, cuBLASLt 12.9 and later; docs/cuda.md has the sources): A and B each
// with fp32 dequantization scales, a_scale / b_scale Vec128 (one per 128 consecutive elements of a
// row of A [m, k] or of B [n, k], cuBLASLt's VEC128_32F) or Blk128 (one per 128 x 128 block,
// BLK128x128_32F); not both Blk128; both or neither block-scaled. The scales are device fp32
// arrays, for an operand of `outer` rows (m for A, n for B) and kb = ceil(k / 128) blocks along k:
//   Vec128  [kb, outer], outer contiguous: the scale of row i's block j at j * outer + i
//   Blk128  [ceil(outer / 128), round_up(kb, 4)], k contiguous: block (i, j) at i * round_up(kb, 4) + j
// D = alpha * sum over k blocks of (scale_A scale_B (the block's FP8 products)) + beta C (+ bias);
// the rows of D (n) must be a multiple of 8, and so must m when A is Vec128.
// Internally the row-major product is cuBLASLt's column-major D^T = op(B)^T op(A)^T: the operands
// swap places (cuBLASLt's A is our B), m and n swap, and the bias, a vector over the rows of the
// column-major D^T, is our bias[n].
//
// Algorithm choice: cuBLASLt's heuristic gives candidate algorithms for a problem. The tuning
// cache maps a problem key (see key()) to the fastest candidate as measured on this GPU:
//   - offline: `primus-cli direct -- benchmark gemm --tune --shapes-from <config>` times every
//     candidate for each GEMM of a model and writes the winners to a JSON file;
//   - online (set_online_tuning): the first call of a new problem times the candidates and keeps
//     the best for the rest of the run;
//   - otherwise the heuristic's first choice.
// Training loads the cache file named by gemm_tuning_cache (config) or PRIMUS_GEMM_CACHE.
//
// One cuBLASLt handle and one 32 MiB workspace serve the process, created on first use (after
// cuda::init()). The workspace is shared, so every GEMM must go on one stream at a time: the
// compute stream (runtime.h), which is what a null stream means. The descriptors of a problem are
// built once and kept (building them costs microseconds per call). Calls are serialised by a
// mutex; the cost is a lock per GEMM.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/fp8.h"

namespace primus::cuda {

enum class GemmType : uint8_t { BF16, F32, E4M3, E5M2 };
const char* gemm_type_name(GemmType t);  // "bf16" | "fp32" | "e4m3" | "e5m2"
inline bool is_fp8(GemmType t) { return t == GemmType::E4M3 || t == GemmType::E5M2; }

// How an FP8 operand is scaled: one scale for the tensor (alpha, or none), or cuBLASLt's block
// modes (the top of this file).
enum class GemmScale : uint8_t { Tensor, Vec128, Blk128 };
const char* gemm_scale_name(GemmScale s);  // "tensor" | "vec128" | "blk128"
// The fp32 scales of a block-scaled operand of `outer` rows and inner dimension k (0 for Tensor).
int64_t gemm_scale_count(GemmScale s, int64_t outer, int64_t k);

struct GemmProblem {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0;  // 0: the tight value for the shape
  GemmType ab = GemmType::BF16;                // A, and B unless b says otherwise
  std::optional<GemmType> b;                   // B's type when it is not A's (FP8's hybrid pairs)
  GemmType cd = GemmType::BF16;                // C and D
  bool bias = false;                           // bias[n], of type ab (bf16 for FP8), added to every row of D
  bool accumulate = false;                     // beta != 0 (C is read)
  GemmScale a_scale = GemmScale::Tensor, b_scale = GemmScale::Tensor;  // block-scaled FP8: A's and B's modes
  // The alignment in bytes (a power of two, 256 at most) that the A, B, C, D and bias pointers
  // all share: algorithms that need more are excluded (a vectorised load on a misaligned
  // address is a crash). gemm() derives it from its pointers; buffers from the caching
  // allocator, and views into them at offsets that are multiples of 256 bytes, give 256.
  int align = 256;

  // "bf16:bf16:NT:m8192:n3072:k2048:lda2048:ldb2048:ldc3072:ldd3072:bias0:acc0:al256": what the
  // cache is keyed on (of the normalized() problem); B's type follows A's after an 'x' when they
  // differ ("e5m2xe4m3:bf16:NT:..."), and block-scaled operands carry their modes
  // ("e4m3.vec128xe4m3.blk128:bf16:NT:...").
  std::string key() const;
  GemmType b_type() const { return b ? *b : ab; }
  GemmType bias_type() const { return is_fp8(ab) ? GemmType::BF16 : ab; }
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// The problem with its leading dimensions filled in and checked (throws primus::Error naming
// the field when a dimension is non-positive or a leading dimension is too small, or the types,
// the FP8 layout or the alignment are not supported). Without accumulate, C is not read and ldc is
// set to ldd; b is cleared when it is A's type.
GemmProblem normalized(GemmProblem p);

// ---- the op set's FP8 GEMMs (CudaBackend::gemm_fp8) as cuBLASLt problems ----
GemmType gemm_type(fp8::Format f);
// The scale mode of an operand of granularity g, when cuBLASLt has one on sm_90 (not Mx32).
std::optional<GemmScale> gemm_scale(fp8::Granularity g);
// Why cuBLASLt does not run an FP8 GEMM of operands a and b with an m x n output on this GPU (the
// device, the library's version, the pair of scalings and of formats, the shape), or null when it
// does: the rules above, checked first so that the GEMM runs as the exact emulation (bf16 GEMMs of
// the same values) instead. gemm_fp8 adds its tensors' own checks (block scales given, 16-byte
// alignment of D, C and the bias).
const char* fp8_gemm_refusal(const fp8::OperandKind& a, const fp8::OperandKind& b, int64_t m, int64_t n);
// The problem cuBLASLt runs for an FP8 GEMM whose bf16 problem is p (a pair fp8_gemm_refusal takes):
// A [m, k] and B [n, k] as bytes, k padded with zeros to a multiple of 16 (gemm_fp8 packs them so),
// A's and B's FP8 types and scale modes. `benchmark gemm --tune` tunes the model's FP8 GEMMs so.
GemmProblem fp8_gemm_problem(GemmProblem p, const fp8::OperandKind& a, const fp8::OperandKind& b);

// Runs one GEMM on `stream` (the compute stream when null). A bias pointer is read only when
// p.bias; C only when p.accumulate (beta is then used; else beta is taken as 0). p.align is
// replaced by the alignment of the pointers given. Errors (cuBLASLt statuses, shapes, pointers
// not aligned to their element size) are primus::Error naming the call and the problem key.
void gemm(const GemmProblem& p, float alpha, const void* A, const void* B, float beta, const void* C, void* D,
          const void* bias, cudaStream_t stream = nullptr);
// A block-scaled FP8 GEMM (p.a_scale, p.b_scale not Tensor): A's and B's scales on the device, in
// the layouts the top of this file gives, read when the GEMM runs.
void gemm(const GemmProblem& p, float alpha, const void* A, const float* scale_a, const void* B, const float* scale_b,
          float beta, const void* C, void* D, const void* bias, cudaStream_t stream = nullptr);
// cublasLtGetVersion() of the library this process runs (130100 for 13.1.0): the block-scaled modes
// need 120900.
int64_t cublaslt_version();

// ---- tuning ----
struct GemmCandidateTime {
  int index = 0;        // position in the heuristic's list
  double ms = 0;        // mean time, or < 0 when the candidate failed to run
  std::string algo;     // cuBLASLt's configuration: "id 66 tile 20 stages 8 splitk 1 swizzle 0 ..."
};
struct GemmTuneResult {
  std::string key;
  std::vector<GemmCandidateTime> candidates;
  int best = -1;        // index into candidates of the fastest, -1 when none ran
  double heuristic_ms = 0;  // the heuristic's first choice
  double best_ms = 0;
};

// Times up to `max_candidates` heuristic candidates for p (on scratch buffers it allocates, filled
// with random values, so that a timed accumulate never touches real data; p.align is honoured by
// offsetting the scratch pointers) and records the fastest in the in-memory cache.
GemmTuneResult tune_gemm(const GemmProblem& p, int max_candidates = 16, int warmup = 3, int iters = 10);

// Reads a cache file written by save_gemm_cache(); entries for another GPU model or another
// cuBLASLt version are ignored with a warning. Throws primus::Error for a malformed file.
// Returns the number of entries taken. Needs cuda::init() (the file is checked against the GPU).
int load_gemm_cache(const std::string& path);
void save_gemm_cache(const std::string& path);
// Online tuning: each new problem's first call tunes it (max_candidates candidates, 2 warm-up
// and 5 timed runs each) unless the cache already holds it. Not for use inside a CUDA graph
// capture. Off by default.
void set_online_tuning(bool on, int max_candidates = 8);
int gemm_cache_size();
void clear_gemm_cache();

// Dense bf16 GEMM throughput measured on an n^3 problem (TFLOP/s), for MFU on GPUs that the
// data-sheet table in runtime.cpp does not know: the best of 8 heuristic candidates (not added
// to the tuning cache).
double measure_bf16_peak_tflops(int n = 8192);

// ---- the cache file (no GPU needed: tested on any machine) ----
//   {"format": "primus-gemm-cache", "version": 1, "device": "NVIDIA H100 80GB HBM3",
//    "cublaslt_version": 130100,
//    "entries": [{"key": "...", "algo": ["00000000000000a2", ... 8 words], "ms": 1.23, "tflops": 812.4}]}
// "algo" is cublasLtMatmulAlgo_t's 8 uint64 words in hex: only meaningful for the same cuBLASLt
// version, hence the version check on load.
struct GemmCacheEntry {
  std::string key;
  std::array<uint64_t, 8> algo{};
  double ms = 0;
  double tflops = 0;
};
struct GemmCacheFile {
  std::string device;            // cudaDeviceProp::name
  int64_t cublaslt_version = 0;  // cublasLtGetVersion()
  std::vector<GemmCacheEntry> entries;
};
std::string gemm_cache_to_json(const GemmCacheFile& f);
// Throws primus::Error naming `source` (the file) and what is wrong: not JSON, another format or
// version, a missing or mistyped field (with the entry's index), a duplicate key.
GemmCacheFile parse_gemm_cache(const std::string& text, const std::string& source);

}  // namespace primus::cuda
