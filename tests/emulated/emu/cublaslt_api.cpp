// The cuBLASLt functions src/kernels/cuda/gemm.cpp calls, for the emulated device: the handle,
// matmul descriptors, matrix layouts and preferences with cuBLASLt's attributes (types and sizes as
// cublasLt.h declares them), a heuristic that offers a fixed list of fake algorithms, and
// cublasLtMatmul as a column-major reference computed on the host, queued on its stream like a
// kernel (emu/streams.cpp) and recording what it reads and writes (emu/memory.cpp). The test
// binary links these instead of libcublasLt.
//
// The operation (cublasLt.h, cublasLtMatmul; the cuBLAS guide, "cuBLASLt API"), column-major:
//   D = alpha * op(A) op(B) + beta * C (+ bias), computed in fp32, rounded once to D's type.
//   D and C are rows x cols = m x n; op(A) is m x k: A is m x k (TRANSA = N) or k x m (T); op(B)
//   is k x n: B is k x n (N) or n x k (T). A layout's ld (the stride between columns, in elements)
//   must be at least its rows. The BIAS epilogue adds a vector of length m (D's rows), of D's
//   type, to every column of D, after alpha and beta (unscaled). With beta == 0, C is not read.
//   C == D (in place) needs C's layout to be D's.
// Like cuBLASLt, a layout whose rows/cols do not fit the transposes and D's shape, a type
// combination it does not support (see problem_of), or a pointer less aligned than the chosen
// algorithm needs is an error status, not a best guess: a wrong mapping in gemm.cpp shows up as
// an error or a wrong result. Stricter than a GPU: the pointers must lie inside device
// allocations, and D must not overlap A, B or the bias (cuBLASLt does not check these and reads
// or writes garbage). Every error status is explained on stderr ("emulated cuBLASLt: ...").
//
// Algorithms. The heuristic offers up to 8 fake algorithms (kAlgos) in a fixed order: different
// tiles, split-k counts and reduction schemes, each needing some alignment (16, 8, 4 or 2 bytes)
// of every pointer, of every ld * element size and of the bias pointer, so that the preference's
// alignments and the leading dimensions decide which are offered, as on a GPU. Algorithms differ
// only in summation order (k split into `splitk` parts, each summed in `lanes` interleaved fp32
// partial sums): their results agree to fp32 rounding. cublasLtMatmulAlgo_t's words hold a magic
// number, the algorithm's index, the types it was chosen for and a checksum: AlgoCheck and Matmul
// refuse an algorithm that was not made here or was made for other types.
//
// FP8 (cublasLt.h; the cuBLAS guide, cublasLtMatmul's FP8 requirements), as on an sm_90 GPU:
// A and B of CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2 (not both E5M2), in the TN format (TRANSA = T,
// TRANSB = N), ld * element size of A and B multiples of 16 bytes and algorithms that need 16-byte
// alignment; C and D bf16 or fp32 of one type, or D FP8 (E5M2 only when an input is E5M2) with a
// bf16 C; a bias of bf16. The tensorwise scales are device fp32 pointers (null: 1):
//   D = scale_D * (alpha * scale_A * scale_B * op(A) op(B) + beta * scale_C * C + bias)
// with scale_D only for an FP8 D (a D_SCALE_POINTER with another D is INVALID_VALUE), and
// AMAX_D_POINTER receiving max |.| of the value in parentheses (before scale_D and the rounding to
// D's type). Scale pointers and AMAX_D with non-FP8 inputs are INVALID_VALUE. FAST_ACCUM is
// accepted and changes nothing (the emulation accumulates in fp32 either way).
//
// Block-scaled FP8 (sm_90, cuBLAS 12.9; docs/cuda.md names the sources: cublasLt.h, NVIDIA's
// CUDALibrarySamples LtBlk128x128Fp8Matmul and its scale sizes, Transformer Engine's cuBLASLt
// call, its GEMM-ready scale layout and its cuBLAS-exact reference GEMM, PyTorch's scaled_mm
// checks): A_SCALE_MODE and B_SCALE_MODE VEC128_32F (one fp32 per 128 consecutive elements along
// k of each row of op(A), of each column of op(B)) or BLK128x128_32F (one per 128 x 128 block),
// VEC128 x VEC128, VEC128 x BLK128x128 or BLK128x128 x VEC128 (not BLK x BLK, not one block mode
// with SCALAR_32F), in the TN format. The scales of an operand with `outer` = m (A) or n (B) and
// kb = ceil(k / 128):
//   VEC128_32F       kb x outer values, outer contiguous: (i, j) at j * outer + i
//   BLK128x128_32F   ceil(outer / 128) x round_up(kb, 4), k contiguous: (i, j) at i * round_up(kb, 4) + j
// A null scale pointer with a block mode is INVALID_VALUE (heuristic included, as cuBLASLt's
// "requires a custom pointer"), and so is one not 16-byte aligned. Transformer Engine's rules
// are held too: m a multiple of 8, and n when B is VEC128_32F (NOT_SUPPORTED). C and D bf16 or
// fp32; an FP8 D, C/D block modes and VEC32_UE8M0 / VEC16_UE4M3 (sm_100) / OUTER_VEC_32F are not
// emulated (NOT_SUPPORTED). The product, as Transformer Engine's cuBLAS-exact reference computes it:
// per 128-wide k block, the fp32 sum of the FP8 products, scaled by the 1-D operand's scale (B's
// when both are 1-D) and then fused-multiply-added with the other's into an fp32 accumulator;
// then alpha, the bias, one rounding to D's type, and with beta != 0 beta * C added to that
// rounded value and rounded again ("first convert to the output type, then accumulate").
//
// Not emulated (an error status naming it): batches, orders other than column-major, epilogues
// other than DEFAULT and BIAS, pointer modes other than HOST, compute types other than 32F
// (and its PEDANTIC form), fp16/integer types, search modes other than BEST_FIT.
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "emu/blas_values.h"
#include "emu/emulator.h"

namespace {

using emu::detail::find_allocation;

// ------------------------------------------------------------------------- descriptors

struct Desc {
  int32_t compute = CUBLAS_COMPUTE_32F;
  int32_t scale = CUDA_R_32F;
  int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N, transc = CUBLAS_OP_N;
  int32_t fill_mode = CUBLAS_FILL_MODE_FULL;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type
  int64_t bias_batch_stride = 0;
  const void* scale_ptr[4] = {};  // A, B, C, D: device fp32 (FP8), null: 1
  int32_t scale_mode[4] = {};     // A, B, C, D: cublasLtMatmulMatrixScale_t
  void* amax_d = nullptr;         // device fp32 (FP8)
  int8_t fast_accum = 0;
};

struct Layout {
  uint32_t type = CUDA_R_32F;
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch_count = 1;
  int64_t batch_offset = 0;
  int64_t plane_offset = 0;
  uint32_t batch_mode = 0;
};

struct Pref {
  uint32_t search_mode = CUBLASLT_SEARCH_BEST_FIT;
  uint64_t max_workspace = 0;
  uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
  uint32_t min_align[4] = {256, 256, 256, 256};  // A, B, C, D
  float max_waves = 0;
  uint64_t impl_mask = ~uint64_t(0);
};

struct Handle {
  int unused = 0;
};

// Live objects: a destroyed or foreign descriptor is an error, not a crash.
struct Registry {
  std::mutex mu;
  std::set<const void*> handles, descs, layouts, prefs;
};
Registry& reg() {
  static Registry r;
  return r;
}

template <typename T>
T* lookup(std::set<const void*>& live, const void* p) {
  std::lock_guard<std::mutex> lock(reg().mu);
  return live.count(p) ? static_cast<T*>(const_cast<void*>(p)) : nullptr;
}
Handle* handle_of(cublasLtHandle_t h) { return lookup<Handle>(reg().handles, h); }
Desc* desc_of(cublasLtMatmulDesc_t d) { return lookup<Desc>(reg().descs, d); }
Layout* layout_of(cublasLtMatrixLayout_t l) { return lookup<Layout>(reg().layouts, l); }
Pref* pref_of(cublasLtMatmulPreference_t p) { return lookup<Pref>(reg().prefs, p); }

const char* status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unrecognized cublasStatus_t>";
}

// Returns `s` after explaining it on stderr.
cublasStatus_t error(cublasStatus_t s, const char* fn, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
cublasStatus_t error(cublasStatus_t s, const char* fn, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "emulated cuBLASLt: %s: %s: %s\n", fn, status_name(s), msg);
  return s;
}

// Attribute values: the buffer must be exactly the attribute's size (cuBLASLt: INVALID_VALUE if
// "sizeInBytes doesn't match size of internal storage for selected attribute").
template <typename T>
cublasStatus_t set_value(T& field, const void* buf, size_t size, const char* fn, const char* attr) {
  if (!buf || size != sizeof(T))
    return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%s takes %zu bytes, given %zu%s", attr, sizeof(T), size,
                 buf ? "" : " at a null pointer");
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
template <typename T>
cublasStatus_t get_value(const T& field, void* buf, size_t size, size_t* written, const char* fn, const char* attr) {
  if (size == 0) {
    if (!written) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%s: sizeInBytes 0 and no sizeWritten", attr);
    *written = sizeof(T);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (!buf || size != sizeof(T))
    return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%s has %zu bytes, asked for %zu", attr, sizeof(T), size);
  std::memcpy(buf, &field, sizeof(T));
  if (written) *written = sizeof(T);
  return CUBLAS_STATUS_SUCCESS;
}

size_t type_size(uint32_t t) { return emu::blas::elem_size(t); }
const char* type_name(int64_t t) {
  switch (t) {
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_8F_E4M3: return "CUDA_R_8F_E4M3";
    case CUDA_R_8F_E5M2: return "CUDA_R_8F_E5M2";
    case CUDA_R_32I: return "CUDA_R_32I";
    default: return "another cudaDataType";
  }
}
const char* op_name(int32_t op) { return op == CUBLAS_OP_N ? "N" : "T"; }

// ------------------------------------------------------------------------- algorithms

struct FakeAlgo {
  int32_t id;
  uint32_t tile, tile_rows, tile_cols;  // cublasLtMatmulTile_t and its shape
  uint32_t stages;
  int32_t splitk;
  uint32_t reduction;  // cublasLtReductionScheme_t (NONE when splitk == 1)
  uint32_t swizzle;
  uint16_t cluster;
  uint32_t align;  // bytes needed of every pointer, ld * element size and the bias pointer
  int lanes;       // interleaved fp32 partial sums per k split
};
constexpr FakeAlgo kAlgos[] = {
    {66, CUBLASLT_MATMUL_TILE_128x128, 128, 128, CUBLASLT_MATMUL_STAGES_64x4, 1, CUBLASLT_REDUCTION_SCHEME_NONE, 0,
     CUBLASLT_CLUSTER_SHAPE_2x1x1, 16, 8},
    {66, CUBLASLT_MATMUL_TILE_128x256, 128, 256, CUBLASLT_MATMUL_STAGES_64x3, 1, CUBLASLT_REDUCTION_SCHEME_NONE, 1,
     CUBLASLT_CLUSTER_SHAPE_1x2x1, 16, 16},
    {31, CUBLASLT_MATMUL_TILE_64x128, 64, 128, CUBLASLT_MATMUL_STAGES_64x5, 2, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, 0,
     CUBLASLT_CLUSTER_SHAPE_1x1x1, 16, 4},
    {31, CUBLASLT_MATMUL_TILE_64x64, 64, 64, CUBLASLT_MATMUL_STAGES_32x6, 3, CUBLASLT_REDUCTION_SCHEME_INPLACE, 0,
     CUBLASLT_CLUSTER_SHAPE_1x1x1, 8, 4},
    {21, CUBLASLT_MATMUL_TILE_64x64, 64, 64, CUBLASLT_MATMUL_STAGES_32x4, 1, CUBLASLT_REDUCTION_SCHEME_NONE, 0,
     CUBLASLT_CLUSTER_SHAPE_AUTO, 8, 2},
    {21, CUBLASLT_MATMUL_TILE_32x32, 32, 32, CUBLASLT_MATMUL_STAGES_16x4, 4, CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE, 1,
     CUBLASLT_CLUSTER_SHAPE_AUTO, 4, 1},
    {0, CUBLASLT_MATMUL_TILE_32x32, 32, 32, CUBLASLT_MATMUL_STAGES_16x2, 1, CUBLASLT_REDUCTION_SCHEME_NONE, 0,
     CUBLASLT_CLUSTER_SHAPE_AUTO, 2, 1},
    {0, CUBLASLT_MATMUL_TILE_16x16, 16, 16, CUBLASLT_MATMUL_STAGES_16x1, 2, CUBLASLT_REDUCTION_SCHEME_INPLACE, 0,
     CUBLASLT_CLUSTER_SHAPE_AUTO, 2, 2},
};
constexpr int kNumAlgos = int(sizeof(kAlgos) / sizeof(kAlgos[0]));
constexpr uint64_t kAlgoMagic = 0x31474c4155554d45ull;  // "EMUUALG1"

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t checksum(const cublasLtMatmulAlgo_t& a) {
  uint64_t h = 0;
  for (int i = 0; i < 7; ++i) h = mix(h ^ a.data[i]);
  return h;
}

// ------------------------------------------------------------------------- the problem

struct Problem {
  const Desc* desc;
  const Layout *a, *b, *c, *d;
  int64_t m, n, k;
  uint32_t ab, bt, cd, ct, bias_type;  // A's type (and B's unless FP8), B's, D's, C's
  bool bias;
  bool fp8;            // FP8 A and B
  bool blocks;         // block-scaled FP8 (A_SCALE_MODE and B_SCALE_MODE VEC128_32F or BLK128x128_32F)
  uint64_t signature;  // the types (and scale modes) an algorithm is made for
};

bool block_mode(int32_t m) {
  return m == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || m == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}
const char* scale_mode_name(int32_t m) {
  switch (m) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "SCALAR_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: return "VEC16_UE4M3";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: return "VEC32_UE8M0";
    case CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: return "OUTER_VEC_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return "VEC128_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return "BLK128x128_32F";
    default: return "an unknown scale mode";
  }
}
// The fp32 scales a block-scaled operand of `outer` rows (m, n) reads, and the extent they span.
int64_t block_k(int64_t k) { return (k + 127) / 128; }
int64_t block_ld(int32_t mode, int64_t outer, int64_t k) {
  return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? outer : (block_k(k) + 3) / 4 * 4;
}
size_t block_extent(int32_t mode, int64_t outer, int64_t k) {  // in floats, from the first to the last read
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) return size_t(block_k(k) * outer);
  return size_t(((outer + 127) / 128 - 1) * block_ld(mode, outer, k) + block_k(k));
}
// The scale of element (i, l) of op(A) (or (l, j) of op(B), i = j): i the outer index, l along k.
size_t block_index(int32_t mode, int64_t outer, int64_t k, int64_t i, int64_t l) {
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) return size_t(l / 128 * outer + i);
  return size_t(i / 128 * block_ld(mode, outer, k) + l / 128);
}

// Block-scaled FP8 as an sm_90 GPU takes it (the top of this file); p's shape and fp8_rules checked.
cublasStatus_t block_rules(const char* fn, const Problem& p) {
  const Desc& d = *p.desc;
  const int32_t ma = d.scale_mode[0], mb = d.scale_mode[1];
  if (!block_mode(ma) || !block_mode(mb))
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                 "A's scale mode %s with B's %s: the block-scaled modes take both operands block-scaled",
                 scale_mode_name(ma), scale_mode_name(mb));
  if (ma == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F && mb == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                 "BLK128x128_32F x BLK128x128_32F: cuBLASLt takes 1D x 1D, 1D x 2D and 2D x 1D block scaling");
  if (emu::blas::is_fp8(p.cd) || d.amax_d)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%s with block-scaled inputs is not emulated",
                 d.amax_d ? "AMAX_D_POINTER" : "an FP8 D");
  if (p.m % 8)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "block-scaled FP8 with m = %lld: m must be a multiple of 8",
                 (long long)p.m);
  if (mb == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F && p.n % 8)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                 "block-scaled FP8 with n = %lld and B in VEC128_32F: n must be a multiple of 8", (long long)p.n);
  for (int x = 0; x < 2; ++x) {
    if (!d.scale_ptr[x])
      return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                   "the scaling mode for %c scale (%s) requires a pointer for %c scale", "AB"[x],
                   scale_mode_name(d.scale_mode[x]), "AB"[x]);
    if (reinterpret_cast<uintptr_t>(d.scale_ptr[x]) % 16)
      return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%c's block scales at %p are not 16-byte aligned", "AB"[x],
                   d.scale_ptr[x]);
  }
  return CUBLAS_STATUS_SUCCESS;
}

// FP8 inputs as an sm_90 GPU takes them (the top of this file); p's types and layouts set.
cublasStatus_t fp8_rules(const char* fn, const Problem& p) {
  using emu::blas::is_fp8;
  const Desc& d = *p.desc;
  if (!is_fp8(p.ab) || !is_fp8(p.bt))
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "A is %s and B is %s: FP8 needs both in FP8", type_name(p.ab),
                 type_name(p.bt));
  if (p.ab == CUDA_R_8F_E5M2 && p.bt == CUDA_R_8F_E5M2)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "E5M2 x E5M2 is not an FP8 combination of cuBLASLt");
  if (d.transa != CUBLAS_OP_T || d.transb != CUBLAS_OP_N)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                 "FP8 with TRANSA = %s, TRANSB = %s: sm_90 needs the TN format (A transposed, B not)",
                 op_name(d.transa), op_name(d.transb));
  for (const Layout* l : {p.a, p.b})
    if ((l->ld * int64_t(emu::blas::elem_size(l->type))) % 16)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                   "FP8 with ld %lld of a %s operand: ld must be a multiple of 16 bytes", (long long)l->ld,
                   type_name(l->type));
  const bool e5m2_in = p.ab == CUDA_R_8F_E5M2 || p.bt == CUDA_R_8F_E5M2;
  const bool d_ok = p.cd == CUDA_R_16BF || p.cd == CUDA_R_32F || p.cd == CUDA_R_8F_E4M3 ||
                    (p.cd == CUDA_R_8F_E5M2 && e5m2_in);
  const uint32_t c_needed = is_fp8(p.cd) ? uint32_t(CUDA_R_16BF) : p.cd;
  if (!d_ok || p.ct != c_needed)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "FP8 %s x %s with C %s and D %s is not a cuBLASLt combination",
                 type_name(p.ab), type_name(p.bt), type_name(p.ct), type_name(p.cd));
  for (int x = 0; x < 4; ++x)
    if (d.scale_mode[x] != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && (x >= 2 || !block_mode(d.scale_mode[x])))
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                   "%c scale mode %s (%d) is not emulated (SCALAR_32F, and VEC128_32F and BLK128x128_32F for A and "
                   "B; VEC32_UE8M0 and VEC16_UE4M3 need sm_100)",
                   "ABCD"[x], scale_mode_name(d.scale_mode[x]), d.scale_mode[x]);
  if (d.scale_ptr[3] && !is_fp8(p.cd))
    return error(CUBLAS_STATUS_INVALID_VALUE, fn, "D_SCALE_POINTER with a %s D: D's scale is for FP8 outputs",
                 type_name(p.cd));
  return CUBLAS_STATUS_SUCCESS;
}

// Checks the descriptor and layouts as cuBLASLt does and derives m, n, k.
cublasStatus_t problem_of(const char* fn, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A,
                          cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, Problem* p) {
  p->desc = desc_of(desc);
  p->a = layout_of(A);
  p->b = layout_of(B);
  p->c = layout_of(C);
  p->d = layout_of(D);
  if (!p->desc) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "the matmul descriptor is not a live one");
  const char* names = "ABCD";
  const Layout* ls[4] = {p->a, p->b, p->c, p->d};
  for (int i = 0; i < 4; ++i) {
    if (!ls[i]) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "the layout of %c is not a live one", names[i]);
    if (ls[i]->order != CUBLASLT_ORDER_COL)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c: order %d is not emulated (column-major only)", names[i],
                   ls[i]->order);
    if (ls[i]->batch_count != 1)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c: batch count %d is not emulated", names[i],
                   ls[i]->batch_count);
    if (ls[i]->plane_offset != 0)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c: planar complex layouts are not emulated", names[i]);
    if (ls[i]->rows == 0 || ls[i]->cols == 0)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c is %llu x %llu: empty matrices are not emulated", names[i],
                   (unsigned long long)ls[i]->rows, (unsigned long long)ls[i]->cols);
    if (ls[i]->ld < int64_t(ls[i]->rows))
      return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                   "%c is %llu x %llu column-major with ld %lld: ld must be at least the rows", names[i],
                   (unsigned long long)ls[i]->rows, (unsigned long long)ls[i]->cols, (long long)ls[i]->ld);
  }
  const Desc& d = *p->desc;
  if (d.compute != CUBLAS_COMPUTE_32F && d.compute != CUBLAS_COMPUTE_32F_PEDANTIC)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "compute type %d is not emulated (CUBLAS_COMPUTE_32F only)",
                 d.compute);
  if (d.scale != CUDA_R_32F)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "scale type %s with CUBLAS_COMPUTE_32F: cuBLASLt needs CUDA_R_32F",
                 type_name(d.scale));
  if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "pointer mode %d is not emulated (HOST only)", d.pointer_mode);
  if (d.transc != CUBLAS_OP_N)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "TRANSC must be CUBLAS_OP_N");
  if (d.fill_mode != CUBLAS_FILL_MODE_FULL)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "fill mode %d is not emulated", d.fill_mode);

  // Types (cuBLASLt's table for CUBLAS_COMPUTE_32F, scale CUDA_R_32F: bf16 x bf16 -> bf16 or fp32,
  // fp32 x fp32 -> fp32; C and D of one type; FP8 as the top of this file says).
  p->ab = p->a->type;
  p->bt = p->b->type;
  p->cd = p->d->type;
  p->ct = p->c->type;
  p->fp8 = emu::blas::is_fp8(p->ab) || emu::blas::is_fp8(p->bt);
  p->blocks = false;
  if (!p->fp8)
    for (int x = 0; x < 4; ++x)
      if (d.scale_mode[x] != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F)
        return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%c scale mode %s with %s inputs: scale modes are FP8's",
                     "ABCD"[x], scale_mode_name(d.scale_mode[x]), type_name(p->ab));
  if (p->fp8) {
    if (const cublasStatus_t s = fp8_rules(fn, *p); s != CUBLAS_STATUS_SUCCESS) return s;
  } else {
    if (p->bt != p->ab)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "A is %s but B is %s", type_name(p->ab), type_name(p->bt));
    if (p->ct != p->cd)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "C is %s but D is %s", type_name(p->ct), type_name(p->cd));
    const bool ok = (p->ab == CUDA_R_16BF && (p->cd == CUDA_R_16BF || p->cd == CUDA_R_32F)) ||
                    (p->ab == CUDA_R_32F && p->cd == CUDA_R_32F);
    if (!ok)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                   "A/B %s with C/D %s is not a supported (or not an emulated) combination", type_name(p->ab),
                   type_name(p->cd));
    for (int x = 0; x < 4; ++x)
      if (d.scale_ptr[x])
        return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%c's scale pointer with %s inputs: scale pointers are FP8's",
                     "ABCD"[x], type_name(p->ab));
    if (d.amax_d)
      return error(CUBLAS_STATUS_INVALID_VALUE, fn, "AMAX_D_POINTER with %s inputs: amax is FP8's", type_name(p->ab));
  }

  // Shapes: D is m x n, op(A) m x k, op(B) k x n.
  p->m = int64_t(p->d->rows);
  p->n = int64_t(p->d->cols);
  if (p->c->rows != p->d->rows || p->c->cols != p->d->cols)
    return error(CUBLAS_STATUS_INVALID_VALUE, fn, "C is %llu x %llu but D is %lld x %lld",
                 (unsigned long long)p->c->rows, (unsigned long long)p->c->cols, (long long)p->m, (long long)p->n);
  for (int32_t t : {d.transa, d.transb})
    if (t != CUBLAS_OP_N && t != CUBLAS_OP_T)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "operation %d is not emulated (N or T)", t);
  const int64_t a_m = int64_t(d.transa == CUBLAS_OP_N ? p->a->rows : p->a->cols);
  const int64_t a_k = int64_t(d.transa == CUBLAS_OP_N ? p->a->cols : p->a->rows);
  const int64_t b_k = int64_t(d.transb == CUBLAS_OP_N ? p->b->rows : p->b->cols);
  const int64_t b_n = int64_t(d.transb == CUBLAS_OP_N ? p->b->cols : p->b->rows);
  if (a_m != p->m)
    return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                 "A is %llu x %llu with TRANSA = %s, so op(A) has %lld rows, but D is %lld x %lld",
                 (unsigned long long)p->a->rows, (unsigned long long)p->a->cols, op_name(d.transa), (long long)a_m,
                 (long long)p->m, (long long)p->n);
  if (b_n != p->n)
    return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                 "B is %llu x %llu with TRANSB = %s, so op(B) has %lld columns, but D is %lld x %lld",
                 (unsigned long long)p->b->rows, (unsigned long long)p->b->cols, op_name(d.transb), (long long)b_n,
                 (long long)p->m, (long long)p->n);
  if (a_k != b_k)
    return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                 "op(A) is %lld x %lld (A %llu x %llu, TRANSA = %s) but op(B) is %lld x %lld (B %llu x %llu, "
                 "TRANSB = %s): the inner dimensions differ",
                 (long long)a_m, (long long)a_k, (unsigned long long)p->a->rows, (unsigned long long)p->a->cols,
                 op_name(d.transa), (long long)b_k, (long long)b_n, (unsigned long long)p->b->rows,
                 (unsigned long long)p->b->cols, op_name(d.transb));
  p->k = a_k;
  p->blocks = p->fp8 && (block_mode(d.scale_mode[0]) || block_mode(d.scale_mode[1]));
  if (p->blocks)
    if (const cublasStatus_t s = block_rules(fn, *p); s != CUBLAS_STATUS_SUCCESS) return s;

  // Epilogue: DEFAULT, or BIAS with a vector of D's type (cublasLt.h: "Bias vector elements are
  // the same type as the elements of output matrix (Dtype)", the exceptions being IMMA and fp8,
  // whose bias is bf16 here).
  p->bias = false;
  p->bias_type = p->cd;
  if (d.epilogue == CUBLASLT_EPILOGUE_BIAS) {
    p->bias = true;
    p->bias_type = d.bias_type == -1 ? p->cd : uint32_t(d.bias_type);
    if (p->fp8 && p->bias_type != CUDA_R_16BF)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                   "a %s bias with FP8 inputs: the emulated FP8 GEMMs take a bf16 bias", type_name(p->bias_type));
    if (!p->fp8 && p->bias_type != p->cd)
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                   "a %s bias with a %s D: cuBLASLt documents the bias vector as of D's type (bf16 and fp32 "
                   "GEMMs)",
                   type_name(p->bias_type), type_name(p->cd));
  } else if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "epilogue %u is not emulated (DEFAULT and BIAS)", d.epilogue);
  }
  p->signature = uint64_t(p->ab) | uint64_t(p->cd) << 8 | uint64_t(p->bias) << 16 | uint64_t(p->bt) << 24 |
                 uint64_t(uint32_t(d.compute)) << 32;
  if (p->blocks) p->signature ^= uint64_t(d.scale_mode[0]) << 48 | uint64_t(d.scale_mode[1]) << 56;
  return CUBLAS_STATUS_SUCCESS;
}

// The alignment (a power of two, at most 256) of an address or a byte count.
uint32_t alignment_of(uint64_t v) {
  uint32_t a = 1;
  while (a < 256 && !(v & a)) a <<= 1;
  return a;
}

// What an algorithm needs of an operand of `elem` bytes: its alignment, at least the element's.
uint32_t need(const FakeAlgo& al, size_t elem) { return std::max<uint32_t>(al.align, uint32_t(elem)); }

// Whether the layouts' leading dimensions (and the bias pointer's value) allow the algorithm.
bool layouts_allow(const FakeAlgo& al, const Problem& p, std::string* why) {
  if (p.fp8 && al.align < 16) {
    if (why) *why = "FP8 kernels need 16-byte alignment, the algorithm is one of " + std::to_string(al.align);
    return false;
  }
  const char* names = "ABCD";
  const Layout* ls[4] = {p.a, p.b, p.c, p.d};
  for (int i = 0; i < 4; ++i) {
    const size_t e = type_size(ls[i]->type);
    if (alignment_of(uint64_t(ls[i]->ld) * e) < need(al, e)) {
      if (why)
        *why = std::string(1, names[i]) + "'s ld * element size (" + std::to_string(ls[i]->ld * int64_t(e)) +
               " bytes) is not a multiple of the " + std::to_string(need(al, e)) + " bytes the algorithm needs";
      return false;
    }
  }
  if (p.bias && alignment_of(reinterpret_cast<uintptr_t>(p.desc->bias)) < need(al, type_size(p.bias_type))) {
    if (why) *why = "the bias pointer is less aligned than the algorithm needs";
    return false;
  }
  return true;
}

size_t workspace_of(const FakeAlgo& al, const Problem& p) {
  if (al.splitk == 1 || al.reduction == CUBLASLT_REDUCTION_SCHEME_INPLACE) return 0;
  return size_t(p.m) * size_t(p.n) * sizeof(float) * size_t(al.splitk);
}
float waves_of(const FakeAlgo& al, const Problem& p) {
  const double tiles = std::ceil(double(p.m) / al.tile_rows) * std::ceil(double(p.n) / al.tile_cols) * al.splitk;
  return float(tiles / 132.0);  // the emulated H100's SMs
}
uint64_t impl_flags(const Problem& p) {
  if (p.fp8)
    return CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F |
           (p.ab == CUDA_R_8F_E4M3 || p.bt == CUDA_R_8F_E4M3 ? CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E4M3 : 0) |
           (p.ab == CUDA_R_8F_E5M2 || p.bt == CUDA_R_8F_E5M2 ? CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_8F_E5M2 : 0);
  return p.ab == CUDA_R_16BF ? CUBLASLT_NUMERICAL_IMPL_FLAGS_HMMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F |
                                   CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF
                             : CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F |
                                   CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F;
}

cublasLtMatmulAlgo_t encode(int index, const Problem& p) {
  cublasLtMatmulAlgo_t a{};
  a.data[0] = kAlgoMagic;
  a.data[1] = uint64_t(index);
  a.data[2] = p.signature;
  a.data[7] = checksum(a);
  return a;
}

// The algorithm an algo descriptor names, or null when it is not one of ours.
const FakeAlgo* decode(const cublasLtMatmulAlgo_t* a) {
  if (!a || a->data[0] != kAlgoMagic || a->data[7] != checksum(*a) || a->data[1] >= uint64_t(kNumAlgos)) return nullptr;
  return &kAlgos[a->data[1]];
}

// The algorithm `algo` names, checked against the problem (AlgoCheck's and Matmul's rules).
cublasStatus_t check_algo(const char* fn, const cublasLtMatmulAlgo_t* algo, const Problem& p, const FakeAlgo** out) {
  const FakeAlgo* al = decode(algo);
  if (!al)
    return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                 "the algorithm is not one this cuBLASLt made (an algo from another cuBLASLt version or GPU, or "
                 "corrupted words)");
  if (algo->data[2] != p.signature)
    return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                 "the algorithm was chosen for other types, epilogue or compute type than these descriptors'");
  std::string why;
  if (!layouts_allow(*al, p, &why)) return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%s", why.c_str());
  *out = al;
  return CUBLAS_STATUS_SUCCESS;
}

// ------------------------------------------------------------------------- host arithmetic

using emu::blas::load;
using emu::blas::store;

// sum a[l] * b[l] over [0, n) in L interleaved fp32 partial sums, then those in order.
template <int L>
float dot_lanes(const float* a, const float* b, int64_t n) {
  float lane[L] = {};
  int64_t l = 0;
  for (; l + L <= n; l += L)
    for (int u = 0; u < L; ++u) lane[u] = std::fma(a[l + u], b[l + u], lane[u]);
  for (int u = 0; l < n; ++l, ++u) lane[u] = std::fma(a[l], b[l], lane[u]);
  float s = 0;
  for (int u = 0; u < L; ++u) s += lane[u];
  return s;
}
float dot(const float* a, const float* b, int64_t k, const FakeAlgo& al) {
  const int64_t chunk = (k + al.splitk - 1) / al.splitk;
  float total = 0;
  for (int64_t lo = 0; lo < k; lo += chunk) {
    const int64_t n = std::min(chunk, k - lo);
    float part;
    switch (al.lanes) {
      case 1: part = dot_lanes<1>(a + lo, b + lo, n); break;
      case 2: part = dot_lanes<2>(a + lo, b + lo, n); break;
      case 4: part = dot_lanes<4>(a + lo, b + lo, n); break;
      case 8: part = dot_lanes<8>(a + lo, b + lo, n); break;
      default: part = dot_lanes<16>(a + lo, b + lo, n); break;
    }
    total += part;
  }
  return total;
}

// A matrix in device memory: its bytes are [p, p + extent).
struct Mat {
  const char* p;
  const Layout* l;
  size_t extent() const { return ((l->cols - 1) * size_t(l->ld) + l->rows) * type_size(l->type); }
};

// Whether two strided matrices share a byte (exact, not only their extents).
bool overlap(const Mat& x, const Mat& y) {
  const char* lo = std::max(x.p, y.p);
  const char* hi = std::min(x.p + x.extent(), y.p + y.extent());
  if (lo >= hi) return false;
  std::vector<bool> used(size_t(hi - lo));
  auto mark = [&](const Mat& m, bool test) {
    const size_t e = type_size(m.l->type), col_bytes = m.l->rows * e, stride = size_t(m.l->ld) * e;
    for (uint64_t c = 0; c < m.l->cols; ++c) {
      const char* a = std::max(m.p + c * stride, lo);
      const char* b = std::min(m.p + c * stride + col_bytes, hi);
      for (const char* q = a; q < b; ++q) {
        if (test && used[size_t(q - lo)]) return true;
        if (!test) used[size_t(q - lo)] = true;
      }
    }
    return false;
  };
  mark(x, false);
  return mark(y, true);
}

// One cublasLtMatmul, queued on its stream: the operands' layouts and the scalars are copied when
// it is issued (the caller may destroy its descriptors at once, as cuBLASLt allows); the FP8
// scales are read from device memory, and the amax written there, when it runs.
class MatmulOp final : public emu::detail::Op {
 public:
  MatmulOp(float alpha, float beta, const void* A, const Layout& la, const void* B, const Layout& lb, const void* C,
           const Layout& lc, void* D, const Layout& ld, const Problem& p, const char* bias, const FakeAlgo* al,
           void* workspace, size_t ws)
      : alpha_(alpha),
        beta_(beta),
        A_(A),
        B_(B),
        C_(C),
        D_(D),
        la_(la),
        lb_(lb),
        lc_(lc),
        ld_(ld),
        m_(p.m),
        n_(p.n),
        k_(p.k),
        bias_type_(p.bias_type),
        has_bias_(p.bias),
        bias_(bias),
        ta_(p.desc->transa != CUBLAS_OP_N),
        tb_(p.desc->transb != CUBLAS_OP_N),
        al_(al),
        workspace_(workspace),
        ws_(ws),
        amax_(p.desc->amax_d),
        blocks_(p.blocks) {
    for (int x = 0; x < 4; ++x) scale_[x] = static_cast<const float*>(p.desc->scale_ptr[x]);
    mode_[0] = p.desc->scale_mode[0], mode_[1] = p.desc->scale_mode[1];
  }

  Status run() override {
    using emu::detail::Access;
    using emu::detail::note_strided;
    const bool read_c = beta_ != 0.0f;
    // What the product touches: the rows x cols part of each column, ld apart.
    auto touch = [](const void* p, const Layout& l, Access a) {
      const size_t e = type_size(l.type);
      note_strided(p, l.cols, l.rows * e, size_t(l.ld) * e, a);
    };
    if (alpha_ != 0.0f) {
      touch(A_, la_, Access::kRead);
      touch(B_, lb_, Access::kRead);
    }
    if (read_c) touch(C_, lc_, Access::kRead);
    if (has_bias_) emu::detail::note_access(bias_, size_t(m_) * type_size(bias_type_), Access::kRead, 0);
    if (ws_) emu::detail::note_access(workspace_, ws_, Access::kWrite, 0);  // the algorithm's scratch
    float scale[4];                                                         // A, B, C, D
    for (int x = 0; x < 4; ++x) {
      scale[x] = 1.0f;
      if (!scale_[x]) continue;
      const size_t n = blocks_ && x < 2 ? block_extent(mode_[x], x ? n_ : m_, k_) : 1;
      emu::detail::note_access(scale_[x], n * sizeof(float), Access::kRead, 0);
      if (!blocks_ || x >= 2) scale[x] = *scale_[x];
    }
    touch(D_, ld_, Access::kWrite);
    if (blocks_) return run_blocks(scale[2]);

    // D = scale_D (alpha scale_A scale_B op(A) op(B) + beta scale_C C + bias): op(A)'s rows and
    // op(B)'s columns gathered as fp32 vectors over k, each dot product in the algorithm's order,
    // one rounding to D's type; the amax of the value before scale_D.
    const int64_t m = m_, n = n_, k = k_;
    const float ab_scale = alpha_ * scale[0] * scale[1], c_scale = beta_ * scale[2];
    std::vector<float> arows, bcols;
    if (alpha_ != 0.0f) {
      arows.resize(size_t(m * k));
      bcols.resize(size_t(n * k));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t l = 0; l < k; ++l)  // op(A)(i, l) = A(i, l) or A(l, i); X(r, c) is X[r + c * ld]
          arows[size_t(i * k + l)] = load(A_, la_.type, ta_ ? size_t(l + i * la_.ld) : size_t(i + l * la_.ld));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t l = 0; l < k; ++l)  // op(B)(l, j) = B(l, j) or B(j, l)
          bcols[size_t(j * k + l)] = load(B_, lb_.type, tb_ ? size_t(j + l * lb_.ld) : size_t(l + j * lb_.ld));
    }
    float amax = 0.0f;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        float v = alpha_ != 0.0f ? ab_scale * dot(&arows[size_t(i * k)], &bcols[size_t(j * k)], k, *al_) : 0.0f;
        if (read_c) v += c_scale * load(C_, lc_.type, size_t(i + j * lc_.ld));
        if (has_bias_) v += load(bias_, bias_type_, size_t(i));
        amax = std::isnan(v) || std::isnan(amax) ? NAN : std::max(amax, std::fabs(v));
        store(D_, ld_.type, size_t(i + j * ld_.ld), emu::blas::is_fp8(ld_.type) ? v * scale[3] : v);
      }
    if (amax_) {
      emu::detail::note_access(amax_, sizeof(float), Access::kWrite, 0);
      *static_cast<float*>(amax_) = amax;
    }
    return kDone;
  }

 private:
  float alpha_, beta_;
  const void *A_, *B_, *C_;
  void* D_;
  Layout la_, lb_, lc_, ld_;
  int64_t m_, n_, k_;
  uint32_t bias_type_;
  bool has_bias_;
  const char* bias_;
  bool ta_, tb_;
  const FakeAlgo* al_;
  void* workspace_;
  size_t ws_;
  const float* scale_[4] = {};
  void* amax_;
  bool blocks_;
  int32_t mode_[2] = {};  // A's and B's scale modes

  // The block-scaled product (the top of this file): per 128-wide k block the fp32 sum of the FP8
  // products in the algorithm's order, times the 1-D operand's scale (B's when both are), fused
  // into the accumulator with the other's; then alpha, the bias and a rounding to D's type, and
  // beta * scale_C * C added to the rounded value and rounded once more.
  Status run_blocks(float scale_c) {
    const int64_t m = m_, n = n_, k = k_, kb = block_k(k);
    const bool b_first = mode_[1] == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const bool read_c = beta_ != 0.0f;
    std::vector<float> arows(size_t(m * k)), bcols(size_t(n * k));
    if (alpha_ != 0.0f) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t l = 0; l < k; ++l)
          arows[size_t(i * k + l)] = load(A_, la_.type, ta_ ? size_t(l + i * la_.ld) : size_t(i + l * la_.ld));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t l = 0; l < k; ++l)
          bcols[size_t(j * k + l)] = load(B_, lb_.type, tb_ ? size_t(j + l * lb_.ld) : size_t(l + j * lb_.ld));
    }
    auto rounded = [&](float v) {  // v rounded to D's type
      unsigned char buf[4];
      store(buf, ld_.type, 0, v);
      return load(buf, ld_.type, 0);
    };
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int64_t b = 0; b < kb && alpha_ != 0.0f; ++b) {
          const int64_t l0 = b * 128, len = std::min<int64_t>(128, k - l0);
          const float part = dot(&arows[size_t(i * k + l0)], &bcols[size_t(j * k + l0)], len, *al_);
          const float sa = scale_[0][block_index(mode_[0], m, k, i, l0)];
          const float sb = scale_[1][block_index(mode_[1], n, k, j, l0)];
          acc = b_first ? std::fma(part * sb, sa, acc) : std::fma(part * sa, sb, acc);
        }
        float v = alpha_ * acc;
        if (has_bias_) v += load(bias_, bias_type_, size_t(i));
        if (read_c) v = rounded(v) + beta_ * scale_c * load(C_, lc_.type, size_t(i + j * lc_.ld));
        store(D_, ld_.type, size_t(i + j * ld_.ld), v);
      }
    return kDone;
  }
};

}  // namespace

extern "C" {


// ------------------------------------------------------------------------- the library

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (!handle) return error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "null handle pointer");
  auto* h = new Handle;
  std::lock_guard<std::mutex> lock(reg().mu);
  reg().handles.insert(h);
  *handle = reinterpret_cast<cublasLtHandle_t>(h);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  std::lock_guard<std::mutex> lock(reg().mu);
  if (!reg().handles.erase(handle))
    return error(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "not a live handle");
  delete reinterpret_cast<Handle*>(handle);
  return CUBLAS_STATUS_SUCCESS;
}

size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }
size_t cublasLtGetCudartVersion(void) { return CUDART_VERSION; }

const char* cublasLtGetStatusName(cublasStatus_t status) { return status_name(status); }

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
  }
  return "unknown error";
}

// ------------------------------------------------------------------------- matmul descriptors

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (!desc) return error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "null descriptor pointer");
  auto* d = new Desc;
  d->compute = compute;
  d->scale = scale;
  std::lock_guard<std::mutex> lock(reg().mu);
  reg().descs.insert(d);
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  std::lock_guard<std::mutex> lock(reg().mu);
  if (!reg().descs.erase(desc))
    return error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescDestroy", "not a live descriptor");
  delete reinterpret_cast<Desc*>(desc);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  const char* fn = "cublasLtMatmulDescSetAttribute";
  Desc* d = desc_of(desc);
  if (!d) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live descriptor");
  cublasStatus_t s;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set_value(d->compute, buf, size, fn, "COMPUTE_TYPE");
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set_value(d->scale, buf, size, fn, "SCALE_TYPE");
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set_value(d->pointer_mode, buf, size, fn, "POINTER_MODE");
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
    case CUBLASLT_MATMUL_DESC_TRANSC: {
      int32_t op = 0;
      if ((s = set_value(op, buf, size, fn, "TRANSA/TRANSB/TRANSC")) != CUBLAS_STATUS_SUCCESS) return s;
      if (op < CUBLAS_OP_N || op > CUBLAS_OP_CONJG)
        return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%d is not a cublasOperation_t", op);
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : attr == CUBLASLT_MATMUL_DESC_TRANSB ? d->transb : d->transc) = op;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_FILL_MODE: return set_value(d->fill_mode, buf, size, fn, "FILL_MODE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_value(d->epilogue, buf, size, fn, "EPILOGUE");
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_value(d->bias, buf, size, fn, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
      return set_value(d->bias_batch_stride, buf, size, fn, "BIAS_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_value(d->bias_type, buf, size, fn, "BIAS_DATA_TYPE");
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: return set_value(d->scale_ptr[0], buf, size, fn, "A_SCALE_POINTER");
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: return set_value(d->scale_ptr[1], buf, size, fn, "B_SCALE_POINTER");
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: return set_value(d->scale_ptr[2], buf, size, fn, "C_SCALE_POINTER");
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: return set_value(d->scale_ptr[3], buf, size, fn, "D_SCALE_POINTER");
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return set_value(d->amax_d, buf, size, fn, "AMAX_D_POINTER");
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return set_value(d->fast_accum, buf, size, fn, "FAST_ACCUM");
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return set_value(d->scale_mode[0], buf, size, fn, "A_SCALE_MODE");
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return set_value(d->scale_mode[1], buf, size, fn, "B_SCALE_MODE");
    case CUBLASLT_MATMUL_DESC_C_SCALE_MODE: return set_value(d->scale_mode[2], buf, size, fn, "C_SCALE_MODE");
    case CUBLASLT_MATMUL_DESC_D_SCALE_MODE: return set_value(d->scale_mode[3], buf, size, fn, "D_SCALE_MODE");
    default:
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not emulated", int(attr));
  }
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              void* buf, size_t size, size_t* written) {
  const char* fn = "cublasLtMatmulDescGetAttribute";
  const Desc* d = desc_of(desc);
  if (!d) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live descriptor");
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return get_value(d->compute, buf, size, written, fn, "COMPUTE_TYPE");
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return get_value(d->scale, buf, size, written, fn, "SCALE_TYPE");
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return get_value(d->pointer_mode, buf, size, written, fn, "POINTER_MODE");
    case CUBLASLT_MATMUL_DESC_TRANSA: return get_value(d->transa, buf, size, written, fn, "TRANSA");
    case CUBLASLT_MATMUL_DESC_TRANSB: return get_value(d->transb, buf, size, written, fn, "TRANSB");
    case CUBLASLT_MATMUL_DESC_TRANSC: return get_value(d->transc, buf, size, written, fn, "TRANSC");
    case CUBLASLT_MATMUL_DESC_FILL_MODE: return get_value(d->fill_mode, buf, size, written, fn, "FILL_MODE");
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return get_value(d->epilogue, buf, size, written, fn, "EPILOGUE");
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return get_value(d->bias, buf, size, written, fn, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE:
      return get_value(d->bias_batch_stride, buf, size, written, fn, "BIAS_BATCH_STRIDE");
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return get_value(d->bias_type, buf, size, written, fn, "BIAS_DATA_TYPE");
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
      return get_value(d->scale_ptr[0], buf, size, written, fn, "A_SCALE_POINTER");
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
      return get_value(d->scale_ptr[1], buf, size, written, fn, "B_SCALE_POINTER");
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER:
      return get_value(d->scale_ptr[2], buf, size, written, fn, "C_SCALE_POINTER");
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER:
      return get_value(d->scale_ptr[3], buf, size, written, fn, "D_SCALE_POINTER");
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: return get_value(d->amax_d, buf, size, written, fn, "AMAX_D_POINTER");
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: return get_value(d->fast_accum, buf, size, written, fn, "FAST_ACCUM");
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: return get_value(d->scale_mode[0], buf, size, written, fn, "A_SCALE_MODE");
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: return get_value(d->scale_mode[1], buf, size, written, fn, "B_SCALE_MODE");
    case CUBLASLT_MATMUL_DESC_C_SCALE_MODE: return get_value(d->scale_mode[2], buf, size, written, fn, "C_SCALE_MODE");
    case CUBLASLT_MATMUL_DESC_D_SCALE_MODE: return get_value(d->scale_mode[3], buf, size, written, fn, "D_SCALE_MODE");
    default:
      return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not emulated", int(attr));
  }
}

// ------------------------------------------------------------------------- matrix layouts

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!layout) return error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "null layout pointer");
  auto* l = new Layout;
  l->type = uint32_t(type);
  l->rows = rows;
  l->cols = cols;
  l->ld = ld;
  std::lock_guard<std::mutex> lock(reg().mu);
  reg().layouts.insert(l);
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(l);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  std::lock_guard<std::mutex> lock(reg().mu);
  if (!reg().layouts.erase(layout))
    return error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy", "not a live layout");
  delete reinterpret_cast<Layout*>(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  const char* fn = "cublasLtMatrixLayoutSetAttribute";
  Layout* l = layout_of(layout);
  if (!l) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live layout");
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return set_value(l->type, buf, size, fn, "TYPE");
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return set_value(l->order, buf, size, fn, "ORDER");
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return set_value(l->rows, buf, size, fn, "ROWS");
    case CUBLASLT_MATRIX_LAYOUT_COLS: return set_value(l->cols, buf, size, fn, "COLS");
    case CUBLASLT_MATRIX_LAYOUT_LD: return set_value(l->ld, buf, size, fn, "LD");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set_value(l->batch_count, buf, size, fn, "BATCH_COUNT");
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return set_value(l->batch_offset, buf, size, fn, "STRIDED_BATCH_OFFSET");
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: return set_value(l->plane_offset, buf, size, fn, "PLANE_OFFSET");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: return set_value(l->batch_mode, buf, size, fn, "BATCH_MODE");
    default: return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%d is not a layout attribute", int(attr));
  }
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                void* buf, size_t size, size_t* written) {
  const char* fn = "cublasLtMatrixLayoutGetAttribute";
  const Layout* l = layout_of(layout);
  if (!l) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live layout");
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return get_value(l->type, buf, size, written, fn, "TYPE");
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return get_value(l->order, buf, size, written, fn, "ORDER");
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return get_value(l->rows, buf, size, written, fn, "ROWS");
    case CUBLASLT_MATRIX_LAYOUT_COLS: return get_value(l->cols, buf, size, written, fn, "COLS");
    case CUBLASLT_MATRIX_LAYOUT_LD: return get_value(l->ld, buf, size, written, fn, "LD");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return get_value(l->batch_count, buf, size, written, fn, "BATCH_COUNT");
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
      return get_value(l->batch_offset, buf, size, written, fn, "STRIDED_BATCH_OFFSET");
    case CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET: return get_value(l->plane_offset, buf, size, written, fn, "PLANE_OFFSET");
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: return get_value(l->batch_mode, buf, size, written, fn, "BATCH_MODE");
    default: return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%d is not a layout attribute", int(attr));
  }
}

// ------------------------------------------------------------------------- preferences

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "null preference pointer");
  auto* p = new Pref;
  std::lock_guard<std::mutex> lock(reg().mu);
  reg().prefs.insert(p);
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  std::lock_guard<std::mutex> lock(reg().mu);
  if (!reg().prefs.erase(pref))
    return error(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy", "not a live preference");
  delete reinterpret_cast<Pref*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  const char* fn = "cublasLtMatmulPreferenceSetAttribute";
  Pref* p = pref_of(pref);
  if (!p) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live preference");
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return set_value(p->search_mode, buf, size, fn, "SEARCH_MODE");
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set_value(p->max_workspace, buf, size, fn, "MAX_WORKSPACE_BYTES");
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
      return set_value(p->reduction_mask, buf, size, fn, "REDUCTION_SCHEME_MASK");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_value(p->min_align[0], buf, size, fn, "MIN_ALIGNMENT_A_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_value(p->min_align[1], buf, size, fn, "MIN_ALIGNMENT_B_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_value(p->min_align[2], buf, size, fn, "MIN_ALIGNMENT_C_BYTES");
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_value(p->min_align[3], buf, size, fn, "MIN_ALIGNMENT_D_BYTES");
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: return set_value(p->max_waves, buf, size, fn, "MAX_WAVES_COUNT");
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: return set_value(p->impl_mask, buf, size, fn, "IMPL_MASK");
    default: return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not emulated", int(attr));
  }
}

// ------------------------------------------------------------------------- algorithms

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                              cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  const char* fn = "cublasLtMatmulAlgoGetHeuristic";
  if (!handle_of(handle)) return error(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live handle");
  if (requested <= 0) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "requestedAlgoCount %d", requested);
  if (!results || !returned) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "null results");
  const Pref* pref = pref_of(preference);
  if (!pref) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live preference");
  if (pref->search_mode != CUBLASLT_SEARCH_BEST_FIT)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "search mode %u is not emulated", pref->search_mode);
  Problem p;
  if (const cublasStatus_t s = problem_of(fn, desc, A, B, C, D, &p); s != CUBLAS_STATUS_SUCCESS) return s;
  *returned = 0;
  const Layout* ls[4] = {p.a, p.b, p.c, p.d};
  for (int i = 0; i < kNumAlgos && *returned < requested; ++i) {
    const FakeAlgo& al = kAlgos[i];
    bool ok = layouts_allow(al, p, nullptr);
    for (int x = 0; x < 4 && ok; ++x) ok = pref->min_align[x] >= need(al, type_size(ls[x]->type));
    ok = ok && workspace_of(al, p) <= pref->max_workspace;
    ok = ok && (al.splitk == 1 || (al.reduction & pref->reduction_mask));
    ok = ok && (impl_flags(p) & ~pref->impl_mask) == 0;
    ok = ok && (pref->max_waves == 0 || waves_of(al, p) <= pref->max_waves);
    if (!ok) continue;
    cublasLtMatmulHeuristicResult_t& r = results[*returned];
    r = cublasLtMatmulHeuristicResult_t{};
    r.algo = encode(i, p);
    r.workspaceSize = workspace_of(al, p);
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = waves_of(al, p);
    ++*returned;
  }
  if (*returned == 0)
    return error(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                 "no algorithm fits the alignments (A %u, B %u, C %u, D %u bytes), leading dimensions and workspace "
                 "(%llu bytes)",
                 pref->min_align[0], pref->min_align[1], pref->min_align[2], pref->min_align[3],
                 (unsigned long long)pref->max_workspace);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A,
                                       cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                       const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result) {
  const char* fn = "cublasLtMatmulAlgoCheck";
  if (!handle_of(handle)) return error(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live handle");
  if (!result) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "null result");
  Problem p;
  if (const cublasStatus_t s = problem_of(fn, desc, A, B, C, D, &p); s != CUBLAS_STATUS_SUCCESS) return s;
  const FakeAlgo* al = nullptr;
  if (const cublasStatus_t s = check_algo(fn, algo, p, &al); s != CUBLAS_STATUS_SUCCESS) return s;
  result->workspaceSize = workspace_of(*al, p);  // result->algo is never updated
  result->state = CUBLAS_STATUS_SUCCESS;
  result->wavesCount = waves_of(*al, p);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr, void* buf, size_t size,
                                                    size_t* written) {
  const char* fn = "cublasLtMatmulAlgoConfigGetAttribute";
  const FakeAlgo* al = decode(algo);
  if (!al) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "not an algorithm this cuBLASLt made");
  const uint32_t zero32 = 0;
  const uint16_t zero16 = 0;
  switch (attr) {
    case CUBLASLT_ALGO_CONFIG_ID: return get_value(al->id, buf, size, written, fn, "ID");
    case CUBLASLT_ALGO_CONFIG_TILE_ID: return get_value(al->tile, buf, size, written, fn, "TILE_ID");
    case CUBLASLT_ALGO_CONFIG_SPLITK_NUM: return get_value(al->splitk, buf, size, written, fn, "SPLITK_NUM");
    case CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME:
      return get_value(al->reduction, buf, size, written, fn, "REDUCTION_SCHEME");
    case CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING: return get_value(al->swizzle, buf, size, written, fn, "CTA_SWIZZLING");
    case CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION: return get_value(zero32, buf, size, written, fn, "CUSTOM_OPTION");
    case CUBLASLT_ALGO_CONFIG_STAGES_ID: return get_value(al->stages, buf, size, written, fn, "STAGES_ID");
    case CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID: return get_value(zero16, buf, size, written, fn, "INNER_SHAPE_ID");
    case CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID: return get_value(al->cluster, buf, size, written, fn, "CLUSTER_SHAPE_ID");
    default: return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%d is not an algorithm configuration attribute", int(attr));
  }
}

// ------------------------------------------------------------------------- the product

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha_ptr,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta_ptr, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  const char* fn = "cublasLtMatmul";
  if (!handle_of(handle)) return error(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live handle");
  Problem p;
  if (const cublasStatus_t s = problem_of(fn, desc, Adesc, Bdesc, Cdesc, Ddesc, &p); s != CUBLAS_STATUS_SUCCESS)
    return s;
  if (!alpha_ptr || !beta_ptr) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "null alpha or beta");
  if (!emu::detail::valid_stream(stream)) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live stream");
  float alpha, beta;
  std::memcpy(&alpha, alpha_ptr, sizeof alpha);  // CUBLASLT_POINTER_MODE_HOST, scale type fp32
  std::memcpy(&beta, beta_ptr, sizeof beta);
  const bool read_c = beta != 0.0f;

  // The operands: inside device allocations, aligned to their elements.
  const Mat a{static_cast<const char*>(A), p.a}, b{static_cast<const char*>(B), p.b};
  const Mat c{static_cast<const char*>(C), p.c}, d{static_cast<const char*>(D), p.d};
  const char* bias = static_cast<const char*>(p.desc->bias);
  struct Operand {
    const char* name;
    const char* ptr;
    size_t bytes, elem;
    bool used;
  } ops[] = {{"A", a.p, a.extent(), type_size(p.ab), true},
             {"B", b.p, b.extent(), type_size(p.bt), true},
             {"C", c.p, c.extent(), type_size(p.ct), read_c},
             {"D", d.p, d.extent(), type_size(p.cd), true},
             {"the bias", bias, size_t(p.m) * type_size(p.bias_type), type_size(p.bias_type), p.bias}};
  // The FP8 scalars: one fp32 each in device memory (not part of the algorithms' alignment rules);
  // block scales: the extent of their layouts.
  const size_t a_scales = p.blocks ? block_extent(p.desc->scale_mode[0], p.m, p.k) : 1;
  const size_t b_scales = p.blocks ? block_extent(p.desc->scale_mode[1], p.n, p.k) : 1;
  const struct {
    const char* name;
    const void* ptr;
    size_t count;
  } scalars[] = {{"A's scale", p.desc->scale_ptr[0], a_scales},
                 {"B's scale", p.desc->scale_ptr[1], b_scales},
                 {"C's scale", p.desc->scale_ptr[2], 1},
                 {"D's scale", p.desc->scale_ptr[3], 1},
                 {"amax D", p.desc->amax_d, 1}};
  for (const auto& x : scalars) {
    if (!x.ptr) continue;
    if (!find_allocation(x.ptr, x.count * sizeof(float)))
      return error(CUBLAS_STATUS_EXECUTION_FAILED, fn,
                   "%s pointer %p (%zu fp32 values) is not inside one device allocation: on a GPU, an illegal memory "
                   "access (scale pointers are device pointers)",
                   x.name, x.ptr, x.count);
    if (reinterpret_cast<uintptr_t>(x.ptr) % sizeof(float))
      return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%s pointer %p is not aligned to its fp32", x.name, x.ptr);
  }
  for (const Operand& o : ops) {
    if (!o.used) continue;
    if (!o.ptr) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%s is null", o.name);
    if (!find_allocation(o.ptr, o.bytes))
      return error(CUBLAS_STATUS_EXECUTION_FAILED, fn,
                   "%s [%p, +%zu bytes) is not inside one device allocation: on a GPU, an illegal memory access", o.name,
                   static_cast<const void*>(o.ptr), o.bytes);
    if (reinterpret_cast<uintptr_t>(o.ptr) % o.elem)
      return error(CUBLAS_STATUS_INVALID_VALUE, fn, "%s = %p is not aligned to its %zu-byte elements", o.name,
                   static_cast<const void*>(o.ptr), o.elem);
  }
  // In place (C == D) needs C's layout to be D's; otherwise outputs and inputs must not share bytes.
  if (read_c) {
    if (c.p == d.p) {
      if (p.c->ld != p.d->ld || p.c->type != p.d->type || p.c->order != p.d->order)
        return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                     "C == D (in place) with ldc %lld and ldd %lld: in place needs C's layout to equal D's",
                     (long long)p.c->ld, (long long)p.d->ld);
    } else if (overlap(c, d)) {
      return error(CUBLAS_STATUS_INVALID_VALUE, fn, "C and D overlap without being the same matrix");
    }
  }
  if (overlap(a, d) || overlap(b, d))
    return error(CUBLAS_STATUS_INVALID_VALUE, fn, "D overlaps %s: the product reads it while writing D",
                 overlap(a, d) ? "A" : "B");
  if (p.bias) {
    const Layout vec{p.bias_type, CUBLASLT_ORDER_COL, uint64_t(p.m), 1, p.m};
    if (overlap(Mat{bias, &vec}, d)) return error(CUBLAS_STATUS_INVALID_VALUE, fn, "D overlaps the bias");
  }

  // The algorithm: the one given, or the first the heuristic would offer for these pointers.
  const FakeAlgo* al = nullptr;
  if (algo) {
    if (const cublasStatus_t s = check_algo(fn, algo, p, &al); s != CUBLAS_STATUS_SUCCESS) return s;
  } else {
    for (const FakeAlgo& cand : kAlgos) {
      bool ok = layouts_allow(cand, p, nullptr) && workspace_of(cand, p) <= workspace_bytes;
      for (const Operand& o : ops)
        ok = ok && (!o.used || alignment_of(reinterpret_cast<uintptr_t>(o.ptr)) >= need(cand, o.elem));
      if (ok) {
        al = &cand;
        break;
      }
    }
    if (!al) return error(CUBLAS_STATUS_NOT_SUPPORTED, fn, "no algorithm fits these pointers and workspace");
  }
  for (const Operand& o : ops)
    if (o.used && alignment_of(reinterpret_cast<uintptr_t>(o.ptr)) < need(*al, o.elem))
      return error(CUBLAS_STATUS_INVALID_VALUE, fn,
                   "%s = %p is %u-byte aligned but the algorithm (id %d, tile %u, split-k %d) needs %u bytes: the "
                   "preference's MIN_ALIGNMENT must not exceed the pointers' alignment",
                   o.name, static_cast<const void*>(o.ptr), alignment_of(reinterpret_cast<uintptr_t>(o.ptr)), al->id,
                   al->tile, al->splitk, need(*al, o.elem));
  const size_t ws = workspace_of(*al, p);
  if (workspace_bytes < ws)
    return error(CUBLAS_STATUS_INVALID_VALUE, fn, "the algorithm needs %zu bytes of workspace, given %zu", ws,
                 workspace_bytes);
  if (ws && (!workspace || !find_allocation(workspace, ws)))
    return error(CUBLAS_STATUS_EXECUTION_FAILED, fn, "the workspace [%p, +%zu bytes) is not device memory", workspace, ws);

  emu::detail::enqueue(stream,
                       std::make_unique<MatmulOp>(alpha, beta, A, *p.a, B, *p.b, C, *p.c, D, *p.d, p, bias, al,
                                                  ws ? workspace : nullptr, ws),
                       emu::detail::OpLabel{"cublasLtMatmul"});
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
