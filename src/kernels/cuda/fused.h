// The CUDA backend's own fused kernels: everything of a Llama training step that is not a GEMM or
// attention. bf16 in and out, fp32 arithmetic and statistics, fp32 weight gradients accumulated
// (+=). Each mirrors a CPU kernel (kernels/cpu/elementwise.h), which is its reference in the GPU
// tests. Row-major, contiguous; n rows. All run on `stream` and never synchronise.
// Reductions (weight gradients of norms, bias gradients, sums of squares, the loss) go through
// fixed-shape two-stage trees: the same inputs give the same bits on every run (and on every GPU:
// the tree shapes depend on the sizes only). Their partial sums live in cuda::Scratch, whose
// blocks the caching allocator reuses in compute-stream order: pass cuda::stream() (or
// synchronise before freeing memory on another stream). Zero rows (n == 0) launch nothing.
// Implementations: fused_norm.cu, fused_elementwise.cu, fused_cross_entropy.cu, fused_optimizer.cu,
// fused_row_ops.cu.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace primus::cuda {

using bf16 = __nv_bfloat16;

// ---- RMSNorm ----
// y = x * rstd * w, rstd[i] = 1 / sqrt(mean_j x[i,j]^2 + eps).
void rmsnorm_forward(const bf16* x, const bf16* w, bf16* y, float* rstd, int64_t n, int64_t c, float eps,
                     cudaStream_t stream);
// dx = residual + rstd * (w*dy - x * rstd^2 * mean_j(w*dy*x)); residual may be null (then 0) or
// equal to dx (in place: the residual gradient of a pre-norm block flows straight through).
void rmsnorm_backward_input(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, const bf16* residual,
                            bf16* dx, int64_t n, int64_t c, cudaStream_t stream);
// dw[j] += sum_i dy[i,j] * x[i,j] * rstd[i]
void rmsnorm_backward_weight(const bf16* dy, const bf16* x, const float* rstd, float* dw, int64_t n, int64_t c,
                             cudaStream_t stream);

// ---- SwiGLU on a fused [gate | up] row of 2f values ----
// With glu (kernels/cpu/elementwise.h, Glu): g = min(gate, limit), u = clamp(up, +-limit),
// act = g sigmoid(alpha g) (u + offset); limit 0: no clamp. The default is SwiGLU.
struct GluArgs {
  float alpha = 1.0f, offset = 0.0f, limit = 0.0f;
};
void swiglu_forward(const bf16* gate_up, bf16* act, int64_t n, int64_t f, cudaStream_t stream,
                    const GluArgs& glu = {});
void swiglu_backward(const bf16* dact, const bf16* gate_up, bf16* dgate_up, int64_t n, int64_t f,
                     cudaStream_t stream, const GluArgs& glu = {});

// ---- Rotary embedding, in place, rotate-half pairing (i, i + head_dim/2) ----
// Rows have stride `stride`; the first `heads` heads of head_dim in each row are rotated; row r
// has position pos0 + r % seq; cos/sin are [positions, head_dim/2] fp32. inverse: the transpose.
void rope_apply(bf16* x, int64_t rows, int64_t stride, int64_t heads, int64_t head_dim, int64_t seq, int64_t pos0,
                const float* cos, const float* sin, bool inverse, cudaStream_t stream);

// ---- Token embedding ----
// out[i] = table[tokens[i]], a zero row for a negative id (a token of another vocabulary shard);
// tokens are device int32, already checked against the vocabulary.
void embedding_forward(const int32_t* tokens, const bf16* table, bf16* out, int64_t n, int64_t c,
                       cudaStream_t stream);
// dtable[t] += sum of dout[i] over the positions i holding token t, deterministically: the caller
// groups positions by token (EmbeddingGrouping below, built on the host where the tokens are) and
// passes its device copy; each unique token's rows are summed in position order.
struct EmbeddingGrouping {
  std::vector<int32_t> unique_tokens;  // ascending
  std::vector<int32_t> offsets;        // unique_tokens.size() + 1: positions[offsets[u]..offsets[u+1])
  std::vector<int32_t> positions;      // n positions, grouped by token, ascending within a token
  static EmbeddingGrouping build(const int32_t* tokens, int64_t n);
};
void embedding_backward(const int32_t* unique_tokens, const int32_t* offsets, const int32_t* positions,
                        int64_t num_unique, const bf16* dout, float* dtable, int64_t c, cudaStream_t stream);

// ---- Token routing row ops (mixture of experts; the op set's gather_rows, scatter_add_rows,
// row_dots in kernels/backend.h), bf16 or fp32 ----
// Unlike the kernels above they compute in double and round each result once (through float),
// as the op set's host default (kernels/row_ops.cpp) does, so that they give its bits. rows
// (device int32, checked by the caller) and scale (device doubles, one per listed row, or null
// for 1) come from the host's row lists.
// out[i] = scale[i] * x[rows[i]], out [n, c].
void gather_rows(const bf16* x, const int32_t* rows, const double* scale, bf16* out, int64_t n, int64_t c,
                 cudaStream_t stream);
void gather_rows(const float* x, const int32_t* rows, const double* scale, float* out, int64_t n, int64_t c,
                 cudaStream_t stream);
// out[rows[i]] += scale[i] * y[i], deterministically and without atomics: the caller groups the
// list by destination row on the host (EmbeddingGrouping::build over the rows: dest = its
// unique_tokens, lists = its positions) and each destination element is out's value plus its
// contributions in list order, fused multiply-adds in double, rounded once.
void scatter_add_rows(const int32_t* dest, const int32_t* offsets, const int32_t* lists, int64_t num_dest,
                      const bf16* y, const double* scale, bf16* out, int64_t c, cudaStream_t stream);
void scatter_add_rows(const int32_t* dest, const int32_t* offsets, const int32_t* lists, int64_t num_dest,
                      const float* y, const double* scale, float* out, int64_t c, cudaStream_t stream);
// dots[i] = <a[rows[i]], b[i]> in double (device doubles [n]); a fixed tree per row, so
// deterministic, but not the host's sequential order.
void row_dots(const bf16* a, const int32_t* rows, const bf16* b, double* dots, int64_t n, int64_t c,
              cudaStream_t stream);
void row_dots(const float* a, const int32_t* rows, const float* b, double* dots, int64_t n, int64_t c,
              cudaStream_t stream);

// ---- Bias gradient: out[j] += sum_i dy[i, j] ----
void column_sum_accumulate(const bf16* dy, float* out, int64_t n, int64_t m, cudaStream_t stream);

// ---- Cross-entropy over vocabulary chunks (logits never all in memory) ----
// Per row: running max, running sum of exp(z - max), and the target's logit. ce_init sets them to
// (-inf, 0, 0); each chunk of logits [n, vc] (vocabulary columns c0 .. c0+vc) updates them online;
// a target outside the chunk, or negative (masked), leaves target_logit alone.
void ce_init(float* row_max, float* row_sum, float* target_logit, int64_t n, cudaStream_t stream);
// softcap > 0: the logits soft-capped first (kernels/softcap.h); 0: as they are.
void ce_chunk_forward(const float* logits, const int32_t* targets, int64_t c0, int64_t vc, float softcap,
                      float* row_max, float* row_sum, float* target_logit, int64_t n, cudaStream_t stream);
// Re-bases the running sums to global_max (>= row_max; the max over vocabulary shards):
// row_sum *= exp(row_max - global_max); row_max = global_max.
void ce_merge_max(float* row_max, float* row_sum, const float* global_max, int64_t n, cudaStream_t stream);
// lse[i] = row_max + log(row_sum); *loss_sum (one float, device) = sum over rows with a target >= 0
// of (lse[i] - target_logit[i]) (accumulated in fp64; written, not added; 0 when n == 0).
void ce_finish(const float* row_max, const float* row_sum, const float* target_logit, const int32_t* targets,
               float* lse, float* loss_sum, int64_t n, cudaStream_t stream);
// dlogits = exp(z - lse) - onehot(target), bf16 [n, vc]; rows with a negative target are 0. With
// softcap > 0, z = softcap * tanh(logit / softcap) and dlogits is times 1 - (z / softcap)^2.
// (The 1/valid-tokens scale is applied by the GEMMs that consume it, as alpha.)
void ce_chunk_backward(const float* logits, const float* lse, const int32_t* targets, int64_t c0, int64_t vc,
                       float softcap, bf16* dlogits, int64_t n, cudaStream_t stream);

// ---- out = a + b, element-wise (out may be a or b): activations in bf16, gradient shards in fp32 ----
void add(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream);
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);

// ---- Dropout (the op set's, kernels/dropout_mask.h): y = x * scale where the mask keeps flat
// index i, else 0; y may be x. The mask's bits are the host's. ----
void dropout(const bf16* x, bf16* y, int64_t n, uint64_t seed, uint32_t threshold, float scale, cudaStream_t stream);
void dropout(const float* x, float* y, int64_t n, uint64_t seed, uint32_t threshold, float scale, cudaStream_t stream);

// ---- Casts ----
void cast_f32_to_bf16(const float* src, bf16* dst, int64_t n, cudaStream_t stream);
void cast_bf16_to_f32(const bf16* src, float* dst, int64_t n, cudaStream_t stream);

// ---- Optimizer over flat fp32 buffers (model/param_store.h) ----
// One launch updates every segment ("multi-tensor"); the chunk table lives on the device.
struct AdamWChunk {
  int64_t offset = 0;  // into the flat buffers, in elements
  int64_t numel = 0;
  int32_t decay = 1;   // weight decay applies
  int32_t pad = 0;
};
// The precision-aware optimizer's storage (optim/adamw.h, kernels/adam_state.h): a moment in fp32,
// bf16 (rounded to nearest even on store), or fp16 / E4M3 codes with one scale per chunk; the
// parameters fp32, rounded to bf16 where stored, or read through an fp16 master (each chunk's
// parameters stored in fp16 with the scale of their amax, read back in fp32).
enum class StateStorage : int32_t { F32, BF16, F16, E4M3 };
enum class ParamStorage : int32_t { F32, BF16, F16Master };
struct AdamWParams {
  // Doubles, as optim/adamw.h's AdamWOptions: the float constants of the update are derived from
  // them on the host exactly as the CPU optimizer derives its own.
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;          // after increment: bias correction uses beta^step
  double grad_scale = 1.0;   // gradients are multiplied by float(grad_scale) first (clipping folded in)
  // Each moment is read as fp32, updated in fp32 and stored as its storage says (the parameter's
  // update uses the fp32 value).
  StateStorage exp_avg = StateStorage::F32, exp_avg_sq = StateStorage::F32;
  ParamStorage params = ParamStorage::F32;
  // With an fp16 or E4M3 moment: each chunk's dequantizing factors on the device, state_scales[2k]
  // (exp_avg) and state_scales[2k + 1] (exp_avg_sq), which the step reads and then replaces with
  // those its stores used (from the amax of the chunk's updated moment).
  float* state_scales = nullptr;
};
// Same arithmetic, in the same order, as optim/adamw.cpp:
//   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   p = p * (1 - lr*wd [decayed chunks]) - (lr/bc1) * m / (sqrt(v) * (1/sqrt(bc2)) + eps)
// with bc1 = 1 - b1^step, bc2 = 1 - b2^step computed in double on the host. When params_bf16 is
// not null, the updated weight is also written there as bf16 (the working copy the model reads).
// exp_avg / exp_avg_sq are arrays of the storage the params say. With a scaled state (fp16 / E4M3
// moments, an fp16 master) a first pass takes each chunk's amaxes, a one-thread-per-chunk kernel
// the scales, then the update runs.
// The products are fused exactly where the CPU loop fuses them, so the two agree bit for bit for
// the same options.
void adamw_step(float* params, const float* grads, void* exp_avg, void* exp_avg_sq, bf16* params_bf16,
                const AdamWChunk* chunks, int num_chunks, const AdamWParams& p, cudaStream_t stream);

// Sum of squares of x over the given [offset, offset+numel) ranges (device table, like the
// AdamW chunks: decay ignored), accumulated in fp64; written to *out (one double, device).
void sum_squares(const float* x, const AdamWChunk* ranges, int num_ranges, double* out, cudaStream_t stream);

}  // namespace primus::cuda
