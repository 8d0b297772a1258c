// cuBLASLt GEMM (kernels/cuda/gemm.h): every combination the model runs, on small odd shapes with
// leading dimensions wider than the rows, against a double-precision host reference on the same
// bf16-rounded inputs; tuning, online tuning and the cache file. The problem keys, the checks of
// normalized() and the cache file parser need no GPU and run everywhere.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "gpu_test_util.h"
#include "kernels/cuda/gemm.h"

namespace primus {
namespace {

using cuda::GemmProblem;
using cuda::GemmType;
using gputest::expect_close;

// Runs fn, expects a primus::Error whose message holds every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected one mentioning " << *parts.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// ---------------------------------------------------------------- no GPU needed

TEST(GemmKey, EveryFieldChangesTheKey) {
  GemmProblem base;
  base.m = 64, base.n = 32, base.k = 16;
  base = cuda::normalized(base);
  std::set<std::string> keys{base.key()};
  auto variant = [&](auto change) {
    GemmProblem p = base;
    change(p);
    EXPECT_TRUE(keys.insert(cuda::normalized(p).key()).second) << cuda::normalized(p).key();
  };
  variant([](GemmProblem& p) { p.trans_a = true, p.lda = 0; });
  variant([](GemmProblem& p) { p.trans_b = true, p.ldb = 0; });
  variant([](GemmProblem& p) { p.m = 65; });
  variant([](GemmProblem& p) { p.n = 33, p.ldb = 0, p.ldc = 0, p.ldd = 0; });
  variant([](GemmProblem& p) { p.k = 17, p.lda = 0; });
  variant([](GemmProblem& p) { p.lda = 40; });
  variant([](GemmProblem& p) { p.ldb = 40; });
  variant([](GemmProblem& p) { p.ldd = 40, p.ldc = 40; });
  variant([](GemmProblem& p) { p.accumulate = true, p.ldc = 48; });
  variant([](GemmProblem& p) { p.cd = GemmType::F32; });
  variant([](GemmProblem& p) { p.ab = GemmType::F32, p.cd = GemmType::F32, p.ldc = 0; });
  variant([](GemmProblem& p) { p.bias = true; });
  variant([](GemmProblem& p) { p.align = 16; });
  EXPECT_EQ(keys.size(), 14u);
  EXPECT_EQ(base.key(), "bf16:bf16:NN:m64:n32:k16:lda16:ldb32:ldc32:ldd32:bias0:acc0:al256");
}

TEST(GemmNormalized, FillsTightLeadingDimensions) {
  GemmProblem p;
  p.m = 3, p.n = 5, p.k = 7;
  GemmProblem q = cuda::normalized(p);
  EXPECT_EQ(q.lda, 7);
  EXPECT_EQ(q.ldb, 5);
  EXPECT_EQ(q.ldd, 5);
  EXPECT_EQ(q.ldc, 5);  // not read without accumulate: set to ldd
  p.trans_a = p.trans_b = true;
  q = cuda::normalized(p);
  EXPECT_EQ(q.lda, 3);  // A stored [k, m]
  EXPECT_EQ(q.ldb, 7);  // B stored [n, k]
  p.accumulate = true;
  p.ldc = 9;
  p.ldd = 6;
  q = cuda::normalized(p);
  EXPECT_EQ(q.ldc, 9);
  EXPECT_EQ(q.ldd, 6);
  // Without accumulate a given ldc does not split the key.
  p.accumulate = false;
  EXPECT_EQ(cuda::normalized(p).ldc, 6);
}

TEST(GemmNormalized, RejectsBadProblems) {
  auto with = [](auto change) {
    GemmProblem p;
    p.m = 8, p.n = 8, p.k = 8;
    change(p);
    return p;
  };
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.m = 0; })); }, {"m must be positive", "0"});
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.n = -3; })); }, {"n must be positive", "-3"});
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.k = 0; })); }, {"k must be positive"});
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.lda = 4; })); }, {"lda=4", "A", ">= 8"});
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.trans_a = true, p.m = 12, p.lda = 8; })); },
               {"lda=8", "trans_a", ">= 12"});
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.ldb = -1; })); }, {"ldb=-1"});
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.ldd = 7; })); }, {"ldd=7", "D"});
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.accumulate = true, p.ldc = 2; })); }, {"ldc=2", "C"});
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.ab = GemmType::F32; })); }, {"fp32 A and B"});
  expect_error([&] { cuda::normalized(with([](GemmProblem& p) { p.align = 24; })); }, {"align", "24"});
}

// FP8 problems: cuBLASLt's rules on sm_90, by name (gemm.h); B's type shows in the key when it
// differs from A's.
TEST(GemmNormalized, Fp8ProblemsFollowCublasLtsRules) {
  auto fp8 = [](auto change) {
    GemmProblem p;
    p.m = 8, p.n = 32, p.k = 32, p.trans_b = true;
    p.ab = GemmType::E5M2, p.b = GemmType::E4M3;
    change(p);
    return p;
  };
  const GemmProblem ok = cuda::normalized(fp8([](GemmProblem&) {}));
  EXPECT_EQ(ok.key().substr(0, 20), "e5m2xe4m3:bf16:NT:m8");
  EXPECT_EQ(
      cuda::normalized(fp8([](GemmProblem& p) { p.b = GemmType::E5M2, p.ab = GemmType::E4M3; })).key().substr(0, 15),
      "e4m3xe5m2:bf16:");
  EXPECT_FALSE(cuda::normalized(fp8([](GemmProblem& p) { p.ab = GemmType::E4M3; })).b.has_value());  // one type: no 'x'
  expect_error([&] { cuda::normalized(fp8([](GemmProblem& p) { p.b = GemmType::E5M2; })); }, {"E5M2 x E5M2"});
  expect_error([&] { cuda::normalized(fp8([](GemmProblem& p) { p.trans_b = false; })); }, {"TN", "trans_b true"});
  expect_error([&] { cuda::normalized(fp8([](GemmProblem& p) { p.trans_a = true, p.lda = 8; })); }, {"TN"});
  expect_error([&] { cuda::normalized(fp8([](GemmProblem& p) { p.k = 24; })); }, {"multiples of 16", "lda=24"});
  expect_error([&] { cuda::normalized(fp8([](GemmProblem& p) { p.b = GemmType::BF16; })); }, {"both operands in FP8"});
  expect_error([&] { cuda::normalized(fp8([](GemmProblem& p) { p.cd = GemmType::E4M3; })); }, {"bf16 or fp32"});
  expect_error([&] { cuda::normalized(fp8([](GemmProblem& p) { p.ab = GemmType::BF16, p.b = GemmType::F32; })); },
               {"only FP8 operands"});
}

// Block-scaled FP8 problems (gemm.h): both operands block-scaled, not both in 128 x 128 blocks,
// n a multiple of 8 and m too when A is in 1 x 128 tiles; the modes show in the key, and the
// scale counts follow cuBLASLt's layouts (docs/cuda.md).
TEST(GemmNormalized, BlockScaledFp8ProblemsFollowCublasLtsRules) {
  using cuda::GemmScale;
  auto blocks = [](auto change) {
    GemmProblem p;
    p.m = 24, p.n = 40, p.k = 208, p.trans_b = true;
    p.ab = GemmType::E4M3, p.b = GemmType::E4M3;
    p.a_scale = GemmScale::Vec128, p.b_scale = GemmScale::Blk128;
    change(p);
    return p;
  };
  const GemmProblem ok = cuda::normalized(blocks([](GemmProblem&) {}));
  EXPECT_EQ(ok.key().substr(0, 38), "e4m3.vec128xe4m3.blk128:bf16:NT:m24:n4");
  EXPECT_EQ(cuda::normalized(blocks([](GemmProblem& p) { p.ab = GemmType::E5M2, p.b_scale = GemmScale::Vec128; }))
                .key()
                .substr(0, 24),
            "e5m2.vec128xe4m3.vec128:");
  EXPECT_NE(ok.key(), cuda::normalized(blocks([](GemmProblem& p) {
                        p.a_scale = GemmScale::Blk128, p.b_scale = GemmScale::Vec128;
                      })).key());
  expect_error([&] { cuda::normalized(blocks([](GemmProblem& p) { p.a_scale = GemmScale::Blk128; })); },
               {"both operands in 128 x 128 blocks"});
  expect_error([&] { cuda::normalized(blocks([](GemmProblem& p) { p.b_scale = GemmScale::Tensor; })); },
               {"vec128", "tensor", "both operands block-scaled"});
  expect_error([&] { cuda::normalized(blocks([](GemmProblem& p) { p.ab = GemmType::BF16, p.b.reset(); })); },
               {"need FP8 operands"});
  expect_error([&] { cuda::normalized(blocks([](GemmProblem& p) { p.n = 36, p.ldb = 0; })); },
               {"n (D's rows) a multiple of 8", "36"});
  expect_error([&] { cuda::normalized(blocks([](GemmProblem& p) { p.m = 20; })); }, {"m a multiple of 8", "20"});
  EXPECT_NO_THROW(cuda::normalized(
      blocks([](GemmProblem& p) { p.m = 20, p.a_scale = GemmScale::Blk128, p.b_scale = GemmScale::Vec128; })));
  // The scales a 1 x 128 operand of 40 rows and a 128 x 128 one of 300 rows read for k = 300.
  EXPECT_EQ(cuda::gemm_scale_count(GemmScale::Vec128, 40, 300), 3 * 40);
  EXPECT_EQ(cuda::gemm_scale_count(GemmScale::Blk128, 300, 300), 3 * 4);
  EXPECT_EQ(cuda::gemm_scale_count(GemmScale::Blk128, 40, 640), 8);
  EXPECT_EQ(cuda::gemm_scale_count(GemmScale::Tensor, 40, 300), 0);
}

cuda::GemmCacheFile sample_cache() {
  cuda::GemmCacheFile f;
  f.device = "NVIDIA H100 80GB HBM3";
  f.cublaslt_version = 130100;
  cuda::GemmCacheEntry e;
  e.key = "bf16:bf16:NT:m8192:n6144:k4096:lda4096:ldb4096:ldc6144:ldd6144:bias0:acc0:al256";
  e.algo = {1, 2, 0xdeadbeefcafef00dull, 0, ~uint64_t(0), 5, 6, 7};
  e.ms = 0.7125;
  e.tflops = 578.9;
  f.entries.push_back(e);
  e.key = "bf16:fp32:TN:m4096:n14336:k8192:lda4096:ldb14336:ldc14336:ldd14336:bias0:acc1:al256";
  e.algo = {9, 8, 7, 6, 5, 4, 3, 2};
  e.ms = 1.5;
  e.tflops = 640;
  f.entries.push_back(e);
  return f;
}

TEST(GemmCacheFile, RoundTrip) {
  const cuda::GemmCacheFile f = sample_cache();
  const std::string text = cuda::gemm_cache_to_json(f);
  EXPECT_NE(text.find("\"format\": \"primus-gemm-cache\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"deadbeefcafef00d\""), std::string::npos) << text;
  const cuda::GemmCacheFile g = cuda::parse_gemm_cache(text, "x.json");
  EXPECT_EQ(g.device, f.device);
  EXPECT_EQ(g.cublaslt_version, f.cublaslt_version);
  ASSERT_EQ(g.entries.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(g.entries[i].key, f.entries[i].key);
    EXPECT_EQ(g.entries[i].algo, f.entries[i].algo);
    EXPECT_DOUBLE_EQ(g.entries[i].ms, f.entries[i].ms);
    EXPECT_DOUBLE_EQ(g.entries[i].tflops, f.entries[i].tflops);
  }
  // An empty cache is valid, and tflops is optional.
  EXPECT_TRUE(cuda::parse_gemm_cache(cuda::gemm_cache_to_json({"GPU", 1, {}}), "e.json").entries.empty());
  const std::string no_tflops = R"({"format":"primus-gemm-cache","version":1,"device":"GPU","cublaslt_version":1,
    "entries":[{"key":"k","algo":["0","0","0","0","0","0","0","0"],"ms":1}]})";
  expect_error([&] { cuda::parse_gemm_cache(no_tflops, "t.json"); }, {"t.json", "word 0", "16 hex digits"});
  std::string ok = no_tflops;
  for (size_t at; (at = ok.find("\"0\"")) != std::string::npos;) ok.replace(at, 3, "\"00000000000000AF\"");
  EXPECT_EQ(cuda::parse_gemm_cache(ok, "t.json").entries.at(0).algo[3], 0xafu);
}

TEST(GemmCacheFile, MalformedFilesAreErrorsNamingFileAndField) {
  const std::string good = cuda::gemm_cache_to_json(sample_cache());
  nlohmann::json j = nlohmann::json::parse(good);
  auto edited = [&](auto change) {
    nlohmann::json c = j;
    change(c);
    return c.dump();
  };
  const std::string f = "/tmp/cache.json";
  expect_error([&] { cuda::parse_gemm_cache("{ not json", f); }, {f, "not valid JSON"});
  expect_error([&] { cuda::parse_gemm_cache("[1, 2]", f); }, {f, "object"});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["format"] = "other"; }), f); }, {f, "format"});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c.erase("format"); }), f); }, {f, "\"format\""});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["version"] = 2; }), f); }, {f, "version 2"});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c.erase("device"); }), f); }, {f, "\"device\""});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["cublaslt_version"] = "13"; }), f); },
               {f, "cublaslt_version"});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c.erase("entries"); }), f); }, {f, "\"entries\""});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["entries"] = 3; }), f); }, {f, "entries"});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["entries"][1].erase("key"); }), f); },
               {f, "entry 1", "\"key\""});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["entries"][0].erase("algo"); }), f); },
               {f, "entry 0", "\"algo\""});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["entries"][0]["algo"].erase(7); }), f); },
               {f, "entry 0", "8 hex strings"});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["entries"][0]["algo"][2] = "xyz0000000000000"; }), f); },
               {f, "word 2"});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["entries"][1].erase("ms"); }), f); },
               {f, "entry 1", "\"ms\""});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["entries"][1]["ms"] = -1; }), f); },
               {f, "\"ms\""});
  expect_error([&] { cuda::parse_gemm_cache(edited([](auto& c) { c["entries"][1]["key"] = c["entries"][0]["key"]; }), f); },
               {f, "twice"});
}

// ---------------------------------------------------------------- on the GPU

struct Case {
  std::string name;
  bool ta = false, tb = false;
  int64_t m = 37, n = 50, k = 64;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0, pad_d = 0;  // extra leading-dimension elements
  GemmType ab = GemmType::BF16, cd = GemmType::BF16;
  bool bias = false, accumulate = false, in_place = false;
  float alpha = 1.0f, beta = 0.0f;
  size_t offset_a = 0;  // elements: a pointer less aligned than 256 bytes
};

// Host data in fp32 (already rounded to the device type) and its device copy.
struct Operand {
  std::vector<float> host;
  std::unique_ptr<gputest::DeviceArray<uint16_t>> bf;
  std::unique_ptr<gputest::DeviceArray<float>> f32;
  GemmType type;
  Operand(size_t n, uint64_t seed, GemmType t, double scale = 1.0) : type(t) {
    host = gputest::random_floats(n, seed, scale);
    if (t == GemmType::BF16) {
      host = gputest::round_bf16(host);
      bf = std::make_unique<gputest::DeviceArray<uint16_t>>(gputest::to_bf16_bits(host));
    } else {
      f32 = std::make_unique<gputest::DeviceArray<float>>(host);
    }
  }
  void* get(size_t offset = 0) const {
    return bf ? static_cast<void*>(bf->get() + offset) : static_cast<void*>(f32->get() + offset);
  }
  std::vector<float> download() const { return bf ? gputest::from_bf16_bits(bf->host()) : f32->host(); }
};

struct Prepared {
  GemmProblem p;
  std::unique_ptr<Operand> A, B, C, D, bias;
  std::vector<float> d_before;
};

Prepared prepare(const Case& c) {
  Prepared r;
  GemmProblem& p = r.p;
  p.trans_a = c.ta, p.trans_b = c.tb;
  p.m = c.m, p.n = c.n, p.k = c.k;
  p.lda = (c.ta ? c.m : c.k) + c.pad_a;
  p.ldb = (c.tb ? c.k : c.n) + c.pad_b;
  p.ldd = c.n + c.pad_d;
  p.ldc = c.in_place ? p.ldd : c.n + c.pad_c;
  p.ab = c.ab, p.cd = c.cd;
  p.bias = c.bias, p.accumulate = c.accumulate;
  const size_t rows_a = size_t(c.ta ? c.k : c.m), rows_b = size_t(c.tb ? c.n : c.k);
  r.A = std::make_unique<Operand>(rows_a * size_t(p.lda) + c.offset_a, 11, c.ab);
  r.B = std::make_unique<Operand>(rows_b * size_t(p.ldb), 12, c.ab);
  r.D = std::make_unique<Operand>(size_t(c.m) * size_t(p.ldd), 13, c.cd);  // also C when in place
  if (c.accumulate && !c.in_place) r.C = std::make_unique<Operand>(size_t(c.m) * size_t(p.ldc), 14, c.cd);
  if (c.bias) r.bias = std::make_unique<Operand>(size_t(c.n), 15, c.ab);
  r.d_before = r.D->host;
  return r;
}

// What D must hold: the reference in the rows and columns, D's old values in the padding.
std::vector<float> reference(const Case& c, const Prepared& r) {
  const GemmProblem& p = r.p;
  const std::vector<float>& A = r.A->host;
  const std::vector<float>& B = r.B->host;
  const std::vector<float>& C = c.in_place ? r.d_before : (r.C ? r.C->host : r.d_before);
  std::vector<float> want = r.d_before;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double s = 0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double a = c.ta ? A[c.offset_a + size_t(kk * p.lda + i)] : A[c.offset_a + size_t(i * p.lda + kk)];
        const double b = c.tb ? B[size_t(j * p.ldb + kk)] : B[size_t(kk * p.ldb + j)];
        s += a * b;
      }
      double v = double(c.alpha) * s;
      if (c.accumulate) v += double(c.beta) * C[size_t(i * p.ldc + j)];
      if (c.bias) v += r.bias->host[size_t(j)];
      want[size_t(i * p.ldd + j)] = float(v);
    }
  return want;
}

void run_gemm(const Case& c, Prepared& r) {
  const void* C = c.accumulate ? (c.in_place ? r.D->get() : r.C->get()) : nullptr;
  cuda::gemm(r.p, c.alpha, r.A->get(c.offset_a), r.B->get(), c.beta, C, r.D->get(), c.bias ? r.bias->get() : nullptr);
  cuda::synchronize();
}

void check(const Case& c, const Prepared& r, const std::string& when) {
  const std::vector<float> got = r.D->download();
  const std::vector<float> want = reference(c, r);
  // bf16 output: the result is rounded to 8 significant bits; fp32: only the summation order differs.
  const bool bf = c.cd == GemmType::BF16;
  expect_close(got, want, bf ? 2e-2 : 1e-3, bf ? 8e-3 : 1e-4, c.name + " " + when);
}

std::vector<Case> model_cases() {
  std::vector<Case> v;
  Case c;
  c = {};
  c.name = "NT bf16 (qkv, fc1 forward)", c.tb = true, c.pad_a = 8, c.pad_b = 3, c.pad_d = 5;
  v.push_back(c);
  c = {};
  c.name = "NT bf16 + bias (qkv with bias)", c.tb = true, c.bias = true, c.pad_a = 2, c.pad_d = 6;
  v.push_back(c);
  c = {};
  c.name = "NT bf16 + residual C != D (proj, fc2 forward)", c.tb = true, c.accumulate = true, c.beta = 1.0f,
  c.pad_c = 7, c.pad_d = 2;
  v.push_back(c);
  c = {};
  c.name = "NN bf16 (input gradients)", c.pad_a = 1, c.pad_b = 4, c.pad_d = 3;
  v.push_back(c);
  c = {};
  c.name = "TN fp32 accumulate, C == D (weight gradients)", c.ta = true, c.cd = GemmType::F32, c.accumulate = true,
  c.in_place = true, c.beta = 1.0f, c.pad_a = 5, c.pad_b = 2, c.pad_d = 4;
  v.push_back(c);
  c = {};
  c.name = "NT fp32 out (logits)", c.tb = true, c.cd = GemmType::F32, c.pad_b = 6, c.pad_d = 1;
  v.push_back(c);
  c = {};
  c.name = "NN fp32 accumulate, alpha != 1 (head input grad)", c.cd = GemmType::F32, c.accumulate = true,
  c.in_place = true, c.alpha = 0.37f, c.beta = 1.0f, c.pad_a = 3, c.pad_d = 2;
  v.push_back(c);
  c = {};
  c.name = "TT fp32 everything", c.ta = true, c.tb = true, c.ab = GemmType::F32, c.cd = GemmType::F32, c.pad_a = 1,
  c.pad_b = 1, c.pad_d = 1;
  v.push_back(c);
  c = {};
  c.name = "NT bf16, A 2-byte aligned", c.tb = true, c.offset_a = 1;
  v.push_back(c);
  c = {};
  c.name = "NN bf16 residual, beta 0.5", c.accumulate = true, c.beta = 0.5f, c.m = 5, c.n = 3, c.k = 9;
  v.push_back(c);
  return v;
}

TEST(CudaGemm, EveryModelCombinationMatchesTheReference) {
  PRIMUS_REQUIRE_GPU();
  cuda::clear_gemm_cache();
  for (const Case& c : model_cases()) {
    SCOPED_TRACE(c.name);
    Prepared r = prepare(c);
    run_gemm(c, r);
    check(c, r, "heuristic");
  }
}

TEST(CudaGemm, TunedAlgorithmGivesTheSameResults) {
  PRIMUS_REQUIRE_GPU();
  cuda::clear_gemm_cache();
  for (const Case& c : model_cases()) {
    SCOPED_TRACE(c.name);
    Prepared r = prepare(c);
    run_gemm(c, r);
    const std::vector<float> heuristic = r.D->download();
    // tune_gemm works on scratch buffers: D is untouched until the next run.
    GemmProblem p = r.p;
    if (c.offset_a) p.align = 2;
    const cuda::GemmTuneResult t = cuda::tune_gemm(p, 4, 1, 2);
    ASSERT_FALSE(t.candidates.empty());
    ASSERT_GE(t.best, 0);
    EXPECT_GT(t.best_ms, 0);
    EXPECT_LE(t.best_ms, t.heuristic_ms);
    EXPECT_FALSE(t.candidates[size_t(t.best)].algo.empty());
    EXPECT_EQ(r.D->download(), heuristic) << "tuning touched the real D";
    Prepared again = prepare(c);
    run_gemm(c, again);
    check(c, again, "tuned");
  }
  EXPECT_EQ(cuda::gemm_cache_size(), int(model_cases().size()));
}

TEST(CudaGemm, CacheSaveClearLoadRoundTrip) {
  PRIMUS_REQUIRE_GPU();
  cuda::clear_gemm_cache();
  const std::vector<Case> cases = model_cases();
  for (size_t i = 0; i < 3; ++i) {
    Prepared r = prepare(cases[i]);
    cuda::tune_gemm(r.p, 3, 1, 2);
  }
  ASSERT_EQ(cuda::gemm_cache_size(), 3);
  const std::string dir = ::testing::TempDir() + "primus-gemm-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/cache.json";
  cuda::save_gemm_cache(path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const cuda::GemmCacheFile f = cuda::parse_gemm_cache(text.str(), path);
  EXPECT_EQ(f.device, cuda::device_info().name);
  EXPECT_EQ(f.entries.size(), 3u);

  cuda::clear_gemm_cache();
  EXPECT_EQ(cuda::gemm_cache_size(), 0);
  EXPECT_EQ(cuda::load_gemm_cache(path), 3);
  EXPECT_EQ(cuda::gemm_cache_size(), 3);
  for (size_t i = 0; i < 3; ++i) {  // the loaded algorithms run and are right
    Prepared r = prepare(cases[i]);
    run_gemm(cases[i], r);
    check(cases[i], r, "loaded");
  }

  // Another GPU's or another cuBLASLt's file: ignored with a warning, not an error.
  cuda::GemmCacheFile other = f;
  other.device = "Some Other GPU";
  const std::string other_path = dir + "/other.json";
  std::ofstream(other_path) << cuda::gemm_cache_to_json(other);
  cuda::clear_gemm_cache();
  EXPECT_EQ(cuda::load_gemm_cache(other_path), 0);
  other = f;
  other.cublaslt_version += 1;
  std::ofstream(other_path, std::ios::trunc) << cuda::gemm_cache_to_json(other);
  EXPECT_EQ(cuda::load_gemm_cache(other_path), 0);
  EXPECT_EQ(cuda::gemm_cache_size(), 0);

  // A broken file is an error naming it; a missing file too.
  std::ofstream(other_path, std::ios::trunc) << "{\"format\": \"primus-gemm-cache\"";
  expect_error([&] { cuda::load_gemm_cache(other_path); }, {other_path, "not valid JSON"});
  expect_error([&] { cuda::load_gemm_cache(dir + "/missing.json"); }, {"missing.json"});
  std::filesystem::remove_all(dir);
}

TEST(CudaGemm, OnlineTuningTunesEachNewProblemOnce) {
  PRIMUS_REQUIRE_GPU();
  cuda::clear_gemm_cache();
  cuda::set_online_tuning(true, 3);
  const std::vector<Case> cases = model_cases();
  Case c = cases[2];  // the residual: a timed accumulate must not touch the real C or D
  Prepared r = prepare(c);
  run_gemm(c, r);
  check(c, r, "online");
  EXPECT_EQ(cuda::gemm_cache_size(), 1);
  Prepared again = prepare(c);
  run_gemm(c, again);
  EXPECT_EQ(cuda::gemm_cache_size(), 1);
  cuda::set_online_tuning(false);
  cuda::clear_gemm_cache();
}

TEST(CudaGemm, BadPointersAreErrorsNamingTheProblem) {
  PRIMUS_REQUIRE_GPU();
  Case c = model_cases()[0];
  Prepared r = prepare(c);
  const char* odd = static_cast<const char*>(r.A->get()) + 1;  // not on a bf16 boundary
  expect_error([&] { cuda::gemm(r.p, 1, odd, r.B->get(), 0, nullptr, r.D->get(), nullptr); },
               {"A", "not aligned", "bf16:bf16:NT:m37"});
  expect_error([&] { cuda::gemm(r.p, 1, r.A->get(), nullptr, 0, nullptr, r.D->get(), nullptr); }, {"B is null"});
  GemmProblem acc = r.p;
  acc.accumulate = true;
  acc.ldc = acc.ldd + 1;
  expect_error([&] { cuda::gemm(acc, 1, r.A->get(), r.B->get(), 1, r.D->get(), r.D->get(), nullptr); },
               {"in place", "ldc == ldd"});
}

// Timing is not emulated (a CPU reaches no TFLOP/s): the emulated suite (tests/emulated) leaves
// this case out.
#ifndef PRIMUS_EMULATED_GPU
TEST(CudaGemm, MeasuredPeakIsPositive) {
  PRIMUS_REQUIRE_GPU();
  const int before = cuda::gemm_cache_size();
  const double t = cuda::measure_bf16_peak_tflops(1024);
  EXPECT_GT(t, 1.0);
  EXPECT_EQ(cuda::gemm_cache_size(), before) << "measuring the peak must not add to the tuning cache";
}
#endif

}  // namespace
}  // namespace primus
