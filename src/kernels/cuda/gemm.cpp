// cuBLASLt GEMM with descriptors built once per problem and a tuning cache (gemm.h).
//
// Per problem (its normalized() fields, alignment included) a Plan holds the matmul descriptor,
// the four layouts, the preference, the heuristic's candidate list and the algorithm gemm() runs:
// the tuning cache's entry for the key when there is one (checked with cublasLtMatmulAlgoCheck),
// else the heuristic's first. The cache changes rarely (tuning, load, clear); an epoch counter
// tells a plan to look again, so that the hot path is a hash lookup and one cublasLtMatmul.
//
// The row-major problem D[m,n] = op(A) op(B) is computed as cuBLASLt's column-major
// D^T[n,m] = op(B)^T op(A)^T: a row-major matrix with leading dimension ld is, read column-major
// with the same ld, its transpose. So cuBLASLt's A is our B with transa = trans_b and layout
// (trans_b ? k x n : n x k), its B is our A with transb = trans_a and layout
// (trans_a ? m x k : k x m), and C, D are n x m. The bias epilogue adds a vector over the rows of
// the column-major D (n of them) to every column: our bias[n] on every row.
//
// FP8 problems (gemm.h) are the same calls with FP8 layouts for cuBLASLt's A and B (our B's type
// and A's) and a bf16 bias type; normalized() has already held them to the TN format, which in
// this mapping is our trans_a false, trans_b true. Block-scaled ones set cuBLASLt's A_SCALE_MODE
// and B_SCALE_MODE (our B's mode and A's) and its scale pointers (our B's scales and A's): our
// [n, k] B is cuBLASLt's k x n A read transposed, whose "outer" dimension is n, so the layouts of
// gemm.h are cuBLASLt's without a change.
#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include <cublasLt.h>
#include <fmt/format.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "kernels/cuda/runtime.h"
#include "kernels/fp8.h"

namespace primus::cuda {
namespace {

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(GemmCacheEntry{}.algo), "cublasLtMatmulAlgo_t is 8 uint64 words");

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what cuBLAS asks for on Hopper
constexpr int kMaxHeuristic = 32;                      // candidates asked of the heuristic

void lt_check(cublasStatus_t status, const char* call, const std::string& key) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail("cuBLASLt {} failed{}: {} ({})", call, key.empty() ? std::string() : " for GEMM " + key,
       cublasLtGetStatusName(status), cublasLtGetStatusString(status));
}
// Names the call as written, e.g. "cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, ...)".
#define PRIMUS_LT_CHECK(expr, key) lt_check((expr), #expr, (key))

cudaDataType_t data_type(GemmType t) {
  switch (t) {
    case GemmType::BF16: return CUDA_R_16BF;
    case GemmType::F32: return CUDA_R_32F;
    case GemmType::E4M3: return CUDA_R_8F_E4M3;
    case GemmType::E5M2: return CUDA_R_8F_E5M2;
  }
  return CUDA_R_32F;
}
size_t elem_size(GemmType t) { return t == GemmType::BF16 ? 2 : is_fp8(t) ? 1 : 4; }

// The largest power of two (at most 256) that divides the address.
int pointer_alignment(const void* ptr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  int al = 1;
  while (al < 256 && !(a & uintptr_t(al))) al <<= 1;
  return al;
}

struct PlanKey {
  bool trans_a, trans_b, bias, accumulate;
  GemmType ab, b, cd;
  GemmScale a_scale, b_scale;
  int align;
  int64_t m, n, k, lda, ldb, ldc, ldd;
  bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = splitmix64(uint64_t(k.trans_a) | uint64_t(k.trans_b) << 1 | uint64_t(k.bias) << 2 |
                            uint64_t(k.accumulate) << 3 | uint64_t(k.ab) << 4 | uint64_t(k.cd) << 7 |
                            uint64_t(k.b) << 10 | uint64_t(k.align) << 13 | uint64_t(k.a_scale) << 22 |
                            uint64_t(k.b_scale) << 24);
    for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc, k.ldd}) h = splitmix64(h ^ uint64_t(v));
    return size_t(h);
  }
};
PlanKey plan_key(const GemmProblem& p) {
  return {p.trans_a, p.trans_b, p.bias, p.accumulate, p.ab,  p.b_type(), p.cd,  p.a_scale, p.b_scale,
          p.align,   p.m,       p.n,    p.k,          p.lda, p.ldb,      p.ldc, p.ldd};
}

struct Plan {
  GemmProblem p;  // normalized, align set
  std::string key;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;  // cuBLASLt's A (our B), B (our A), C, D
  cublasLtMatmulPreference_t pref = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> heuristic;  // best first
  cublasLtMatmulAlgo_t algo{};                             // what gemm() runs
  uint64_t epoch = ~uint64_t(0);                           // the cache epoch `algo` was chosen at
  bool tuned = false;                                      // `algo` came from the tuning cache
  bool online_tried = false;                               // online tuning has run for it
  const void* bias = nullptr;                              // the bias pointer set in desc
  const void* scale[2] = {};                               // our A's and B's block scales set in desc

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {  // statuses of teardown are not actionable
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    for (auto l : {a, b, c, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct TunedEntry {
  cublasLtMatmulAlgo_t algo{};
  double ms = 0, tflops = 0;
};

struct State {
  std::mutex mu;  // guards everything below, and every use of a plan's descriptors
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  std::map<std::string, TunedEntry> tuned;  // the tuning cache, by key
  uint64_t epoch = 0;                       // bumped on every change of `tuned`
  bool online = false;
  int online_max = 8;
  std::set<std::string> warned;  // keys whose cached algorithm failed its check
};
// Never destroyed: at exit the CUDA context may already be gone.
State& state() {
  static State* s = new State;
  return *s;
}

void ensure_handle(State& s) {
  if (s.handle) return;
  if (!initialized()) fail("GEMM on the GPU before cuda::init(): initialise the CUDA backend first");
  cublasLtHandle_t h = nullptr;
  PRIMUS_LT_CHECK(cublasLtCreate(&h), "");
  s.workspace = device_alloc(kWorkspaceBytes);
  s.handle = h;
}

void set_bias_pointer(Plan& pl, const void* bias) {
  if (pl.bias == bias) return;
  PRIMUS_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
                  pl.key);
  pl.bias = bias;
}

bool block_scaled(const GemmProblem& p) { return p.a_scale != GemmScale::Tensor; }

// Our A's and B's block scales: cuBLASLt's B and A scale pointers (the top of this file).
void set_scale_pointers(Plan& pl, const void* scale_a, const void* scale_b) {
  if (pl.scale[0] != scale_a) {
    PRIMUS_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_a,
                                                   sizeof(scale_a)),
                    pl.key);
    pl.scale[0] = scale_a;
  }
  if (pl.scale[1] != scale_b) {
    PRIMUS_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_b,
                                                   sizeof(scale_b)),
                    pl.key);
    pl.scale[1] = scale_b;
  }
}

int32_t scale_mode(GemmScale s) {
  switch (s) {
    case GemmScale::Tensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case GemmScale::Vec128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case GemmScale::Blk128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

// The plan of a normalized problem (align set), built on first use. Lock held.
Plan& get_plan(State& s, const GemmProblem& p) {
  const PlanKey k = plan_key(p);
  if (auto it = s.plans.find(k); it != s.plans.end()) return *it->second;
  auto owned = std::make_unique<Plan>();
  Plan& pl = *owned;
  pl.p = p;
  pl.key = p.key();
  const std::string& key = pl.key;

  PRIMUS_LT_CHECK(cublasLtMatmulDescCreate(&pl.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), key);
  const cublasOperation_t transa = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  const cublasOperation_t transb = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  PRIMUS_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)), key);
  PRIMUS_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)), key);
  if (p.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    PRIMUS_LT_CHECK(
        cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), key);
    const int32_t bias_type = int32_t(data_type(p.bias_type()));
    PRIMUS_LT_CHECK(
        cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)),
        key);
    // The heuristic reads the bias pointer's value (never the memory) to learn its alignment: a
    // stand-in with exactly p.align's alignment until gemm() sets the real one.
    set_bias_pointer(pl, reinterpret_cast<const void*>(uintptr_t(p.align)));
  }
  if (block_scaled(p)) {
    const int32_t mode_a = scale_mode(p.b_scale), mode_b = scale_mode(p.a_scale);  // cuBLASLt's A is our B
    PRIMUS_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof(mode_a)),
                    key);
    PRIMUS_LT_CHECK(cublasLtMatmulDescSetAttribute(pl.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof(mode_b)),
                    key);
    // A block mode needs its scale pointers for the heuristic too (which never reads them):
    // 256-aligned stand-ins until gemm() sets the real ones.
    set_scale_pointers(pl, reinterpret_cast<const void*>(uintptr_t(256)),
                       reinterpret_cast<const void*>(uintptr_t(512)));
  }
  PRIMUS_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.a, data_type(p.b_type()), uint64_t(p.trans_b ? p.k : p.n),
                                             uint64_t(p.trans_b ? p.n : p.k), p.ldb),
                  key);
  PRIMUS_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.b, data_type(p.ab), uint64_t(p.trans_a ? p.m : p.k),
                                             uint64_t(p.trans_a ? p.k : p.m), p.lda),
                  key);
  PRIMUS_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.c, data_type(p.cd), uint64_t(p.n), uint64_t(p.m), p.ldc), key);
  PRIMUS_LT_CHECK(cublasLtMatrixLayoutCreate(&pl.d, data_type(p.cd), uint64_t(p.n), uint64_t(p.m), p.ldd), key);

  PRIMUS_LT_CHECK(cublasLtMatmulPreferenceCreate(&pl.pref), key);
  const uint64_t workspace = kWorkspaceBytes;
  PRIMUS_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pl.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                       sizeof(workspace)),
                  key);
  const uint32_t align = uint32_t(p.align);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    PRIMUS_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pl.pref, attr, &align, sizeof(align)), key);

  std::vector<cublasLtMatmulHeuristicResult_t> results(kMaxHeuristic);
  int returned = 0;
  PRIMUS_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(s.handle, pl.desc, pl.a, pl.b, pl.c, pl.d, pl.pref, kMaxHeuristic,
                                                 results.data(), &returned),
                  key);
  for (int i = 0; i < returned; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= kWorkspaceBytes)
      pl.heuristic.push_back(results[i]);
  if (pl.heuristic.empty())
    fail("cuBLASLt has no algorithm for GEMM {} on {} (cublasLtMatmulAlgoGetHeuristic returned {} candidates)", key,
         device_info().name, returned);
  return *s.plans.emplace(k, std::move(owned)).first->second;
}

// Chooses the plan's algorithm: the tuning cache's when it has the key and cuBLASLt accepts it
// for these descriptors, else the heuristic's first. Lock held.
void resolve(State& s, Plan& pl) {
  pl.tuned = false;
  pl.algo = pl.heuristic.front().algo;
  if (auto it = s.tuned.find(pl.key); it != s.tuned.end()) {
    cublasLtMatmulHeuristicResult_t check{};
    const cublasStatus_t status =
        cublasLtMatmulAlgoCheck(s.handle, pl.desc, pl.a, pl.b, pl.c, pl.d, &it->second.algo, &check);
    if (status == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes) {
      pl.algo = it->second.algo;
      pl.tuned = true;
    } else if (s.warned.insert(pl.key).second) {
      // A stale entry is not fatal: the heuristic's choice is correct, only maybe slower.
      log::warn("GEMM {}: the tuned algorithm is refused by cublasLtMatmulAlgoCheck ({}; needs {} bytes of workspace, "
                "{} available): using cuBLASLt's heuristic. Tune again with primus-cli direct -- benchmark gemm --tune",
                pl.key, status == CUBLAS_STATUS_SUCCESS ? "workspace too large" : cublasLtGetStatusName(status),
                check.workspaceSize, kWorkspaceBytes);
    }
  }
  pl.epoch = s.epoch;
}

cublasStatus_t run_matmul(State& s, Plan& pl, const cublasLtMatmulAlgo_t& algo, float alpha, const void* A,
                          const void* B, float beta, const void* C, void* D, cudaStream_t stream) {
  // Our B is cuBLASLt's A (see the top of this file).
  return cublasLtMatmul(s.handle, pl.desc, &alpha, B, pl.a, A, pl.b, &beta, C, pl.c, D, pl.d, &algo, s.workspace,
                        kWorkspaceBytes, stream);
}

std::string describe(const cublasLtMatmulAlgo_t& algo, const std::string& key) {
  int32_t id = 0, splitk = 0;
  uint32_t tile = 0, stages = 0, reduction = 0, swizzle = 0, custom = 0;
  uint16_t cluster = 0;
  size_t written = 0;
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, void* buf, size_t size, const char* name) {
    lt_check(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, buf, size, &written),
             fmt::format("cublasLtMatmulAlgoConfigGetAttribute({})", name).c_str(), key);
  };
  get(CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), "CUBLASLT_ALGO_CONFIG_ID");
  get(CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), "CUBLASLT_ALGO_CONFIG_TILE_ID");
  get(CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), "CUBLASLT_ALGO_CONFIG_STAGES_ID");
  get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), "CUBLASLT_ALGO_CONFIG_SPLITK_NUM");
  get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &reduction, sizeof(reduction), "CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME");
  get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle), "CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING");
  get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom), "CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION");
  get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster), "CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID");
  return fmt::format("id {} tile {} stages {} splitk {} reduction {} swizzle {} custom {} cluster {}", id, tile, stages,
                     splitk, reduction, swizzle, custom, cluster);
}

// Fills `bytes` of device memory with uniform values in [-1, 1) of type t: one random 1 MiB block
// from the host, then doubling device-to-device copies (timings do not care that it repeats; a
// host fill of a multi-GB operand would take seconds).
void fill_random(void* dst, size_t bytes, GemmType t, uint64_t seed) {
  if (!bytes) return;
  const size_t first = std::min(bytes, size_t(1) << 20);
  const size_t count = first / elem_size(t);
  const Rng rng(seed);
  std::vector<unsigned char> host(first);
  for (size_t i = 0; i < count; ++i) {
    const float v = float(2.0 * ((rng.at(i) >> 11) * 0x1.0p-53) - 1.0);
    if (t == GemmType::BF16) {
      const uint16_t bits = primus::bf16::from_float(v).bits;
      std::memcpy(host.data() + 2 * i, &bits, 2);
    } else if (is_fp8(t)) {
      host[i] = fp8::encode(v, t == GemmType::E4M3 ? fp8::Format::E4M3 : fp8::Format::E5M2);
    } else {
      std::memcpy(host.data() + 4 * i, &v, 4);
    }
  }
  char* d = static_cast<char*>(dst);
  copy_to_device(d, host.data(), first);
  for (size_t done = first; done < bytes;) {
    const size_t n = std::min(done, bytes - done);
    PRIMUS_CUDA_CHECK(cudaMemcpyAsync(d + done, d, n, cudaMemcpyDeviceToDevice, stream()));
    done += n;
  }
}

// Times the plan's first `max_candidates` heuristic candidates on scratch operands; records the
// fastest in the tuning cache when `record`. Lock held.
GemmTuneResult tune_plan(State& s, Plan& pl, int max_candidates, int warmup, int iters, bool record) {
  const GemmProblem& p = pl.p;
  const size_t cd = elem_size(p.cd);
  const size_t bytes_a = size_t((p.trans_a ? p.k : p.m) * p.lda) * elem_size(p.ab);
  const size_t bytes_b = size_t((p.trans_b ? p.n : p.k) * p.ldb) * elem_size(p.b_type());
  const size_t bytes_c = p.accumulate ? size_t(p.m * p.ldc) * cd : 0;
  const size_t bytes_d = size_t(p.m * p.ldd) * cd;
  const size_t bytes_bias = p.bias ? size_t(p.n) * elem_size(p.bias_type()) : 0;
  // Allocator blocks are at least 256-aligned: an offset of p.align gives exactly that alignment.
  const size_t off = p.align < 256 ? size_t(p.align) : 0;
  Scratch sa(bytes_a + 256), sb(bytes_b + 256), sc(bytes_c ? bytes_c + 256 : 0), sd(bytes_d + 256),
      sbias(bytes_bias ? bytes_bias + 256 : 0);
  // Block scales of 1 (the timing does not depend on their values).
  const int64_t scales_a = gemm_scale_count(p.a_scale, p.m, p.k), scales_b = gemm_scale_count(p.b_scale, p.n, p.k);
  Scratch ssa(size_t(scales_a) * sizeof(float)), ssb(size_t(scales_b) * sizeof(float));
  for (auto [buf, count] : {std::pair{&ssa, scales_a}, std::pair{&ssb, scales_b}})
    if (count) {
      const std::vector<float> ones(size_t(count), 1.0f);
      copy_to_device(buf->get(), ones.data(), ones.size() * sizeof(float));
    }
  if (block_scaled(p)) set_scale_pointers(pl, ssa.get(), ssb.get());
  char* A = sa.as<char>() + off;
  char* B = sb.as<char>() + off;
  char* C = bytes_c ? sc.as<char>() + off : nullptr;
  char* D = sd.as<char>() + off;
  char* bias = bytes_bias ? sbias.as<char>() + off : nullptr;
  fill_random(A, bytes_a, p.ab, 1);
  fill_random(B, bytes_b, p.b_type(), 2);
  if (C) fill_random(C, bytes_c, p.cd, 3);
  if (bias) fill_random(bias, bytes_bias, p.bias_type(), 4);
  PRIMUS_CUDA_CHECK(cudaMemsetAsync(D, 0, bytes_d, stream()));
  if (p.bias) set_bias_pointer(pl, bias);
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  const void* c_ptr = p.accumulate ? static_cast<const void*>(C) : D;

  GemmTuneResult r;
  r.key = pl.key;
  const int count = std::min<int>(std::max(max_candidates, 1), int(pl.heuristic.size()));
  for (int i = 0; i < count; ++i) {
    const cublasLtMatmulAlgo_t& algo = pl.heuristic[size_t(i)].algo;
    GemmCandidateTime t;
    t.index = i;
    t.algo = describe(algo, pl.key);
    // A candidate cuBLASLt refuses to run is skipped, not fatal: the others may run.
    const cublasStatus_t first = run_matmul(s, pl, algo, alpha, A, B, beta, c_ptr, D, stream());
    if (first != CUBLAS_STATUS_SUCCESS) {
      t.ms = -1;
      log::debug("GEMM {}: candidate {} ({}) does not run: {}", pl.key, i, t.algo, cublasLtGetStatusName(first));
    } else {
      PRIMUS_CUDA_CHECK(cudaStreamSynchronize(stream()));  // a fault shows here, named, not in the next time
      t.ms = time_ms(
          [&] {
            lt_check(run_matmul(s, pl, algo, alpha, A, B, beta, c_ptr, D, stream()), "cublasLtMatmul (tuning)",
                     pl.key);
          },
          warmup, iters);
    }
    r.candidates.push_back(std::move(t));
  }
  synchronize();  // the scratch blocks return to the allocator only after the last run
  for (size_t i = 0; i < r.candidates.size(); ++i)
    if (r.candidates[i].ms >= 0 && (r.best < 0 || r.candidates[i].ms < r.candidates[size_t(r.best)].ms))
      r.best = int(i);
  if (r.best < 0) fail("GEMM {}: none of the {} cuBLASLt candidates ran", pl.key, count);
  r.heuristic_ms = r.candidates.front().ms;
  r.best_ms = r.candidates[size_t(r.best)].ms;
  if (record) {
    TunedEntry e;
    e.algo = pl.heuristic[size_t(r.candidates[size_t(r.best)].index)].algo;
    e.ms = r.best_ms;
    e.tflops = r.best_ms > 0 ? p.flops() / (r.best_ms * 1e9) : 0;
    s.tuned[pl.key] = e;
    ++s.epoch;
  }
  return r;
}

}  // namespace

void gemm(const GemmProblem& problem, float alpha, const void* A, const void* B, float beta, const void* C, void* D,
          const void* bias, cudaStream_t stream) {
  gemm(problem, alpha, A, nullptr, B, nullptr, beta, C, D, bias, stream);
}

void gemm(const GemmProblem& problem, float alpha, const void* A, const float* scale_a, const void* B,
          const float* scale_b, float beta, const void* C, void* D, const void* bias, cudaStream_t stream) {
  GemmProblem p = problem;
  p.align = 256;
  p = normalized(p);
  if (block_scaled(p) != (scale_a && scale_b) || (!block_scaled(p) && (scale_a || scale_b)))
    fail("GEMM {}: block scales are given {} and {} for A scaled by {} and B by {}", p.key(),
         scale_a ? "for A" : "not for A", scale_b ? "for B" : "not for B", gemm_scale_name(p.a_scale),
         gemm_scale_name(p.b_scale));
  auto need = [&](const void* ptr, const char* name, GemmType t) {
    if (!ptr) fail("GEMM {}: {} is null", p.key(), name);
    if (size_t(pointer_alignment(ptr)) < elem_size(t))
      fail("GEMM {}: {} = {} is not aligned to its {} elements ({} bytes)", p.key(), name, ptr, gemm_type_name(t),
           elem_size(t));
    p.align = std::min(p.align, pointer_alignment(ptr));
  };
  need(A, "A", p.ab);
  need(B, "B", p.b_type());
  need(D, "D", p.cd);
  if (p.accumulate) need(C, "C", p.cd);
  if (p.bias) need(bias, "bias", p.bias_type());
  for (const auto& [scale, name] : {std::pair{scale_a, "A"}, std::pair{scale_b, "B"}})
    if (scale && pointer_alignment(scale) < 16)
      fail("GEMM {}: {}'s block scales at {} are not 16-byte aligned", p.key(), name, static_cast<const void*>(scale));
  if (p.accumulate && C == D && p.ldc != p.ldd)
    fail("GEMM {}: accumulating in place (C == D) needs ldc == ldd", p.key());
  const float beta_used = p.accumulate ? beta : 0.0f;
  const void* c_ptr = p.accumulate ? C : D;

  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ensure_handle(s);
  if (!stream) stream = cuda::stream();
  Plan& pl = get_plan(s, p);
  if (s.online && !pl.online_tried && !s.tuned.count(pl.key)) {
    pl.online_tried = true;
    const GemmTuneResult r = tune_plan(s, pl, s.online_max, 2, 5, true);
    log::debug("GEMM {}: tuned online, {:.3f} ms (heuristic {:.3f} ms)", pl.key, r.best_ms, r.heuristic_ms);
  }
  if (pl.epoch != s.epoch) resolve(s, pl);
  if (p.bias) set_bias_pointer(pl, bias);
  if (block_scaled(p)) set_scale_pointers(pl, scale_a, scale_b);
  lt_check(run_matmul(s, pl, pl.algo, alpha, A, B, beta_used, c_ptr, D, stream), "cublasLtMatmul", pl.key);
}

GemmTuneResult tune_gemm(const GemmProblem& problem, int max_candidates, int warmup, int iters) {
  if (max_candidates < 1) fail("tune_gemm: max_candidates must be at least 1, got {}", max_candidates);
  if (warmup < 0) fail("tune_gemm: warmup must be >= 0, got {}", warmup);
  if (iters < 1) fail("tune_gemm: iters must be at least 1, got {}", iters);
  const GemmProblem p = normalized(problem);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ensure_handle(s);
  Plan& pl = get_plan(s, p);
  GemmTuneResult r = tune_plan(s, pl, max_candidates, warmup, iters, true);
  return r;
}

int load_gemm_cache(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read GEMM cache {}: {}", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  const GemmCacheFile f = parse_gemm_cache(text.str(), path);
  if (!initialized()) fail("load_gemm_cache({}): call cuda::init() first: the cache is checked against the GPU", path);
  const std::string device = device_info().name;
  const int64_t version = int64_t(cublasLtGetVersion());
  if (f.device != device) {
    log::warn("GEMM cache {} was tuned on {}, this GPU is {}: its {} entries are ignored (tune this GPU with "
              "primus-cli direct -- benchmark gemm --tune --shapes-from <config>)",
              path, f.device, device, f.entries.size());
    return 0;
  }
  if (f.cublaslt_version != version) {
    log::warn("GEMM cache {} was tuned with cuBLASLt {}, this is cuBLASLt {}: its {} entries are ignored (an "
              "algorithm is only valid for the version that chose it; tune again)",
              path, f.cublaslt_version, version, f.entries.size());
    return 0;
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const auto& e : f.entries) {
    TunedEntry t;
    std::memcpy(&t.algo, e.algo.data(), sizeof(t.algo));
    t.ms = e.ms;
    t.tflops = e.tflops;
    s.tuned[e.key] = t;
  }
  ++s.epoch;
  return int(f.entries.size());
}

void save_gemm_cache(const std::string& path) {
  if (!initialized()) fail("save_gemm_cache({}): call cuda::init() first: the cache records the GPU", path);
  GemmCacheFile f;
  f.device = device_info().name;
  f.cublaslt_version = int64_t(cublasLtGetVersion());
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    for (const auto& [key, t] : s.tuned) {
      GemmCacheEntry e;
      e.key = key;
      std::memcpy(e.algo.data(), &t.algo, sizeof(t.algo));
      e.ms = t.ms;
      e.tflops = t.tflops;
      f.entries.push_back(std::move(e));
    }
  }
  // Written beside and renamed: a reader never sees half a file.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write GEMM cache {}: {}", tmp, std::strerror(errno));
    out << gemm_cache_to_json(f);
    out.close();
    if (!out) fail("cannot write GEMM cache {}: {}", tmp, std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("cannot write GEMM cache {}: renaming {} failed: {}", path, tmp, ec.message());
}

int64_t cublaslt_version() { return int64_t(cublasLtGetVersion()); }

GemmType gemm_type(fp8::Format f) { return f == fp8::Format::E4M3 ? GemmType::E4M3 : GemmType::E5M2; }

std::optional<GemmScale> gemm_scale(fp8::Granularity g) {
  switch (g) {
    case fp8::Granularity::Tensor: return GemmScale::Tensor;
    case fp8::Granularity::Tile1x128: return GemmScale::Vec128;
    case fp8::Granularity::Block128: return GemmScale::Blk128;
    case fp8::Granularity::Mx32: return std::nullopt;
  }
  return std::nullopt;
}

const char* fp8_gemm_refusal(const fp8::OperandKind& a, const fp8::OperandKind& b, int64_t m, int64_t n) {
  const DeviceInfo& g = device_info();
  const fp8::Granularity ga = a.granularity, gb = b.granularity;
  const bool tensor = ga == fp8::Granularity::Tensor && gb == fp8::Granularity::Tensor;
  if (ga == fp8::Granularity::Mx32 || gb == fp8::Granularity::Mx32)
    return "the operands are MXFP8's (cuBLASLt's VEC32_UE8M0 mode needs sm_100, not built here)";
  if (tensor && g.cc_major * 10 + g.cc_minor < 89)
    return "the GPU is older than sm_89 (cuBLASLt's FP8 kernels need 8.9)";
  if (!tensor) {
    if (g.cc_major != 9 || g.cc_minor != 0)
      return "the GPU is not sm_90 (cuBLASLt's block-scaled FP8 modes VEC128_32F and BLK128x128_32F are Hopper's)";
    if (cublaslt_version() < 120900) return "cuBLASLt is older than 12.9 (its block-scaled FP8 modes came in 12.9)";
    if (ga == fp8::Granularity::Tensor || gb == fp8::Granularity::Tensor)
      return "one operand is tensor-scaled and the other block-scaled (not a cuBLASLt combination)";
    if (ga == fp8::Granularity::Block128 && gb == fp8::Granularity::Block128)
      return "both operands are in 128 x 128 blocks (cuBLASLt takes 1 x 128 x 1 x 128, 1 x 128 x 128 x 128 and "
             "128 x 128 x 1 x 128)";
  }
  if (a.format == fp8::Format::E5M2 && b.format == fp8::Format::E5M2)
    return "both operands are E5M2 (not an FP8 combination of cuBLASLt)";
  if (!tensor && n % 8)
    return "the output's rows are not a multiple of 8 elements (cuBLASLt's block-scaled FP8 needs its m, D's rows, "
           "a multiple of 8)";
  if (ga == fp8::Granularity::Tile1x128 && m % 8)
    return "the output has a number of rows that is not a multiple of 8 while A is in 1 x 128 tiles (cuBLASLt's "
           "block-scaled FP8 needs its n a multiple of 8 when its B is VEC128_32F)";
  return nullptr;
}

GemmProblem fp8_gemm_problem(GemmProblem p, const fp8::OperandKind& a, const fp8::OperandKind& b) {
  const std::optional<GemmScale> sa = gemm_scale(a.granularity), sb = gemm_scale(b.granularity);
  PRIMUS_CHECK(sa && sb, "fp8_gemm_problem: {} x {} operands have no cuBLASLt scale mode",
               fp8::granularity_name(a.granularity), fp8::granularity_name(b.granularity));
  const int64_t k16 = (p.k + 15) / 16 * 16;
  p.trans_a = false, p.trans_b = true;
  p.k = k16, p.lda = k16, p.ldb = k16;
  p.ab = gemm_type(a.format);
  p.b = gemm_type(b.format);
  p.a_scale = *sa, p.b_scale = *sb;
  return p;
}

void set_online_tuning(bool on, int max_candidates) {
  if (max_candidates < 1) fail("set_online_tuning: max_candidates must be at least 1, got {}", max_candidates);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.online = on;
  s.online_max = max_candidates;
}

int gemm_cache_size() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return int(s.tuned.size());
}

void clear_gemm_cache() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.tuned.clear();
  s.warned.clear();
  for (auto& [k, pl] : s.plans) pl->online_tried = false;
  ++s.epoch;
}

double measure_bf16_peak_tflops(int n) {
  if (n <= 0) fail("measure_bf16_peak_tflops: n must be positive, got {}", n);
  GemmProblem p;
  p.m = p.n = p.k = n;
  p.trans_b = true;  // x W^T, the forward GEMMs' layout
  p = normalized(p);
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ensure_handle(s);
  Plan& pl = get_plan(s, p);
  const GemmTuneResult r = tune_plan(s, pl, 8, 3, 10, false);
  return r.best_ms > 0 ? p.flops() / (r.best_ms * 1e9) : 0;
}

}  // namespace primus::cuda
