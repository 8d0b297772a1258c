// The emulated cuBLASLt and NCCL's own tests (emu/cublaslt_api.cpp, emu/nccl_api.cpp): the
// column-major product with every option gemm.cpp uses, the same result from every algorithm the
// heuristic offers, and the errors that make a wrong mapping in the product code visible instead
// of being quietly computed.
#include <cublasLt.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "gpu_test_util.h"
#include "kernels/fp8.h"

namespace primus::gputest {
namespace {

// ---------------------------------------------------------------- cuBLASLt

// One column-major problem D[m x n] = alpha op(A) op(B) + beta C (+ bias[m]), fp32 throughout, its
// descriptors and device operands; ld = rows + pad.
struct Lt {
  bool ta = false, tb = false, bias = false;
  int64_t m = 13, n = 9, k = 21, pad = 3;
  cudaDataType ab = CUDA_R_32F, cd = CUDA_R_32F;
  float alpha = 1.5f, beta = 0.5f;

  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  std::vector<float> A, B, C, bias_v;
  std::unique_ptr<DeviceArray<float>> dA, dB, dC, dD, dbias, ws;

  int64_t rows_a() const { return ta ? k : m; }
  int64_t cols_a() const { return ta ? m : k; }
  int64_t rows_b() const { return tb ? n : k; }
  int64_t cols_b() const { return tb ? k : n; }

  void build() {
    ASSERT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&la, ab, rows_a(), cols_a(), rows_a() + pad), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&lb, ab, rows_b(), cols_b(), rows_b() + pad), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&lc, cd, m, n, m + pad), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatrixLayoutCreate(&ld, cd, m, n, m + pad), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    const uint64_t wsb = 1 << 20;
    ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb),
              CUBLAS_STATUS_SUCCESS);
    A = random_floats(size_t(cols_a() * (rows_a() + pad)), 1);
    B = random_floats(size_t(cols_b() * (rows_b() + pad)), 2);
    C = random_floats(size_t(n * (m + pad)), 3);
    bias_v = random_floats(size_t(m), 4);
    dA = std::make_unique<DeviceArray<float>>(A);
    dB = std::make_unique<DeviceArray<float>>(B);
    dC = std::make_unique<DeviceArray<float>>(C);
    dD = std::make_unique<DeviceArray<float>>(C.size());
    dbias = std::make_unique<DeviceArray<float>>(bias_v);
    ws = std::make_unique<DeviceArray<float>>(size_t(wsb / 4));
    if (bias) {
      const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
      ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), CUBLAS_STATUS_SUCCESS);
      const void* p = dbias->get();
      ASSERT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p, sizeof p),
                CUBLAS_STATUS_SUCCESS);
    }
  }
  ~Lt() {
    cublasLtMatmulPreferenceDestroy(pref);
    for (auto l : {la, lb, lc, ld}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(h);
  }

  std::vector<cublasLtMatmulHeuristicResult_t> heuristic(int* returned, cublasStatus_t* status = nullptr) {
    std::vector<cublasLtMatmulHeuristicResult_t> r(16);
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, ld, pref, 16, r.data(), returned);
    if (status) *status = s;
    return r;
  }
  cublasStatus_t run(const cublasLtMatmulAlgo_t* algo, const void* c = nullptr, void* d = nullptr) {
    return cublasLtMatmul(h, desc, &alpha, dA->get(), la, dB->get(), lb, &beta, c ? c : dC->get(), lc,
                          d ? d : dD->get(), ld, algo, ws->get(), size_t(ws->n) * 4, cuda::stream());
  }
  // What D must hold: the product in the m x n corner, D's old contents (zeros) in the padding.
  std::vector<float> reference() const {
    std::vector<float> want(C.size(), 0.0f);
    const int64_t lda = rows_a() + pad, ldb = rows_b() + pad, ldcd = m + pad;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l)
          s += double(ta ? A[size_t(l + i * lda)] : A[size_t(i + l * lda)]) *
               double(tb ? B[size_t(j + l * ldb)] : B[size_t(l + j * ldb)]);
        double v = alpha * s + beta * double(C[size_t(i + j * ldcd)]);
        if (bias) v += bias_v[size_t(i)];
        want[size_t(i + j * ldcd)] = float(v);
      }
    return want;
  }
};

class EmulatedCublasLt : public testing::Test {
 protected:
  void SetUp() override { PRIMUS_REQUIRE_GPU(); }
};

TEST_F(EmulatedCublasLt, EveryAlgorithmComputesTheColumnMajorProduct) {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true})
      for (const bool bias : {false, true}) {
        SCOPED_TRACE(testing::Message() << "ta " << ta << " tb " << tb << " bias " << bias);
        Lt p;
        p.ta = ta, p.tb = tb, p.bias = bias;
        p.build();
        int returned = 0;
        const auto algos = p.heuristic(&returned);
        ASSERT_GE(returned, 4) << "several candidates for tuning";
        for (int i = 0; i < returned; ++i) {
          ASSERT_EQ(p.run(&algos[size_t(i)].algo), CUBLAS_STATUS_SUCCESS) << "candidate " << i;
          expect_close(p.dD->host(), p.reference(), 1e-4, 1e-5, "candidate " + std::to_string(i));
        }
        ASSERT_EQ(p.run(nullptr), CUBLAS_STATUS_SUCCESS) << "no algorithm: cuBLASLt picks one";
      }
}

TEST_F(EmulatedCublasLt, InPlaceNeedsDsLayoutAndBetaZeroDoesNotReadC) {
  Lt p;
  p.build();
  int returned = 0;
  const auto algos = p.heuristic(&returned);
  const std::vector<float> want = p.reference();
  DeviceArray<float> cd(p.C);
  EXPECT_EQ(p.run(&algos[0].algo, cd.get(), cd.get()), CUBLAS_STATUS_SUCCESS);
  std::vector<float> got = cd.host();
  for (size_t i = 0; i < got.size(); ++i)
    if (int64_t(i % size_t(p.m + p.pad)) >= p.m) got[i] = 0;  // the padding keeps C's values
  expect_close(got, want, 1e-4, 1e-5, "C == D");
  // C == D with another ld for C than for D: refused.
  DeviceArray<float> big(size_t((p.m + p.pad + 1) * p.n));
  cublasLtMatrixLayout_t wide = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&wide, CUDA_R_32F, p.m, p.n, p.m + p.pad + 1), CUBLAS_STATUS_SUCCESS);
  std::swap(p.lc, wide);
  EXPECT_EQ(p.run(&algos[0].algo, big.get(), big.get()), CUBLAS_STATUS_INVALID_VALUE);
  std::swap(p.lc, wide);
  cublasLtMatrixLayoutDestroy(wide);
  // beta = 0: C is not read (a null or NaN-filled C is fine).
  p.beta = 0;
  std::vector<float> nan(p.C.size(), std::nanf(""));
  DeviceArray<float> dnan(nan);
  EXPECT_EQ(p.run(&algos[0].algo, dnan.get()), CUBLAS_STATUS_SUCCESS);
  expect_close(p.dD->host(), p.reference(), 1e-4, 1e-5, "beta 0");
}

TEST_F(EmulatedCublasLt, InconsistentLayoutsAreErrors) {
  Lt p;
  p.build();
  int returned = 0;
  cublasStatus_t s;
  // A's layout given for TRANSA = N while TRANSA = T: op(A) has the wrong shape.
  const cublasOperation_t t = CUBLAS_OP_T;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), CUBLAS_STATUS_SUCCESS);
  p.heuristic(&returned, &s);
  EXPECT_EQ(s, CUBLAS_STATUS_INVALID_VALUE);
  const cublasOperation_t nop = CUBLAS_OP_N;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &nop, sizeof nop), CUBLAS_STATUS_SUCCESS);
  // ld below the rows.
  const int64_t small = p.m - 1;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(p.ld, CUBLASLT_MATRIX_LAYOUT_LD, &small, sizeof small), CUBLAS_STATUS_SUCCESS);
  p.heuristic(&returned, &s);
  EXPECT_EQ(s, CUBLAS_STATUS_INVALID_VALUE);
  const int64_t good = p.m + p.pad;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(p.ld, CUBLASLT_MATRIX_LAYOUT_LD, &good, sizeof good), CUBLAS_STATUS_SUCCESS);
  // An attribute of the wrong size.
  const int64_t wide_op = 0;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &wide_op, sizeof wide_op),
            CUBLAS_STATUS_INVALID_VALUE);
  // A bf16 C/D with fp32 A/B.
  const uint32_t bf = CUDA_R_16BF;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(p.lc, CUBLASLT_MATRIX_LAYOUT_TYPE, &bf, sizeof bf), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(p.ld, CUBLASLT_MATRIX_LAYOUT_TYPE, &bf, sizeof bf), CUBLAS_STATUS_SUCCESS);
  p.heuristic(&returned, &s);
  EXPECT_EQ(s, CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST_F(EmulatedCublasLt, BiasOfAnotherTypeThanDIsNotSupported) {
  Lt p;
  p.bias = true;
  p.build();
  const int32_t bf = CUDA_R_16BF;
  ASSERT_EQ(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bf, sizeof bf),
            CUBLAS_STATUS_SUCCESS);
  int returned = 0;
  cublasStatus_t s;
  p.heuristic(&returned, &s);
  EXPECT_EQ(s, CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST_F(EmulatedCublasLt, AlignmentsDecideTheAlgorithms) {
  Lt p;
  p.build();
  int all = 0, few = 0;
  const auto best = p.heuristic(&all);
  const uint32_t four = 4;
  ASSERT_EQ(cublasLtMatmulPreferenceSetAttribute(p.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &four, sizeof four),
            CUBLAS_STATUS_SUCCESS);
  const auto aligned4 = p.heuristic(&few);
  EXPECT_GT(few, 0);
  EXPECT_LT(few, all) << "vectorised algorithms need more than 4 bytes";
  // The heuristic's first choice for 256-byte pointers refuses a 4-byte aligned A; the candidates
  // for a 4-byte aligned A accept it.
  DeviceArray<float> shifted(p.A.size() + 1);
  const float* a4 = shifted.get() + 1;
  auto run_with = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublasLtMatmul(p.h, p.desc, &p.alpha, a4, p.la, p.dB->get(), p.lb, &p.beta, p.dC->get(), p.lc, p.dD->get(),
                          p.ld, &algo, p.ws->get(), size_t(p.ws->n) * 4, cuda::stream());
  };
  EXPECT_EQ(run_with(best[0].algo), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(run_with(aligned4[0].algo), CUBLAS_STATUS_SUCCESS);
  // A leading dimension that is not a multiple of 16 bytes rules the vectorised ones out too.
  const int64_t odd = p.m + p.pad + 1;
  ASSERT_EQ(cublasLtMatrixLayoutSetAttribute(p.lc, CUBLASLT_MATRIX_LAYOUT_LD, &odd, sizeof odd), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t check{};
  EXPECT_EQ(cublasLtMatmulAlgoCheck(p.h, p.desc, p.la, p.lb, p.lc, p.ld, &best[0].algo, &check),
            CUBLAS_STATUS_NOT_SUPPORTED);
}

TEST_F(EmulatedCublasLt, ForeignAlgorithmsAndHostPointersAreRefused) {
  Lt p;
  p.build();
  int returned = 0;
  const auto algos = p.heuristic(&returned);
  cublasLtMatmulHeuristicResult_t check{};
  EXPECT_EQ(cublasLtMatmulAlgoCheck(p.h, p.desc, p.la, p.lb, p.lc, p.ld, &algos[0].algo, &check), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulAlgo_t foreign = algos[0].algo;
  foreign.data[1] ^= 1;  // no longer what this cuBLASLt wrote
  EXPECT_EQ(cublasLtMatmulAlgoCheck(p.h, p.desc, p.la, p.lb, p.lc, p.ld, &foreign, &check), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(p.run(&foreign), CUBLAS_STATUS_INVALID_VALUE);
  // An algorithm chosen for bf16 operands, given fp32 descriptors.
  Lt b;
  b.ab = b.cd = CUDA_R_16BF;
  b.build();
  const auto bf_algos = b.heuristic(&returned);
  EXPECT_EQ(cublasLtMatmulAlgoCheck(p.h, p.desc, p.la, p.lb, p.lc, p.ld, &bf_algos[0].algo, &check),
            CUBLAS_STATUS_INVALID_VALUE);
  // A host pointer (an illegal address on a GPU).
  EXPECT_EQ(cublasLtMatmul(p.h, p.desc, &p.alpha, p.A.data(), p.la, p.dB->get(), p.lb, &p.beta, p.dC->get(), p.lc,
                           p.dD->get(), p.ld, &algos[0].algo, p.ws->get(), size_t(p.ws->n) * 4, cuda::stream()),
            CUBLAS_STATUS_EXECUTION_FAILED);
  // D overlapping A.
  EXPECT_EQ(cublasLtMatmul(p.h, p.desc, &p.alpha, p.dA->get(), p.la, p.dB->get(), p.lb, &p.beta, p.dC->get(), p.lc,
                           p.dA->get(), p.ld, &algos[0].algo, p.ws->get(), size_t(p.ws->n) * 4, cuda::stream()),
            CUBLAS_STATUS_INVALID_VALUE);
}

// na E4M3 codes 0x38..0x4F (1 to 7.5) into A and nb E5M2 codes 0x3C..0x47 (1 to 3.5) into B,
// random signs: FP8 operands whose products and sums are exact in fp32.
void random_fp8_operands(const Rng& rng, int64_t na, int64_t nb, std::vector<uint8_t>& A, std::vector<uint8_t>& B) {
  for (int64_t i = 0; i < na; ++i)
    A.push_back(uint8_t((0x38 + rng.at(uint64_t(i)) % 24) | (rng.at(uint64_t(i) + 5000) & 1) << 7));
  for (int64_t i = 0; i < nb; ++i)
    B.push_back(uint8_t((0x3C + rng.at(uint64_t(i) + 9000) % 12) | (rng.at(uint64_t(i) + 13000) & 1) << 7));
}

// FP8 (emu/cublaslt_api.cpp's top): E4M3 x E5M2 in the TN format, column-major, m x n from k,
// with A's and B's scales on the device, into an fp32 D, and into an E4M3 D with D's scale and the
// amax of the value before it. The operands are FP8 values whose products and sums are exact in
// fp32, so the expected values are exact too; they come from the project's FP8 decoding and
// encoding (kernels/fp8.h), which the emulator's own (emu/blas_values.h) thereby checks.
struct Fp8Lt {
  static constexpr int64_t m = 16, n = 8, k = 32;
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  std::vector<uint8_t> A, B;  // A k x m (read transposed), B k x n
  std::unique_ptr<DeviceArray<uint8_t>> dA, dB;
  std::unique_ptr<DeviceArray<float>> scale_a, scale_b, scale_d, amax;

  Fp8Lt(cudaDataType d_type, cudaDataType c_type) {
    EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E5M2, k, n, k), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&lc, c_type, m, n, m), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&ld, d_type, m, n, m), CUBLAS_STATUS_SUCCESS);
    random_fp8_operands(Rng(7), k * m, k * n, A, B);
    dA = std::make_unique<DeviceArray<uint8_t>>(A);
    dB = std::make_unique<DeviceArray<uint8_t>>(B);
    scale_a = std::make_unique<DeviceArray<float>>(std::vector<float>{0.5f});
    scale_b = std::make_unique<DeviceArray<float>>(std::vector<float>{4.0f});
    scale_d = std::make_unique<DeviceArray<float>>(std::vector<float>{4.0f});
    amax = std::make_unique<DeviceArray<float>>(std::vector<float>{-1.0f});
  }
  ~Fp8Lt() {
    for (auto l : {la, lb, lc, ld}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(h);
  }
  template <typename T>
  cublasStatus_t set(cublasLtMatmulDescAttributes_t attr, T v) {
    return cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof v);
  }
  void set_pointer(cublasLtMatmulDescAttributes_t attr, const void* p) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, attr, &p, sizeof p), CUBLAS_STATUS_SUCCESS);
  }
  // A's layout replaced by one of another type or shape.
  cublasStatus_t relayout_a(cudaDataType type, int64_t rows, int64_t cols, int64_t lda) {
    cublasLtMatrixLayoutDestroy(la);
    la = nullptr;
    return cublasLtMatrixLayoutCreate(&la, type, rows, cols, lda);
  }
  cublasStatus_t run(void* D, float alpha) {
    const float beta = 0.0f;
    return cublasLtMatmul(h, desc, &alpha, dA->get(), la, dB->get(), lb, &beta, D, lc, D, ld, nullptr, nullptr, 0,
                          cuda::stream());
  }
  // alpha * 0.5 * 4 * (A^T B)(i, j), column-major m x n.
  std::vector<float> product(float alpha) const {
    std::vector<float> v(size_t(m * n));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double s = 0;
        for (int64_t l = 0; l < k; ++l)
          s += double(fp8::decode(A[size_t(l + i * k)], fp8::Format::E4M3)) *
               double(fp8::decode(B[size_t(l + j * k)], fp8::Format::E5M2));
        v[size_t(i + j * m)] = float(alpha * 2.0 * s);
      }
    return v;
  }
};

TEST_F(EmulatedCublasLt, Fp8ScalePointersAmaxAndFp8Output) {
  {  // fp32 D: D = alpha scale_A scale_B A^T B
    Fp8Lt p(CUDA_R_32F, CUDA_R_32F);
    p.set_pointer(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.scale_a->get());
    p.set_pointer(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.scale_b->get());
    p.set_pointer(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, p.amax->get());
    DeviceArray<float> D(size_t(p.m * p.n));
    ASSERT_EQ(p.run(D.get(), 0.25f), CUBLAS_STATUS_SUCCESS);
    const std::vector<float> want = p.product(0.25f);
    EXPECT_EQ(D.host(), want);
    float amax = 0;
    for (float v : want) amax = std::max(amax, std::fabs(v));
    EXPECT_EQ(p.amax->host()[0], amax);
    // D's scale is for FP8 outputs only.
    p.set_pointer(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, p.scale_d->get());
    EXPECT_EQ(p.run(D.get(), 0.25f), CUBLAS_STATUS_INVALID_VALUE);
  }
  {  // E4M3 D with a bf16 C: D = satfinite(E4M3(scale_D (...))), amax before scale_D
    Fp8Lt p(CUDA_R_8F_E4M3, CUDA_R_16BF);
    p.set_pointer(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.scale_a->get());
    p.set_pointer(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.scale_b->get());
    p.set_pointer(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, p.scale_d->get());
    p.set_pointer(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, p.amax->get());
    DeviceArray<uint8_t> D(size_t(p.m * p.n));
    ASSERT_EQ(p.run(D.get(), 1.0f), CUBLAS_STATUS_SUCCESS);
    const std::vector<float> v = p.product(1.0f);
    std::vector<uint8_t> want;
    float amax = 0;
    bool saturated = false;
    for (float x : v) {
      want.push_back(fp8::encode(x * 4, fp8::Format::E4M3));
      amax = std::max(amax, std::fabs(x));
      saturated = saturated || std::fabs(x * 4) > 448;
    }
    EXPECT_EQ(D.host(), want);
    EXPECT_EQ(p.amax->host()[0], amax);
    EXPECT_TRUE(saturated) << "the case should reach E4M3's saturation";
  }
}

TEST_F(EmulatedCublasLt, Fp8OutsideSm90sRulesIsNotSupported) {
  {  // NN (consistent shapes): sm_90 takes FP8 in the TN format only
    Fp8Lt p(CUDA_R_32F, CUDA_R_32F);
    ASSERT_EQ(p.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_N), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(p.relayout_a(CUDA_R_8F_E4M3, p.m, p.k, p.m), CUBLAS_STATUS_SUCCESS);
    DeviceArray<float> D(size_t(p.m * p.n));
    EXPECT_EQ(p.run(D.get(), 1.0f), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // E5M2 x E5M2
    Fp8Lt p(CUDA_R_32F, CUDA_R_32F);
    ASSERT_EQ(p.relayout_a(CUDA_R_8F_E5M2, p.k, p.m, p.k), CUBLAS_STATUS_SUCCESS);
    DeviceArray<float> D(size_t(p.m * p.n));
    EXPECT_EQ(p.run(D.get(), 1.0f), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // a block-scaled mode for A alone (B's SCALAR_32F): not a combination of the block-scaled modes
    Fp8Lt p(CUDA_R_32F, CUDA_R_32F);
    ASSERT_EQ(p.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t(CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)),
              CUBLAS_STATUS_SUCCESS);
    DeviceArray<float> D(size_t(p.m * p.n));
    EXPECT_EQ(p.run(D.get(), 1.0f), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // scale pointers belong to FP8: with fp32 operands they are an unsupported combination
    Lt p;
    p.build();
    const void* s = p.dA->get();
    ASSERT_EQ(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &s, sizeof s),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(p.run(nullptr), CUBLAS_STATUS_INVALID_VALUE);
  }
}

// Block-scaled FP8 (emu/cublaslt_api.cpp's top; docs/cuda.md has the sources): E4M3 A (k x m,
// read transposed) and E5M2 B (k x n) in the TN format over two 128-wide k blocks and a ragged
// third, each operand in VEC128_32F or BLK128x128_32F with its fp32 scales laid out as cuBLASLt
// reads them, every scale a different power of two, the layouts' padding NaN. The expected values
// come from the layouts as written here (j-th k block of row i at j * outer + i; block (i, j) at
// i * round_up(kb, 4) + j), the products of decoded FP8 values (kernels/fp8.h) and the sum per k
// block: exact in fp32 for these values, so they must match exactly.
struct BlockLt {
  int64_t m = 16, n = 8, k = 272, kb = 3;  // k blocks of 128, 128 and 16
  int32_t mode_a, mode_b;
  cudaDataType d_type = CUDA_R_32F;
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  std::vector<uint8_t> A, B;
  std::vector<float> sa, sb;
  std::unique_ptr<DeviceArray<uint8_t>> dA, dB;
  std::unique_ptr<DeviceArray<float>> dsa, dsb;

  static bool vec(int32_t mode) { return mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F; }
  static size_t index(int32_t mode, int64_t outer, int64_t kb, int64_t i, int64_t l) {
    return vec(mode) ? size_t(l / 128 * outer + i) : size_t(i / 128 * ((kb + 3) / 4 * 4) + l / 128);
  }
  // 2^(o % period + step * block - 3), o the row (1 x 128) or its 128-row block (128 x 128): A's step
  // 2 and B's -1 make each k block's product of scales a different power of two (a scale read from
  // another block or row shows), within 2^5 so that the fp32 sums stay exact.
  static std::vector<float> scales(int32_t mode, int64_t outer, int64_t kb, int period, int step) {
    const size_t count = vec(mode) ? size_t(kb * outer) : size_t((outer + 127) / 128 * ((kb + 3) / 4 * 4));
    std::vector<float> v(count, NAN);
    for (int64_t i = 0; i < outer; ++i)
      for (int64_t b = 0; b < kb; ++b) {
        const int64_t o = vec(mode) ? i : i / 128;
        v[index(mode, outer, kb, i, b * 128)] = std::ldexp(1.0f, int(o % period + step * b - 3));
      }
    return v;
  }

  BlockLt(int32_t ma, int32_t mb, int64_t m_ = 16, int64_t n_ = 8) : m(m_), n(n_), mode_a(ma), mode_b(mb) {}
  cublasStatus_t build() {
    EXPECT_EQ(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    set(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T));
    set(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(CUBLAS_OP_N));
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_a);
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_b);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E5M2, k, n, k), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&lc, d_type, m, n, m), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&ld, d_type, m, n, m), CUBLAS_STATUS_SUCCESS);
    random_fp8_operands(Rng(11), k * m, k * n, A, B);
    sa = scales(mode_a, m, kb, 3, 2);
    sb = scales(mode_b, n, kb, 2, -1);
    dA = std::make_unique<DeviceArray<uint8_t>>(A);
    dB = std::make_unique<DeviceArray<uint8_t>>(B);
    dsa = std::make_unique<DeviceArray<float>>(sa);
    dsb = std::make_unique<DeviceArray<float>>(sb);
    return CUBLAS_STATUS_SUCCESS;
  }
  ~BlockLt() {
    for (auto l : {la, lb, lc, ld}) cublasLtMatrixLayoutDestroy(l);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(h);
  }
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, T v) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof v), CUBLAS_STATUS_SUCCESS);
  }
  void set_scales(const void* a, const void* b) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a, sizeof a),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b, sizeof b),
              CUBLAS_STATUS_SUCCESS);
  }
  cublasStatus_t run(const void* C, void* D, float alpha, float beta) {
    return cublasLtMatmul(h, desc, &alpha, dA->get(), la, dB->get(), lb, &beta, C, lc, D, ld, nullptr, nullptr, 0,
                          cuda::stream());
  }
  cublasStatus_t heuristic() {
    cublasLtMatmulPreference_t pref = nullptr;
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t r[4];
    int returned = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, ld, pref, 4, r, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    return s;
  }
  // alpha * sum over k blocks of scale_A(i, block) scale_B(j, block) (A^T B over the block).
  std::vector<float> product(float alpha) const {
    std::vector<float> v(size_t(m * n));
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        double s = 0;
        for (int64_t l0 = 0; l0 < k; l0 += 128) {
          double part = 0;
          for (int64_t l = l0; l < std::min(k, l0 + 128); ++l)
            part += double(fp8::decode(A[size_t(l + i * k)], fp8::Format::E4M3)) *
                    double(fp8::decode(B[size_t(l + j * k)], fp8::Format::E5M2));
          s += part * sa[index(mode_a, m, kb, i, l0)] * sb[index(mode_b, n, kb, j, l0)];
        }
        v[size_t(i + j * m)] = float(alpha * s);
      }
    return v;
  }
};

TEST_F(EmulatedCublasLt, BlockScaledFp8MultipliesEachKBlockByItsScales) {
  const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  for (const auto& [ma, mb] : {std::pair{vec, vec}, std::pair{vec, blk}, std::pair{blk, vec}}) {
    SCOPED_TRACE(testing::Message() << "A mode " << ma << ", B mode " << mb);
    BlockLt p(ma, mb);
    p.build();
    p.set_scales(p.dsa->get(), p.dsb->get());
    DeviceArray<float> D(size_t(p.m * p.n));
    ASSERT_EQ(p.run(D.get(), D.get(), 0.5f, 0.0f), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(D.host(), p.product(0.5f));
    // In place with beta 1 (a weight gradient's accumulation): the fp32 sum of the two.
    const std::vector<float> before = D.host(), add = p.product(1.0f);
    ASSERT_EQ(p.run(D.get(), D.get(), 1.0f, 1.0f), CUBLAS_STATUS_SUCCESS);
    std::vector<float> want(before.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = add[i] + before[i];
    EXPECT_EQ(D.host(), want);
  }
  {  // a bf16 D with a bf16 C: the product rounded to bf16, then C added and rounded again
    BlockLt p(vec, blk);
    p.d_type = CUDA_R_16BF;
    p.build();
    p.set_scales(p.dsa->get(), p.dsb->get());
    const std::vector<float> c = round_bf16(random_floats(size_t(p.m * p.n), 3, 100.0));
    std::vector<uint16_t> cbits;
    for (float x : c) cbits.push_back(bf16::from_float(x).bits);
    DeviceBf16 C(cbits), D(cbits.size());
    ASSERT_EQ(p.run(C.get(), D.get(), 1.0f, 1.0f), CUBLAS_STATUS_SUCCESS);
    const std::vector<float> v = p.product(1.0f);
    const std::vector<uint16_t> got = D.host();
    for (size_t i = 0; i < v.size(); ++i)
      EXPECT_EQ(got[i], bf16::from_float(bf16::from_float(v[i]).to_float() + c[i]).bits) << i;
  }
}

TEST_F(EmulatedCublasLt, BlockScaledFp8OutsideSm90sRulesIsRefused) {
  const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  DeviceArray<float> D(size_t(64 * 64));
  auto status = [&](BlockLt& p) {
    p.build();
    p.set_scales(p.dsa->get(), p.dsb->get());
    return p.run(D.get(), D.get(), 1.0f, 0.0f);
  };
  {  // 128 x 128 blocks on both sides
    BlockLt p(blk, blk);
    EXPECT_EQ(status(p), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // one operand block-scaled, the other a tensor scalar
    BlockLt p(vec, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
    EXPECT_EQ(status(p), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // MXFP8's mode is sm_100's
    BlockLt p(CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0);
    EXPECT_EQ(status(p), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // m not a multiple of 8
    BlockLt p(vec, blk, 12, 8);
    EXPECT_EQ(status(p), CUBLAS_STATUS_NOT_SUPPORTED);
  }
  {  // n not a multiple of 8 with B in 1 x 128 tiles; with B in 128 x 128 blocks it runs
    BlockLt p(blk, vec, 16, 12);
    EXPECT_EQ(status(p), CUBLAS_STATUS_NOT_SUPPORTED);
    BlockLt q(vec, blk, 16, 12);
    EXPECT_EQ(status(q), CUBLAS_STATUS_SUCCESS);
  }
  {  // no scale pointer: the heuristic refuses too
    BlockLt p(vec, blk);
    p.build();
    EXPECT_EQ(p.heuristic(), CUBLAS_STATUS_INVALID_VALUE);
    EXPECT_EQ(p.run(D.get(), D.get(), 1.0f, 0.0f), CUBLAS_STATUS_INVALID_VALUE);
    p.set_scales(p.dsa->get(), p.dsb->get());
    EXPECT_EQ(p.heuristic(), CUBLAS_STATUS_SUCCESS);
  }
  {  // scales shorter than the layout (A's VEC128 needs kb * m values)
    BlockLt p(vec, blk);
    p.build();
    DeviceArray<float> short_a(p.sa.size() - 1);
    p.set_scales(short_a.get(), p.dsb->get());
    EXPECT_EQ(p.run(D.get(), D.get(), 1.0f, 0.0f), CUBLAS_STATUS_EXECUTION_FAILED);
  }
  {  // an FP8 D
    BlockLt p(vec, blk);
    p.d_type = CUDA_R_8F_E4M3;
    p.build();
    p.set_scales(p.dsa->get(), p.dsb->get());
    DeviceArray<uint8_t> D8(size_t(p.m * p.n));
    EXPECT_EQ(p.run(nullptr, D8.get(), 1.0f, 0.0f), CUBLAS_STATUS_NOT_SUPPORTED);
  }
}

// ---------------------------------------------------------------- NCCL

class EmulatedNccl : public testing::Test {
 protected:
  void SetUp() override {
    PRIMUS_REQUIRE_GPU();
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  }
  void TearDown() override {
    if (comm) ncclCommDestroy(comm);
  }
  ncclComm_t comm = nullptr;
};

TEST_F(EmulatedNccl, InitChecksItsArguments) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t two = nullptr;
  EXPECT_EQ(ncclCommInitRank(&two, 2, id, 2), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("rank 2 of a communicator of 2"), std::string::npos);
  ncclUniqueId forged{};
  EXPECT_EQ(ncclCommInitRank(&two, 1, forged, 0), ncclInvalidArgument);
  ncclComm_t none = comm;
  EXPECT_EQ(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr), ncclSuccess);
  EXPECT_EQ(none, nullptr);
}

TEST_F(EmulatedNccl, SendsMeetReceivesInTheirGroup) {
  const std::vector<float> x = random_floats(100, 1);
  DeviceArray<float> s(x), r(x.size()), r2(x.size());
  // Outside a group, a send to self never completes on a GPU.
  EXPECT_EQ(ncclSend(s.get(), 100, ncclFloat32, 0, comm, cuda::stream()), ncclInvalidUsage);
  // In a group: matched in order.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(s.get(), 100, ncclFloat32, 0, comm, cuda::stream()), ncclSuccess);
  ASSERT_EQ(ncclRecv(r.get(), 100, ncclFloat32, 0, comm, cuda::stream()), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(r.host(), x);
  // A send left unmatched, or matched with another count: the group fails and nothing moves.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(s.get(), 100, ncclFloat32, 0, comm, cuda::stream()), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(s.get(), 100, ncclFloat32, 0, comm, cuda::stream()), ncclSuccess);
  ASSERT_EQ(ncclRecv(r2.get(), 99, ncclFloat32, 0, comm, cuda::stream()), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_EQ(r2.host(), std::vector<float>(x.size(), 0.0f));
}

TEST_F(EmulatedNccl, CollectivesCheckTheirBuffers) {
  const std::vector<float> x = random_floats(64, 2);
  DeviceArray<float> a(x), b(x.size());
  EXPECT_EQ(ncclAllReduce(a.get(), b.get(), 64, ncclFloat32, ncclSum, comm, cuda::stream()), ncclSuccess);
  EXPECT_EQ(b.host(), x);
  std::vector<float> host(64);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 64, ncclFloat32, ncclSum, comm, cuda::stream()), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(a.get(), a.get(), 129, ncclFloat32, ncclSum, comm, cuda::stream()), ncclInvalidArgument)
      << "past the end of the allocation";
  EXPECT_EQ(ncclAllReduce(a.get(), a.get(), 65, ncclFloat32, ncclSum, comm, cuda::stream()), ncclInvalidArgument)
      << "one element past the end (DeviceArray allocates exactly)";
  EXPECT_EQ(ncclAllReduce(a.get(), a.get() + 1, 32, ncclFloat32, ncclSum, comm, cuda::stream()), ncclInvalidArgument)
      << "overlapping, not in place";
  EXPECT_EQ(ncclBroadcast(a.get(), a.get(), 64, ncclFloat32, 1, comm, cuda::stream()), ncclInvalidArgument);
  ncclComm_t gone = comm;
  ASSERT_EQ(ncclCommDestroy(comm), ncclSuccess);
  comm = nullptr;
  EXPECT_EQ(ncclAllReduce(a.get(), a.get(), 64, ncclFloat32, ncclSum, gone, cuda::stream()), ncclInvalidArgument);
}

// The communication stream not waiting for the compute stream: a collective whose input was just
// written on another stream, with no event between them, is reported as a hazard (whichever of
// the two the executor runs first); with the event it runs.
TEST_F(EmulatedNccl, ACollectiveNotOrderedAfterItsInputIsAHazard) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  cudaStream_t comm_stream = nullptr;
  cudaEvent_t ready = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  const std::vector<float> x = random_floats(64, 3);
  DeviceArray<float> a(size_t{64});
  auto unordered = [&] {
    cudaMemcpyAsync(a.get(), x.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, cuda::stream());
    ncclAllReduce(a.get(), a.get(), 64, ncclFloat32, ncclSum, comm, comm_stream);
    cudaDeviceSynchronize();
  };
  EXPECT_DEATH(unordered(), "hazard between streams: .*ncclAllReduce|hazard between streams: cudaMemcpyAsync");
  ASSERT_EQ(cudaMemcpyAsync(a.get(), x.data(), 64 * sizeof(float), cudaMemcpyHostToDevice, cuda::stream()),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ready, cuda::stream()), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(comm_stream, ready, 0), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(a.get(), a.get(), 64, ncclFloat32, ncclSum, comm, comm_stream), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(comm_stream), cudaSuccess);
  EXPECT_EQ(a.host(), x);
  cudaEventDestroy(ready);
  cudaStreamDestroy(comm_stream);
}

}  // namespace
}  // namespace primus::gputest
