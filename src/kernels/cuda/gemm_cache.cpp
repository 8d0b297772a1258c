// The parts of the GEMM layer that need no GPU: problem keys, problem checks and the cache file
// format (gemm.h). Kept apart from gemm.cpp so that the reasoning here is testable anywhere.
#include <cinttypes>
#include <cstdio>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "kernels/cuda/gemm.h"

namespace primus::cuda {

const char* gemm_type_name(GemmType t) {
  switch (t) {
    case GemmType::BF16: return "bf16";
    case GemmType::F32: return "fp32";
    case GemmType::E4M3: return "e4m3";
    case GemmType::E5M2: return "e5m2";
  }
  return "?";
}

const char* gemm_scale_name(GemmScale s) {
  switch (s) {
    case GemmScale::Tensor: return "tensor";
    case GemmScale::Vec128: return "vec128";
    case GemmScale::Blk128: return "blk128";
  }
  return "?";
}

int64_t gemm_scale_count(GemmScale s, int64_t outer, int64_t k) {
  const int64_t kb = (k + 127) / 128;
  switch (s) {
    case GemmScale::Tensor: return 0;
    case GemmScale::Vec128: return kb * outer;
    case GemmScale::Blk128: return (outer + 127) / 128 * ((kb + 3) / 4 * 4);
  }
  return 0;
}

std::string GemmProblem::key() const {
  const bool blocks = a_scale != GemmScale::Tensor || b_scale != GemmScale::Tensor;
  const std::string a_b = blocks          ? fmt::format("{}.{}x{}.{}", gemm_type_name(ab), gemm_scale_name(a_scale),
                                                        gemm_type_name(b_type()), gemm_scale_name(b_scale))
                          : b && *b != ab ? fmt::format("{}x{}", gemm_type_name(ab), gemm_type_name(*b))
                                          : std::string(gemm_type_name(ab));
  return fmt::format("{}:{}:{}{}:m{}:n{}:k{}:lda{}:ldb{}:ldc{}:ldd{}:bias{}:acc{}:al{}", a_b, gemm_type_name(cd),
                     trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, lda, ldb, ldc, ldd, int(bias), int(accumulate),
                     align);
}

GemmProblem normalized(GemmProblem p) {
  // The problem as messages name it; built only on failure (gemm() normalizes on every call).
  auto what = [&] {
    return fmt::format("GEMM {}{} m={} n={} k={}", p.trans_a ? 'T' : 'N', p.trans_b ? 'T' : 'N', p.m, p.n, p.k);
  };
  if (p.m <= 0) fail("{}: m must be positive, got {}", what(), p.m);
  if (p.n <= 0) fail("{}: n must be positive, got {}", what(), p.n);
  if (p.k <= 0) fail("{}: k must be positive, got {}", what(), p.k);
  if (p.b && *p.b == p.ab) p.b.reset();
  if (is_fp8(p.cd)) fail("{}: C and D must be bf16 or fp32, got {}", what(), gemm_type_name(p.cd));
  if (is_fp8(p.ab) != is_fp8(p.b_type()))
    fail("{}: A is {} and B is {}: FP8 needs both operands in FP8", what(), gemm_type_name(p.ab),
         gemm_type_name(p.b_type()));
  if (p.b && !is_fp8(p.ab))
    fail("{}: A is {} and B is {}: only FP8 operands may differ in type", what(), gemm_type_name(p.ab),
         gemm_type_name(*p.b));
  if (p.ab == GemmType::E5M2 && p.b_type() == GemmType::E5M2)
    fail("{}: E5M2 x E5M2 is not an FP8 combination of cuBLASLt (one operand must be E4M3)", what());
  if (is_fp8(p.ab) && (p.trans_a || !p.trans_b))
    fail("{}: FP8 GEMMs take A [m, k] and B [n, k] (trans_a false, trans_b true): cuBLASLt's FP8 kernels need the "
         "TN format",
         what());
  const bool a_blocks = p.a_scale != GemmScale::Tensor, b_blocks = p.b_scale != GemmScale::Tensor;
  if ((a_blocks || b_blocks) && !is_fp8(p.ab))
    fail("{}: block scales ({} x {}) need FP8 operands, not {}", what(), gemm_scale_name(p.a_scale),
         gemm_scale_name(p.b_scale), gemm_type_name(p.ab));
  if (a_blocks != b_blocks)
    fail("{}: A is scaled by {} and B by {}: cuBLASLt's block-scaled modes take both operands block-scaled", what(),
         gemm_scale_name(p.a_scale), gemm_scale_name(p.b_scale));
  if (p.a_scale == GemmScale::Blk128 && p.b_scale == GemmScale::Blk128)
    fail("{}: both operands in 128 x 128 blocks: cuBLASLt takes vec128 x vec128, vec128 x blk128 and blk128 x vec128",
         what());
  if (a_blocks && p.n % 8) fail("{}: block-scaled FP8 needs n (D's rows) a multiple of 8, got {}", what(), p.n);
  if (p.a_scale == GemmScale::Vec128 && p.m % 8)
    fail("{}: block-scaled FP8 with A in 1 x 128 tiles needs m a multiple of 8, got {}", what(), p.m);
  if (p.ab == GemmType::F32 && p.cd == GemmType::BF16)
    fail("{}: fp32 A and B need fp32 C and D (bf16 C/D is supported with bf16 A/B only)", what());
  // Row-major: the leading dimension is the length of a stored row.
  auto leading = [&](int64_t& ld, int64_t row, const char* ld_name, const char* matrix) {
    if (ld == 0) {
      ld = row;
    } else if (ld < row) {
      std::string shape;
      if (matrix[0] == 'A')
        shape = p.trans_a ? fmt::format("[k={}, m={}] (trans_a)", p.k, p.m) : fmt::format("[m={}, k={}]", p.m, p.k);
      else if (matrix[0] == 'B')
        shape = p.trans_b ? fmt::format("[n={}, k={}] (trans_b)", p.n, p.k) : fmt::format("[k={}, n={}]", p.k, p.n);
      else
        shape = fmt::format("[m={}, n={}]", p.m, p.n);
      fail("{}: {}={} is too small: {} is stored row-major as {}, so {} must be >= {}", what(), ld_name, ld, matrix,
           shape, ld_name, row);
    }
  };
  leading(p.lda, p.trans_a ? p.m : p.k, "lda", "A");
  leading(p.ldb, p.trans_b ? p.k : p.n, "ldb", "B");
  leading(p.ldd, p.n, "ldd", "D");
  if (p.accumulate) leading(p.ldc, p.n, "ldc", "C");
  else p.ldc = p.ldd;  // C is not read: one canonical key
  if (is_fp8(p.ab) && (p.lda % 16 || p.ldb % 16))
    fail("{}: FP8 needs lda and ldb multiples of 16 (16 bytes), got lda={} ldb={}", what(), p.lda, p.ldb);
  if (p.align <= 0 || p.align > 256 || (p.align & (p.align - 1)))
    fail("{}: align must be a power of two between 1 and 256 bytes, got {}", what(), p.align);
  return p;
}

// ---- the cache file ----

namespace {

constexpr const char* kFormat = "primus-gemm-cache";
constexpr int kVersion = 1;

std::string hex_word(uint64_t v) { return fmt::format("{:016x}", v); }

bool parse_hex_word(const std::string& s, uint64_t& out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = (v << 4) | uint64_t(d);
  }
  out = v;
  return true;
}

}  // namespace

std::string gemm_cache_to_json(const GemmCacheFile& f) {
  nlohmann::ordered_json entries = nlohmann::ordered_json::array();
  for (const auto& e : f.entries) {
    nlohmann::ordered_json algo = nlohmann::ordered_json::array();
    for (uint64_t w : e.algo) algo.push_back(hex_word(w));
    entries.push_back({{"key", e.key}, {"algo", algo}, {"ms", e.ms}, {"tflops", e.tflops}});
  }
  nlohmann::ordered_json j = {{"format", kFormat},
                              {"version", kVersion},
                              {"device", f.device},
                              {"cublaslt_version", f.cublaslt_version},
                              {"entries", entries}};
  return j.dump(1) + "\n";
}

GemmCacheFile parse_gemm_cache(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("GEMM cache {}: not valid JSON: {}", source, e.what());
  }
  if (!j.is_object()) fail("GEMM cache {}: expected a JSON object at the top level", source);
  auto field = [&](const nlohmann::json& obj, const char* name, const std::string& where) -> const nlohmann::json& {
    auto it = obj.find(name);
    if (it == obj.end()) fail("GEMM cache {}: {} has no \"{}\" field", source, where, name);
    return *it;
  };
  const auto& format = field(j, "format", "the file");
  if (!format.is_string() || format.get<std::string>() != kFormat)
    fail("GEMM cache {}: \"format\" is {}, expected \"{}\": not a Primus GEMM cache", source, format.dump(), kFormat);
  const auto& version = field(j, "version", "the file");
  if (!version.is_number_integer() || version.get<int64_t>() != kVersion)
    fail("GEMM cache {}: version {} is not supported (this build reads version {})", source, version.dump(), kVersion);
  GemmCacheFile f;
  const auto& device = field(j, "device", "the file");
  if (!device.is_string()) fail("GEMM cache {}: \"device\" must be a string, got {}", source, device.dump());
  f.device = device.get<std::string>();
  const auto& ver = field(j, "cublaslt_version", "the file");
  if (!ver.is_number_integer())
    fail("GEMM cache {}: \"cublaslt_version\" must be an integer, got {}", source, ver.dump());
  f.cublaslt_version = ver.get<int64_t>();
  const auto& entries = field(j, "entries", "the file");
  if (!entries.is_array()) fail("GEMM cache {}: \"entries\" must be an array", source);
  std::set<std::string> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const std::string where = fmt::format("entry {}", i);
    if (!e.is_object()) fail("GEMM cache {}: {} must be an object, got {}", source, where, e.dump());
    GemmCacheEntry out;
    const auto& key = field(e, "key", where);
    if (!key.is_string() || key.get<std::string>().empty())
      fail("GEMM cache {}: {}: \"key\" must be a non-empty string, got {}", source, where, key.dump());
    out.key = key.get<std::string>();
    const std::string named = fmt::format("{} ({})", where, out.key);
    if (!seen.insert(out.key).second) fail("GEMM cache {}: {}: the key appears twice", source, named);
    const auto& algo = field(e, "algo", named);
    if (!algo.is_array() || algo.size() != out.algo.size())
      fail("GEMM cache {}: {}: \"algo\" must be an array of {} hex strings (cublasLtMatmulAlgo_t), got {}", source,
           named, out.algo.size(), algo.dump());
    for (size_t w = 0; w < out.algo.size(); ++w)
      if (!algo[w].is_string() || !parse_hex_word(algo[w].get<std::string>(), out.algo[w]))
        fail("GEMM cache {}: {}: \"algo\" word {} must be 16 hex digits, got {}", source, named, w, algo[w].dump());
    const auto& ms = field(e, "ms", named);
    if (!ms.is_number() || !(ms.get<double>() >= 0))
      fail("GEMM cache {}: {}: \"ms\" must be a non-negative number, got {}", source, named, ms.dump());
    out.ms = ms.get<double>();
    if (auto t = e.find("tflops"); t != e.end()) {  // informative: not needed to use the entry
      if (!t->is_number()) fail("GEMM cache {}: {}: \"tflops\" must be a number, got {}", source, named, t->dump());
      out.tflops = t->get<double>();
    }
    f.entries.push_back(std::move(out));
  }
  return f;
}

}  // namespace primus::cuda
