// The bf16 backend's kernels besides the GEMM (gemm.h), on raw host buffers: bf16 values are
// uint16_t, statistics and gradients fp32. Each computes in fp32 and rounds what it writes to bf16
// once, the contract the reference backend defines (kernels/backend.h). They need a CPU with
// AVX-512 and AVX512-BF16 (cpu_features.h); arguments are checked by the backend (bf16_backend.h).
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/fp8.h"

namespace primus::cpu::bf16k {

// ---- attention (attention_avx512.cpp), the layout of kernels/cpu/attention.h ----
// docs: documents packed into the sequences (kernels/cpu/attention.h), or none; s.window and sinks
// (fp32 [heads], or null) as kernels/cpu/attention.h defines them.
void attention_forward(const uint16_t* qkv, uint16_t* out, float* lse, const AttentionShape& s,
                       const Documents& docs = {}, const float* sinks = nullptr);
void attention_backward(const uint16_t* qkv, const uint16_t* out, const float* lse, const uint16_t* dout,
                        uint16_t* dqkv, const AttentionShape& s, const Documents& docs = {});
void attention_decode(const uint16_t* cache, int64_t first, uint16_t* out, const AttentionShape& s,
                      const float* sinks = nullptr);

// ---- rows and elements (elementwise_avx512.cpp) ----
void rmsnorm_forward(const uint16_t* x, const uint16_t* w, uint16_t* y, float* rstd, int64_t n, int64_t c, float eps);
// dx = residual (null: 0; may be dx) + d(norm)/dx.
void rmsnorm_backward_input(const uint16_t* dy, const uint16_t* x, const uint16_t* w, const float* rstd,
                            const uint16_t* residual, uint16_t* dx, int64_t n, int64_t c);
void rmsnorm_backward_weight(const uint16_t* dy, const uint16_t* x, const float* rstd, float* dw, int64_t n, int64_t c);
void swiglu_forward(const uint16_t* gate_up, uint16_t* act, int64_t n, int64_t f);
void swiglu_backward(const uint16_t* dact, const uint16_t* gate_up, uint16_t* dgate_up, int64_t n, int64_t f);
void rope_apply(uint16_t* x, int64_t rows, int64_t stride, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0,
                const float* cos, const float* sin, bool inverse);
// Ids are checked by the caller (< vocab); negative ids give zero rows / are skipped.
void embedding_forward(const int32_t* tokens, const uint16_t* table, uint16_t* out, int64_t n, int64_t c);
void embedding_backward(const int32_t* tokens, const uint16_t* dout, float* dtable, int64_t n, int64_t c);
void column_sum_accumulate(const uint16_t* dy, float* out, int64_t n, int64_t m);
void add_bf16(const uint16_t* a, const uint16_t* b, uint16_t* out, int64_t n);
void add_f32(const float* a, const float* b, float* out, int64_t n);
void cast_f32_to_bf16(const float* src, uint16_t* dst, int64_t n);
void cast_bf16_to_f32(const uint16_t* src, float* dst, int64_t n);

// ---- MoE token routing (row_ops_avx512.cpp): kernels/backend.h's row ops, bit for bit the default
// implementation's (double inside, one rounding per result, in list order) ----
// out[i] = scale[i] (null: 1) * x[rows[i]], rows of c values.
void gather_rows(const uint16_t* x, int64_t c, const int32_t* rows, const double* scale, int64_t n, uint16_t* out);
// out[r] += scale[i] (null: 1) * y[i] for the listed i of each row r, order[first[r] .. first[r + 1])
// in list order (first: out_rows + 1 offsets); rows without any stay untouched.
void scatter_add_rows(const uint16_t* y, int64_t c, const int64_t* first, const int32_t* order, int64_t out_rows,
                      const double* scale, uint16_t* out);
// out[i] = <a[rows[i]], b[i]> in double, one fused multiply-add per column in order.
void row_dots(const uint16_t* a, int64_t c, const int32_t* rows, const uint16_t* b, int64_t n, double* out);

// ---- FP8 quantization (fp8_avx512.cpp): fp8::amax and fp8::quantize (kernels/fp8.h) on bf16
// values, bf16 out, with the same bits as the op set's default; serial (kernels/fp8_bands.h
// splits the rows between the threads) ----
float fp8_amax(const uint16_t* x, int64_t n);
float fp8_quantize(const uint16_t* x, int64_t rows, int64_t cols, fp8::Format format, fp8::Granularity g,
                   bool reduce_cols, float scale, uint16_t* out);

// Cross-entropy over a chunk of fp32 logits [n, vc] whose columns are vocabulary ids c0 ..
// c0 + vc (kernels/backend.h), soft-capped first when cap > 0 (kernels/softcap.h).
void ce_chunk_forward(const float* logits, const int32_t* targets, int64_t n, int64_t vc, int64_t c0, float cap,
                      float* row_max, float* row_sum, float* target_logit);
// dlogits = softmax - onehot (masked rows 0), times the cap's slope when cap > 0; bf16 (or fp32,
// which may be logits itself).
void ce_chunk_backward(const float* logits, const float* lse, const int32_t* targets, int64_t n, int64_t vc, int64_t c0,
                       float cap, uint16_t* dlogits_bf16, float* dlogits_f32);
// Both, per row with the row in cache (kernels/backend.h ce_forward_backward): lse, the target's
// (capped) logit (0 where the target is masked), and dlogits.
void ce_forward_backward(const float* logits, const int32_t* targets, int64_t n, int64_t vc, int64_t c0, float cap,
                         float* lse, float* target_logit, uint16_t* dlogits_bf16, float* dlogits_f32);

}  // namespace primus::cpu::bf16k
