#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include <fmt/ranges.h>

#include "core/log.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/fp8_quantize.h"
#include "kernels/cuda/fused.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/runtime.h"
#include "kernels/dropout_mask.h"

namespace primus::cuda {

namespace {

void check(const Tensor& t, DType dtype, const char* what) {
  PRIMUS_CHECK(t.defined(), "{} is undefined", what);
  PRIMUS_CHECK(t.device() == Device::CUDA, "{} is on the {}, not the GPU", what, device_name(t.device()));
  PRIMUS_CHECK(t.is_contiguous(), "{} {} is not contiguous", what, t.shape_str());
  PRIMUS_CHECK(t.dtype() == dtype, "{} is {}, expected {}", what, dtype_name(t.dtype()), dtype_name(dtype));
}
void check(const Tensor& t, DType dtype, const Shape& shape, const char* what) {
  check(t, dtype, what);
  PRIMUS_CHECK(t.shape() == shape, "{} is {}, expected [{}]", what, t.shape_str(), fmt::join(shape, ", "));
}

bf16* B(const Tensor& t) { return static_cast<bf16*>(t.raw()); }
float* F(const Tensor& t) { return static_cast<float*>(t.raw()); }
int32_t* I(const Tensor& t) { return static_cast<int32_t*>(t.raw()); }

template <typename T>
Tensor upload(const std::vector<T>& v) {
  Tensor host = Tensor::empty({int64_t(v.size())}, dtype_of<T>::value);
  std::copy(v.begin(), v.end(), host.data<T>());
  return host.to(Device::CUDA);
}

// The routing row ops take bf16 (the activations) or fp32 tensors.
DType row_op_dtype(const Tensor& t, const char* op) {
  PRIMUS_CHECK(t.defined(), "{} of an undefined tensor", op);
  PRIMUS_CHECK(t.dtype() == DType::BF16 || t.dtype() == DType::F32, "{} on the GPU takes bf16 or fp32 tensors, not {}",
               op, dtype_name(t.dtype()));
  return t.dtype();
}

void check_rows(const std::vector<int32_t>& rows, int64_t bound, const char* op) {
  for (int32_t r : rows) PRIMUS_CHECK(r >= 0 && r < bound, "{}: row {} outside [0, {})", op, r, bound);
}

// The device copy of a row op's scales, or undefined for none (1).
Tensor upload_scale(const std::vector<double>& scale, size_t rows, const char* op) {
  PRIMUS_CHECK(scale.empty() || scale.size() == rows, "{}: {} scales for {} rows", op, scale.size(), rows);
  return scale.empty() ? Tensor() : upload(scale);
}
const double* scales(const Tensor& t) { return t.defined() ? static_cast<const double*>(t.raw()) : nullptr; }

// The flash attention's dims of s, its documents, window and sinks included.
AttentionDims dims_of(const ops::AttentionShape& s) {
  const cpu::Documents docs = ops::documents_of(s, Device::CUDA);
  const auto* sinks = static_cast<const float*>(ops::sinks_of(s, Device::CUDA, DType::F32));
  return {s.batch, s.seq, s.heads, s.groups, s.head_dim, docs.start, docs.key_pos0, s.window, sinks};
}

}  // namespace

CudaBackend::CudaBackend(int device) {
  init(device);
  loss_sum_ = Tensor::zeros({1}, DType::F32, Device::CUDA);
}

std::string CudaBackend::name() const { return fmt::format("cuda ({})", device_info().name); }

namespace {

// The checked shape of D = op(A) op(B) (bf16 A and B; bf16 or fp32 D), for gemm and each problem
// of grouped_gemm; `op` names the call in the errors.
GemmProblem gemm_problem(bool ta, bool tb, const Tensor& A, const Tensor& Bm, const Tensor& D, const std::string& op) {
  PRIMUS_CHECK(A.dim() == 2 && Bm.dim() == 2 && D.dim() == 2, "{} takes 2-d tensors", op);
  check(A, DType::BF16, (op + " A").c_str());
  check(Bm, DType::BF16, (op + " B").c_str());
  PRIMUS_CHECK(D.dtype() == DType::BF16 || D.dtype() == DType::F32, "{} D must be bf16 or fp32", op);
  check(D, D.dtype(), (op + " D").c_str());
  GemmProblem p;
  p.trans_a = ta;
  p.trans_b = tb;
  p.m = ta ? A.size(1) : A.size(0);
  p.k = ta ? A.size(0) : A.size(1);
  p.n = tb ? Bm.size(0) : Bm.size(1);
  PRIMUS_CHECK((tb ? Bm.size(1) : Bm.size(0)) == p.k, "{} inner dimensions {} and {} differ", op, p.k,
               tb ? Bm.size(1) : Bm.size(0));
  PRIMUS_CHECK(D.size(0) == p.m && D.size(1) == p.n, "{} output {} for a [{}, {}] product", op, D.shape_str(), p.m,
               p.n);
  p.lda = A.size(1);
  p.ldb = Bm.size(1);
  p.ldd = D.size(1);
  p.ab = GemmType::BF16;
  p.cd = D.dtype() == DType::F32 ? GemmType::F32 : GemmType::BF16;
  return p;
}

// Runs p (its shape, A's and B's types and scale modes set) on A and B (with their block scales
// for a block-scaled p) with gemm()'s C, D and bias.
void run_gemm(GemmProblem p, float alpha, const void* A, const float* scale_a, const void* B, const float* scale_b,
              float beta, const Tensor& C, Tensor& D, const Tensor& bias) {
  p.accumulate = beta != 0.0f;
  if (p.accumulate) {
    check(C, D.dtype(), D.shape(), "gemm C");
    p.ldc = C.size(1);
  } else {
    p.ldc = p.ldd;
  }
  p.bias = bias.defined();
  if (p.bias) check(bias, DType::BF16, {p.n}, "gemm bias");
  cuda::gemm(p, alpha, A, scale_a, B, scale_b, beta, p.accumulate ? C.raw() : nullptr, D.raw(),
             p.bias ? bias.raw() : nullptr, stream());
}

// Logs `message` (FP8's notes on what runs emulated) the first time it comes.
void say_once(const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(message).second) log::info("{}", message);
}

// fp8_gemm_refusal (gemm.h) with the tensors' own rules: the block scales given, and D, C and the
// bias 16-byte aligned (the packed A and B are always in cuBLASLt's layout, gemm_fp8).
const char* fp8_refusal(const ops::Backend::Fp8Pair& f, const GemmProblem& p, float beta, const Tensor& C,
                        const Tensor& D, const Tensor& bias) {
  if (const char* why = fp8_gemm_refusal(f.a.kind, f.b.kind, p.m, p.n)) return why;
  const bool tensor = f.a.kind.granularity == fp8::Granularity::Tensor &&
                      f.b.kind.granularity == fp8::Granularity::Tensor;
  if (!tensor && (!f.a.block_scales.defined() || !f.b.block_scales.defined()))
    return "the operands carry no block scales (quantized on another backend)";
  auto aligned = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0 && (t.size(1) * int64_t(dtype_size(t.dtype()))) % 16 == 0;
  };
  if (!aligned(D) || (beta != 0.0f && !aligned(C)) || (bias.defined() && reinterpret_cast<uintptr_t>(bias.raw()) % 16))
    return "an output, C or bias is not 16-byte aligned (row strides included)";
  return nullptr;
}

// Says once per reason that FP8 GEMMs of f's kind of operands run as the exact emulation.
void say_emulated(const ops::Backend::Fp8Pair& f, const char* why) {
  if (*why)
    say_once(fmt::format("FP8 GEMMs of {} x {} operands run as bf16 GEMMs of the same values (exact emulation, "
                         "docs/fp8.md) where {}",
                         fp8::granularity_name(f.a.kind.granularity), fp8::granularity_name(f.b.kind.granularity),
                         why));
}

// The block scales of an operand of `outer` rows and inner dimension k, checked against gemm.h's
// layout (quantize_fp8 wrote them for this operand).
const float* block_scales(const ops::Backend::Fp8Operand& o, GemmScale mode, int64_t outer, int64_t k,
                          const char* which) {
  const int64_t want = gemm_scale_count(mode, outer, k);
  const Tensor& s = o.block_scales;
  PRIMUS_CHECK(s.device() == Device::CUDA && s.dtype() == DType::F32 && s.numel() == want && s.is_contiguous(),
               "gemm_fp8: {}'s block scales are {} {} on the {}, expected {} fp32 values on the GPU ({} of {} rows, "
               "inner dimension {})",
               which, dtype_name(s.dtype()), s.shape_str(), device_name(s.device()), want, gemm_scale_name(mode), outer,
               k);
  return static_cast<const float*>(s.raw());
}

}  // namespace

void CudaBackend::gemm(bool ta, bool tb, float alpha, const Tensor& A, const Tensor& Bm, float beta, const Tensor& C,
                       Tensor& D, const Tensor& bias) {
  run_gemm(gemm_problem(ta, tb, A, Bm, D, "gemm"), alpha, A.raw(), nullptr, Bm.raw(), nullptr, beta, C, D, bias);
}

void CudaBackend::gemm_fp8(const Fp8Pair& f, bool ta, bool tb, float alpha, const Tensor& A, const Tensor& Bm,
                           float beta, const Tensor& C, Tensor& D, const Tensor& bias) {
  GemmProblem p = gemm_problem(ta, tb, A, Bm, D, "gemm_fp8");
  const char* why = p.m == 0 || p.n == 0 || p.k == 0 ? "" : fp8_refusal(f, p, beta, C, D, bias);
  if (why) {  // the exact emulation: the FP8 values (times their blocks' inverse scales) are bf16 values
    say_emulated(f, why);
    return gemm(ta, tb, alpha, A, Bm, beta, C, D, bias);
  }
  // cuBLASLt's FP8 layout (gemm.h, fp8_gemm_problem): A [m, k] and B [n, k] as bytes, k padded
  // with zeros to a multiple of 16 (their leading dimension); block-scaled operands divided by
  // their blocks' scales on the way (the scales' layout does not change with the padding:
  // ceil(k / 128) blocks).
  const GemmProblem q = fp8_gemm_problem(p, f.a.kind, f.b.kind);
  const bool blocks = q.a_scale != GemmScale::Tensor;
  const float* scale_a = blocks ? block_scales(f.a, q.a_scale, p.m, p.k, "A") : nullptr;
  const float* scale_b = blocks ? block_scales(f.b, q.b_scale, p.n, p.k, "B") : nullptr;
  Scratch a8(size_t(p.m * q.k)), b8(size_t(p.n * q.k));
  fp8_pack(A.raw(), false, A.size(0), A.size(1), f.a.kind.format == fp8::Format::E4M3, ta, q.k, a8.as<uint8_t>(),
           stream(), scale_a, q.a_scale == GemmScale::Vec128);
  fp8_pack(Bm.raw(), false, Bm.size(0), Bm.size(1), f.b.kind.format == fp8::Format::E4M3, !tb, q.k, b8.as<uint8_t>(),
           stream(), scale_b, q.b_scale == GemmScale::Vec128);
  run_gemm(q, alpha, a8.get(), scale_a, b8.get(), scale_b, beta, C, D, bias);
}

void CudaBackend::grouped_gemm_fp8(const std::vector<Fp8Pair>& f, bool ta, bool tb, const std::vector<float>& alpha,
                                   const std::vector<Tensor>& A, const std::vector<Tensor>& Bm, float beta,
                                   std::vector<Tensor>& D) {
  PRIMUS_CHECK(A.size() == Bm.size() && A.size() == D.size() && alpha.size() == A.size() && f.size() == A.size(),
               "grouped_gemm_fp8 of {} A, {} B, {} D, {} alphas and {} operand pairs", A.size(), Bm.size(), D.size(),
               alpha.size(), f.size());
  // cuBLAS's grouped call has no FP8 types: one cuBLASLt FP8 GEMM per problem. The problems that
  // run emulated (gemm_fp8's rules) stay one grouped GEMM.
  struct {
    std::vector<Tensor> a, b, d;
    std::vector<float> alpha;
  } emulated;
  for (size_t i = 0; i < A.size(); ++i) {
    PRIMUS_CHECK(A[i].dim() == 2 && D[i].dim() == 2, "grouped_gemm_fp8 problem {} takes 2-d tensors", i);
    if (D[i].numel() == 0) continue;
    if ((ta ? A[i].size(0) : A[i].size(1)) == 0) {  // an expert without rows in a weight gradient: D = beta D
      PRIMUS_CHECK(beta == 0.0f || beta == 1.0f, "grouped_gemm_fp8 problem {}: an empty inner dimension with beta {}",
                   i, beta);
      if (beta == 0.0f) D[i].zero_();
      continue;
    }
    const Tensor C = beta != 0.0f ? D[i] : Tensor();
    const GemmProblem p = gemm_problem(ta, tb, A[i], Bm[i], D[i], fmt::format("grouped_gemm_fp8 problem {}", i));
    if (const char* why = fp8_refusal(f[i], p, beta, C, D[i], Tensor())) {
      say_emulated(f[i], why);
      emulated.a.push_back(A[i]), emulated.b.push_back(Bm[i]), emulated.d.push_back(D[i]);
      emulated.alpha.push_back(alpha[i]);
      continue;
    }
    gemm_fp8(f[i], ta, tb, alpha[i], A[i], Bm[i], beta, C, D[i], Tensor());
  }
  if (!emulated.a.empty()) grouped_gemm(ta, tb, emulated.alpha, emulated.a, emulated.b, beta, emulated.d);
}

void CudaBackend::grouped_gemm(bool ta, bool tb, const std::vector<float>& alpha, const std::vector<Tensor>& A,
                               const std::vector<Tensor>& Bm, float beta, std::vector<Tensor>& D) {
  PRIMUS_CHECK(A.size() == Bm.size() && A.size() == D.size() && alpha.size() == A.size(),
               "grouped_gemm of {} A, {} B, {} D and {} alphas", A.size(), Bm.size(), D.size(), alpha.size());
  std::vector<GroupedGemmProblem> problems;
  for (size_t i = 0; i < A.size(); ++i) {
    PRIMUS_CHECK(A[i].dim() == 2 && Bm[i].dim() == 2 && D[i].dim() == 2, "grouped_gemm problem {} takes 2-d tensors", i);
    const int64_t k = ta ? A[i].size(0) : A[i].size(1);
    if (k == 0 && D[i].numel() > 0) {  // an expert without rows in a weight gradient: D = beta D
      PRIMUS_CHECK(beta == 0.0f || beta == 1.0f, "grouped_gemm problem {}: an empty inner dimension with beta {}", i,
                   beta);
      if (beta == 0.0f) D[i].zero_();
      continue;
    }
    if (D[i].dtype() != DType::BF16) {  // bf16 x bf16 -> fp32 is not a type combination of the grouped call
      gemm(ta, tb, alpha[i], A[i], Bm[i], beta, beta != 0.0f ? D[i] : Tensor(), D[i], Tensor());
      continue;
    }
    const GemmProblem g = gemm_problem(ta, tb, A[i], Bm[i], D[i], fmt::format("grouped_gemm problem {}", i));
    GroupedGemmProblem p;
    p.m = g.m, p.n = g.n, p.k = g.k;
    p.lda = g.lda, p.ldb = g.ldb, p.ldd = g.ldd;
    p.A = A[i].raw(), p.B = Bm[i].raw(), p.D = D[i].raw();
    p.alpha = alpha[i];
    problems.push_back(p);
  }
  cuda::grouped_gemm(ta, tb, beta, problems);
}

void CudaBackend::rmsnorm_forward(const Tensor& x, const Tensor& w, Tensor& y, Tensor& rstd, float eps) {
  const int64_t n = x.size(0), c = x.size(1);
  check(x, DType::BF16, "rmsnorm x");
  check(w, DType::BF16, {c}, "rmsnorm w");
  check(y, DType::BF16, {n, c}, "rmsnorm y");
  check(rstd, DType::F32, {n}, "rmsnorm rstd");
  cuda::rmsnorm_forward(B(x), B(w), B(y), F(rstd), n, c, eps, stream());
}

void CudaBackend::rmsnorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                         const Tensor& residual, Tensor& dx) {
  const int64_t n = x.size(0), c = x.size(1);
  check(dy, DType::BF16, {n, c}, "rmsnorm dy");
  check(x, DType::BF16, "rmsnorm x");
  check(w, DType::BF16, {c}, "rmsnorm w");
  check(rstd, DType::F32, {n}, "rmsnorm rstd");
  check(dx, DType::BF16, {n, c}, "rmsnorm dx");
  if (residual.defined()) check(residual, DType::BF16, {n, c}, "rmsnorm residual");
  cuda::rmsnorm_backward_input(B(dy), B(x), B(w), F(rstd), residual.defined() ? B(residual) : nullptr, B(dx), n, c,
                               stream());
}

void CudaBackend::rmsnorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& rstd, Tensor& dw) {
  const int64_t n = x.size(0), c = x.size(1);
  check(dy, DType::BF16, {n, c}, "rmsnorm dy");
  check(x, DType::BF16, "rmsnorm x");
  check(rstd, DType::F32, {n}, "rmsnorm rstd");
  check(dw, DType::F32, {c}, "rmsnorm dw");
  cuda::rmsnorm_backward_weight(B(dy), B(x), F(rstd), F(dw), n, c, stream());
}

void CudaBackend::glu_forward(const Tensor& gate_up, Tensor& act, const ops::Glu& glu) {
  const int64_t n = act.size(0), f = act.size(1);
  check(gate_up, DType::BF16, {n, 2 * f}, "swiglu gate_up");
  check(act, DType::BF16, "swiglu act");
  cuda::swiglu_forward(B(gate_up), B(act), n, f, stream(), {float(glu.alpha), float(glu.offset), float(glu.limit)});
}

void CudaBackend::glu_backward(const Tensor& dact, const Tensor& gate_up, Tensor& dgate_up, const ops::Glu& glu) {
  const int64_t n = dact.size(0), f = dact.size(1);
  check(dact, DType::BF16, "swiglu dact");
  check(gate_up, DType::BF16, {n, 2 * f}, "swiglu gate_up");
  check(dgate_up, DType::BF16, {n, 2 * f}, "swiglu dgate_up");
  cuda::swiglu_backward(B(dact), B(gate_up), B(dgate_up), n, f, stream(),
                        {float(glu.alpha), float(glu.offset), float(glu.limit)});
}

void CudaBackend::rope_apply(Tensor& x, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0, const Tensor& cos,
                             const Tensor& sin, bool inverse) {
  check(x, DType::BF16, "rope x");
  check(cos, DType::F32, "rope cos");
  check(sin, DType::F32, cos.shape(), "rope sin");
  PRIMUS_CHECK(heads * head_dim <= x.size(1) && cos.size(1) * 2 == head_dim && pos0 >= 0 &&
                   pos0 + std::min(seq, x.size(0)) <= cos.size(0),
               "rope of {} heads of {} at positions from {} on rows of {} with tables {}", heads, head_dim, pos0,
               x.size(1), cos.shape_str());
  cuda::rope_apply(B(x), x.size(0), x.size(1), heads, head_dim, seq, pos0, F(cos), F(sin), inverse, stream());
}

void CudaBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, const ops::AttentionShape& s) {
  const AttentionDims d = dims_of(s);
  if (const std::string why = flash_attention_unsupported(d); !why.empty()) fail("attention on the GPU: {}", why);
  check(qkv, DType::BF16, {s.batch * s.seq, s.qkv_stride()}, "attention qkv");
  check(out, DType::BF16, {s.batch * s.seq, s.heads * s.head_dim}, "attention out");
  check(lse, DType::F32, {s.batch, s.heads, s.seq}, "attention lse");
  flash_attention_forward(B(qkv), B(out), F(lse), d, true, stream());
}

void CudaBackend::attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                                     Tensor& dqkv, const ops::AttentionShape& s) {
  const AttentionDims d = dims_of(s);
  if (const std::string why = flash_attention_unsupported(d); !why.empty()) fail("attention on the GPU: {}", why);
  check(qkv, DType::BF16, {s.batch * s.seq, s.qkv_stride()}, "attention qkv");
  check(out, DType::BF16, {s.batch * s.seq, s.heads * s.head_dim}, "attention out");
  check(dout, DType::BF16, out.shape(), "attention dout");
  check(lse, DType::F32, {s.batch, s.heads, s.seq}, "attention lse");
  check(dqkv, DType::BF16, qkv.shape(), "attention dqkv");
  flash_attention_backward(B(qkv), B(out), F(lse), B(dout), B(dqkv), d, true, stream());
}

void CudaBackend::attention_sink_backward(const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dsinks,
                                          const ops::AttentionShape& s) {
  PRIMUS_CHECK(s.sinks.defined(), "attention sink backward without sinks");
  const AttentionDims d = dims_of(s);
  check(out, DType::BF16, {s.batch * s.seq, s.heads * s.head_dim}, "attention out");
  check(dout, DType::BF16, out.shape(), "attention dout");
  check(lse, DType::F32, {s.batch, s.heads, s.seq}, "attention lse");
  check(dsinks, DType::F32, {s.heads}, "attention dsinks");
  cuda::attention_sink_backward(B(out), F(lse), B(dout), d.sinks, F(dsinks), d, stream());
}

void CudaBackend::attention_block_forward(const Tensor& qkv, const Tensor& kv, Tensor& out, Tensor& lse,
                                          const ops::AttentionShape& s, bool causal) {
  ops::refuse_window_and_sinks(s, "attention_block_forward");
  const AttentionDims d = dims_of(s);
  if (const std::string why = flash_attention_unsupported(d); !why.empty()) fail("attention on the GPU: {}", why);
  const int64_t rows = s.batch * s.seq;
  check(qkv, DType::BF16, {rows, s.qkv_stride()}, "attention qkv");
  check(kv, DType::BF16, {rows, 2 * s.groups * s.head_dim}, "attention kv");
  check(out, DType::BF16, {rows, s.heads * s.head_dim}, "attention block out");
  check(lse, DType::F32, {s.batch, s.heads, s.seq}, "attention block lse");
  flash_attention_block_forward(B(qkv), B(kv), B(out), F(lse), d, causal, stream());
}

void CudaBackend::attention_merge(Tensor& acc, Tensor& lse, const Tensor& block_out, const Tensor& block_lse,
                                  const ops::AttentionShape& s) {
  const Shape rows = {s.batch * s.seq, s.heads * s.head_dim}, stats = {s.batch, s.heads, s.seq};
  check(acc, DType::F32, rows, "attention merge acc");
  check(lse, DType::F32, stats, "attention merge lse");
  check(block_out, DType::BF16, rows, "attention merge block out");
  check(block_lse, DType::F32, stats, "attention merge block lse");
  cuda::attention_merge(F(acc), F(lse), B(block_out), F(block_lse), dims_of(s), stream());
}

void CudaBackend::attention_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                                           const Tensor& dout, Tensor& dq_acc, Tensor& dkv_acc,
                                           const ops::AttentionShape& s, bool causal) {
  ops::refuse_window_and_sinks(s, "attention_block_backward");
  const AttentionDims d = dims_of(s);
  if (const std::string why = flash_attention_unsupported(d); !why.empty()) fail("attention on the GPU: {}", why);
  const int64_t rows = s.batch * s.seq;
  check(qkv, DType::BF16, {rows, s.qkv_stride()}, "attention qkv");
  check(kv, DType::BF16, {rows, 2 * s.groups * s.head_dim}, "attention kv");
  check(out, DType::BF16, {rows, s.heads * s.head_dim}, "attention out");
  check(dout, DType::BF16, out.shape(), "attention dout");
  check(lse, DType::F32, {s.batch, s.heads, s.seq}, "attention lse");
  check(dq_acc, DType::F32, out.shape(), "attention dq_acc");
  check(dkv_acc, DType::F32, kv.shape(), "attention dkv_acc");
  flash_attention_block_backward(B(qkv), B(kv), B(out), F(lse), B(dout), F(dq_acc), F(dkv_acc), d, causal, stream());
}

void CudaBackend::attention_decode(const Tensor& cache, int64_t first, Tensor& out, const ops::AttentionShape& s) {
  const AttentionDims d = dims_of(s);
  if (const std::string why = attention_decode_unsupported(d); !why.empty()) fail("attention on the GPU: {}", why);
  check(cache, DType::BF16, "attention cache");
  PRIMUS_CHECK(cache.size(0) >= s.seq && cache.size(1) == s.qkv_stride() && first >= 0 && first < s.seq,
               "attention decode of rows {}..{} on a cache {}", first, s.seq, cache.shape_str());
  check(out, DType::BF16, {s.seq - first, s.heads * s.head_dim}, "attention out");
  cuda::attention_decode(B(cache), first, B(out), d, stream());
}

void CudaBackend::embedding_forward(const Tensor& tokens, const Tensor& table, Tensor& out) {
  const int64_t n = out.size(0), c = out.size(1);
  check(tokens, DType::I32, {n}, "embedding tokens");
  check(table, DType::BF16, "embedding table");
  PRIMUS_CHECK(table.size(1) == c, "embedding table {} for rows of {}", table.shape_str(), c);
  check(out, DType::BF16, "embedding out");
  cuda::embedding_forward(I(tokens), B(table), B(out), n, c, stream());
}

void CudaBackend::embedding_backward(const std::vector<int32_t>& host_tokens, const Tensor& dout, Tensor& dtable) {
  const int64_t n = dout.size(0), c = dout.size(1);
  check(dout, DType::BF16, "embedding dout");
  check(dtable, DType::F32, "embedding dtable");
  PRIMUS_CHECK(int64_t(host_tokens.size()) == n && dtable.size(1) == c, "embedding backward: {} tokens, dout {}, dtable {}",
               host_tokens.size(), dout.shape_str(), dtable.shape_str());
  EmbeddingGrouping grp = EmbeddingGrouping::build(host_tokens.data(), n);
  // Negative ids (tokens of other vocabulary shards) sort first: drop their groups.
  const auto skip = std::lower_bound(grp.unique_tokens.begin(), grp.unique_tokens.end(), 0) - grp.unique_tokens.begin();
  grp.unique_tokens.erase(grp.unique_tokens.begin(), grp.unique_tokens.begin() + skip);
  grp.offsets.erase(grp.offsets.begin(), grp.offsets.begin() + skip);
  if (grp.unique_tokens.empty()) return;
  PRIMUS_CHECK(grp.unique_tokens.back() < dtable.size(0), "embedding backward: token {} outside the table {}",
               grp.unique_tokens.back(), dtable.shape_str());
  const Tensor u = upload(grp.unique_tokens), o = upload(grp.offsets), p = upload(grp.positions);
  cuda::embedding_backward(I(u), I(o), I(p), int64_t(grp.unique_tokens.size()), B(dout), F(dtable), c, stream());
  // u, o and p return to the caching allocator here; later work on the stream may reuse them
  // only after this kernel (stream order).
}

void CudaBackend::column_sum_accumulate(const Tensor& dy, Tensor& out) {
  const int64_t n = dy.size(0), m = dy.size(1);
  check(dy, DType::BF16, "column sum dy");
  check(out, DType::F32, {m}, "column sum out");
  cuda::column_sum_accumulate(B(dy), F(out), n, m, stream());
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  const DType t = a.dtype() == DType::F32 ? DType::F32 : DType::BF16;  // activations, or fp32 gradient shards
  check(a, t, "add a");
  check(b, t, a.shape(), "add b");
  check(out, t, a.shape(), "add out");
  if (t == DType::F32)
    cuda::add(F(a), F(b), F(out), out.numel(), stream());
  else
    cuda::add(B(a), B(b), B(out), out.numel(), stream());
}

void CudaBackend::dropout(const Tensor& x, Tensor& y, double p, uint64_t seed) {
  PRIMUS_CHECK(p >= 0.0 && p < 1.0, "dropout: p {} outside [0, 1)", p);
  const DType t = x.dtype() == DType::F32 ? DType::F32 : DType::BF16;
  check(x, t, "dropout x");
  check(y, t, x.shape(), "dropout y");
  const ops::DropoutMask m(p, seed);
  if (t == DType::F32)
    cuda::dropout(F(x), F(y), y.numel(), m.seed, m.threshold, float(m.scale), stream());
  else
    cuda::dropout(B(x), B(y), y.numel(), m.seed, m.threshold, float(m.scale), stream());
}

void CudaBackend::gather_rows(const Tensor& x, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                              Tensor& out) {
  const DType t = row_op_dtype(x, "gather_rows");
  check(x, t, "gather_rows x");
  PRIMUS_CHECK(x.dim() == 2, "gather_rows x is {}, expected 2-d", x.shape_str());
  const int64_t n = int64_t(rows.size()), c = x.size(1);
  check(out, t, {n, c}, "gather_rows out");
  check_rows(rows, x.size(0), "gather_rows");
  const Tensor s = upload_scale(scale, rows.size(), "gather_rows");
  if (n == 0 || c == 0) return;
  const Tensor r = upload(rows);
  if (t == DType::F32)
    cuda::gather_rows(F(x), I(r), scales(s), F(out), n, c, stream());
  else
    cuda::gather_rows(B(x), I(r), scales(s), B(out), n, c, stream());
}

void CudaBackend::scatter_add_rows(const Tensor& y, const std::vector<int32_t>& rows, const std::vector<double>& scale,
                                   Tensor& out) {
  const DType t = row_op_dtype(y, "scatter_add_rows");
  check(y, t, "scatter_add_rows y");
  check(out, t, "scatter_add_rows out");
  const int64_t n = int64_t(rows.size());
  PRIMUS_CHECK(y.dim() == 2 && y.size(0) == n && out.dim() == 2 && out.size(1) == y.size(1),
               "scatter_add_rows of y {} ({} rows listed) into out {}", y.shape_str(), n, out.shape_str());
  check_rows(rows, out.size(0), "scatter_add_rows");
  const Tensor s = upload_scale(scale, rows.size(), "scatter_add_rows");
  const int64_t c = y.size(1);
  if (n == 0 || c == 0) return;
  // Each destination row's list indices in list order: a deterministic sum with no atomics.
  const EmbeddingGrouping g = EmbeddingGrouping::build(rows.data(), n);
  const Tensor dest = upload(g.unique_tokens), off = upload(g.offsets), lists = upload(g.positions);
  const int64_t m = int64_t(g.unique_tokens.size());
  if (t == DType::F32)
    cuda::scatter_add_rows(I(dest), I(off), I(lists), m, F(y), scales(s), F(out), c, stream());
  else
    cuda::scatter_add_rows(I(dest), I(off), I(lists), m, B(y), scales(s), B(out), c, stream());
}

std::vector<double> CudaBackend::row_dots(const Tensor& a, const std::vector<int32_t>& rows, const Tensor& b) {
  const DType t = row_op_dtype(a, "row_dots");
  check(a, t, "row_dots a");
  check(b, t, "row_dots b");
  const int64_t n = int64_t(rows.size());
  PRIMUS_CHECK(a.dim() == 2 && b.dim() == 2 && b.size(0) == n && a.size(1) == b.size(1),
               "row_dots of a {} and b {} ({} rows listed)", a.shape_str(), b.shape_str(), n);
  check_rows(rows, a.size(0), "row_dots");
  std::vector<double> dots(rows.size(), 0.0);
  if (n == 0) return dots;
  const Tensor r = upload(rows);
  const Scratch d(size_t(n) * sizeof(double));
  if (t == DType::F32)
    cuda::row_dots(F(a), I(r), F(b), d.as<double>(), n, a.size(1), stream());
  else
    cuda::row_dots(B(a), I(r), B(b), d.as<double>(), n, a.size(1), stream());
  copy_to_host(dots.data(), d.get(), size_t(n) * sizeof(double));
  return dots;
}

void CudaBackend::ce_init(Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  const int64_t n = row_max.numel();
  check(row_max, DType::F32, {n}, "ce row_max");
  check(row_sum, DType::F32, {n}, "ce row_sum");
  check(target_logit, DType::F32, {n}, "ce target_logit");
  cuda::ce_init(F(row_max), F(row_sum), F(target_logit), n, stream());
}

void CudaBackend::ce_chunk_forward(const Tensor& logits, const Tensor& targets, int64_t c0, double softcap,
                                   Tensor& row_max, Tensor& row_sum, Tensor& target_logit) {
  const int64_t n = logits.size(0), vc = logits.size(1);
  check(logits, DType::F32, "ce logits");
  check(targets, DType::I32, {n}, "ce targets");
  check(row_max, DType::F32, {n}, "ce row_max");
  check(row_sum, DType::F32, {n}, "ce row_sum");
  check(target_logit, DType::F32, {n}, "ce target_logit");
  cuda::ce_chunk_forward(F(logits), I(targets), c0, vc, float(softcap), F(row_max), F(row_sum), F(target_logit), n,
                         stream());
}

void CudaBackend::ce_merge_max(Tensor& row_max, Tensor& row_sum, const Tensor& global_max) {
  const int64_t n = row_max.numel();
  check(row_max, DType::F32, {n}, "ce row_max");
  check(row_sum, DType::F32, {n}, "ce row_sum");
  check(global_max, DType::F32, {n}, "ce global_max");
  cuda::ce_merge_max(F(row_max), F(row_sum), F(global_max), n, stream());
}

double CudaBackend::ce_finish(const Tensor& row_max, const Tensor& row_sum, const Tensor& target_logit,
                              const Tensor& targets, Tensor& lse) {
  const int64_t n = row_max.numel();
  check(lse, DType::F32, {n}, "ce lse");
  check(targets, DType::I32, {n}, "ce targets");
  cuda::ce_finish(F(row_max), F(row_sum), F(target_logit), I(targets), F(lse), F(loss_sum_), n, stream());
  float total = 0;
  copy_to_host(&total, loss_sum_.raw(), sizeof(float));
  return double(total);
}

void CudaBackend::ce_chunk_backward(const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t c0,
                                    double softcap, Tensor& dlogits) {
  const int64_t n = logits.size(0), vc = logits.size(1);
  check(logits, DType::F32, "ce logits");
  check(lse, DType::F32, {n}, "ce lse");
  check(targets, DType::I32, {n}, "ce targets");
  check(dlogits, DType::BF16, {n, vc}, "ce dlogits");
  cuda::ce_chunk_backward(F(logits), F(lse), I(targets), c0, vc, float(softcap), B(dlogits), n, stream());
}

ops::Backend::Fp8Quantized CudaBackend::quantize_fp8(const Tensor& src, fp8::Format format,
                                                     fp8::Granularity granularity, bool reduce_cols, float scale,
                                                     Tensor& dst, const Fp8AmaxOut& amax_out) {
  check_fp8_operands(src, dst);
  if (src.device() != Device::CUDA || dst.device() != Device::CUDA ||
      (src.dtype() != DType::BF16 && src.dtype() != DType::F32))
    return ops::Backend::quantize_fp8(src, format, granularity, reduce_cols, scale, dst, amax_out);
  // The amax folded into the accumulator on the GPU (no wait), or returned, or not at all.
  const bool on_device = amax_out.acc.defined() && amax_out.acc.device() == Device::CUDA;
  Fp8AmaxDest dest{nullptr, amax_out.needed || amax_out.acc.defined()};
  if (on_device) {
    check_fp8_amax_out(amax_out);
    dest.fold = static_cast<float*>(amax_out.acc.raw()) + amax_out.index;
  }
  const bool tensor = granularity == fp8::Granularity::Tensor;
  // Blockwise's tiles and blocks: their dequantization scales for cuBLASLt's block-scaled GEMMs
  // too (gemm.h's layouts; gemm_fp8 decides whether they run).
  Tensor gemm_scales;
  Fp8GemmScales gs;
  if (const std::optional<GemmScale> mode = gemm_scale(granularity); mode && *mode != GemmScale::Tensor) {
    const int64_t outer = reduce_cols ? src.size(0) : src.size(1), k = reduce_cols ? src.size(1) : src.size(0);
    gemm_scales = empty({gemm_scale_count(*mode, outer, k)}, DType::F32);
    gs.out = static_cast<float*>(gemm_scales.raw());
    gs.k_along_cols = reduce_cols;
  }
  const Fp8Result r = fp8_quantize(src.raw(), dst.raw(), src.dtype() == DType::F32, src.size(0), src.size(1),
                                   format == fp8::Format::E4M3, tensor ? 0 : fp8::band_rows(granularity, reduce_cols),
                                   fp8::block_cols(granularity, reduce_cols), granularity == fp8::Granularity::Mx32,
                                   scale, stream(), gs, dest);
  const Fp8Quantized q{r.amax, r.scale, gemm_scales};
  return on_device ? q : deliver_amax(q, amax_out);
}

void CudaBackend::cast(const Tensor& src, Tensor& dst) {
  PRIMUS_CHECK(src.numel() == dst.numel(), "cast of {} elements into {}", src.numel(), dst.numel());
  if (src.dtype() == DType::F32 && dst.dtype() == DType::BF16) {
    check(src, DType::F32, "cast source");
    check(dst, DType::BF16, "cast destination");
    cast_f32_to_bf16(F(src), B(dst), src.numel(), stream());
  } else if (src.dtype() == DType::BF16 && dst.dtype() == DType::F32) {
    check(src, DType::BF16, "cast source");
    check(dst, DType::F32, "cast destination");
    cast_bf16_to_f32(B(src), F(dst), src.numel(), stream());
  } else {
    fail("cast from {} to {} is not an op of the GPU backend", dtype_name(src.dtype()), dtype_name(dst.dtype()));
  }
}

void CudaBackend::synchronize() { cuda::synchronize(); }
MemoryStats CudaBackend::memory_stats() const { return device_memory_stats(); }
void CudaBackend::reset_peak_memory() { reset_peak_device_memory(); }

double CudaBackend::peak_tflops() const {
  if (peak_tflops_ == 0) {
    peak_tflops_ = device_info().peak_bf16_tflops;
    if (peak_tflops_ <= 0) peak_tflops_ = measure_bf16_peak_tflops();
  }
  return peak_tflops_;
}

}  // namespace primus::cuda
