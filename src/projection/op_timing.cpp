#include "projection/op_timing.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "core/error.h"
#include "optim/flat_adamw.h"

namespace primus::projection {
namespace {

using Clock = std::chrono::steady_clock;

// A tensor of small values on the backend's device (uninitialised memory could hold NaNs or
// denormals, which change a CPU kernel's speed).
Tensor filled(ops::Backend& be, const Shape& shape, DType dtype, float scale = 0.5f) {
  Tensor host = Tensor::empty(shape, DType::F32);
  float* p = host.data<float>();
  const int64_t n = host.numel();
  for (int64_t i = 0; i < n; ++i) p[i] = scale * (float((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
  Tensor dev = be.device() == Device::CPU ? host : host.to(be.device());
  if (dtype == DType::F32) return dev;
  Tensor out = be.empty(shape, dtype);
  be.cast(dev, out);
  return out;
}

Tensor tokens(ops::Backend& be, int64_t n, int64_t vocab) {
  Tensor host = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) host.data<int32_t>()[i] = int32_t((i * 7919) % std::max<int64_t>(vocab, 1));
  return be.device() == Device::CPU ? host : host.to(be.device());
}

// Median seconds of `fn` over a few runs after one warm-up (at least 3 runs and 20 ms).
template <typename Fn>
double time_it(ops::Backend& be, Fn&& fn) {
  fn();
  be.synchronize();
  std::vector<double> t;
  double total = 0;
  while (t.size() < 3 || (total < 0.02 && t.size() < 50)) {
    const auto t0 = Clock::now();
    fn();
    be.synchronize();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    t.push_back(s);
    total += s;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

double MeasuredOps::seconds(const OpSpec& op) {
  const std::string k = op.key();
  auto it = cache_.find(k);
  if (it != cache_.end()) return it->second;
  if (sync_) sync_();
  const double s = run(op);
  cache_[k] = s;
  return s;
}

std::string MeasuredOps::describe() const { return fmt::format("ops measured on this machine's {} backend", be_.name()); }

double MeasuredOps::run(const OpSpec& o) {
  ops::Backend& be = be_;
  const DType act = o.dtype, stat = ops::stat_dtype(act);
  if (o.op == "gemm") {
    const int64_t m = o.a, n = o.b, k = o.c;
    Tensor A = filled(be, o.trans_a ? Shape{k, m} : Shape{m, k}, act);
    Tensor B = filled(be, o.trans_b ? Shape{n, k} : Shape{k, n}, act, 0.05f);
    Tensor D = filled(be, {m, n}, o.out_stat ? stat : act, 0.0f);
    return time_it(be, [&] {
      be.gemm(o.trans_a, o.trans_b, 1.0f, A, B, o.accumulate ? 1.0f : 0.0f, o.accumulate ? D : Tensor(), D, Tensor());
    });
  }
  const int64_t r = o.a, c = o.b;
  if (o.op == "rmsnorm_forward") {
    Tensor x = filled(be, {r, c}, act), w = filled(be, {c}, act), y = be.empty({r, c}, act), rstd = be.empty({r}, stat);
    return time_it(be, [&] { be.rmsnorm_forward(x, w, y, rstd, 1e-5f); });
  }
  if (o.op == "rmsnorm_backward_input") {
    Tensor x = filled(be, {r, c}, act), w = filled(be, {c}, act), dy = filled(be, {r, c}, act),
           res = filled(be, {r, c}, act), rstd = filled(be, {r}, stat), dx = be.empty({r, c}, act);
    return time_it(be, [&] { be.rmsnorm_backward_input(dy, x, w, rstd, res, dx); });
  }
  if (o.op == "rmsnorm_backward_weight") {
    Tensor x = filled(be, {r, c}, act), dy = filled(be, {r, c}, act), rstd = filled(be, {r}, stat),
           dw = filled(be, {c}, stat, 0.0f);
    return time_it(be, [&] { be.rmsnorm_backward_weight(dy, x, rstd, dw); });
  }
  if (o.op == "swiglu_forward") {
    Tensor gu = filled(be, {r, 2 * c}, act), a = be.empty({r, c}, act);
    return time_it(be, [&] { be.swiglu_forward(gu, a); });
  }
  if (o.op == "swiglu_backward") {
    Tensor gu = filled(be, {r, 2 * c}, act), da = filled(be, {r, c}, act), dgu = be.empty({r, 2 * c}, act);
    return time_it(be, [&] { be.swiglu_backward(da, gu, dgu); });
  }
  if (o.op == "rope_apply") {
    const int64_t P = std::max<int64_t>(o.e, 1), half = o.d / 2;
    Tensor x = filled(be, {r, c}, act), cs = filled(be, {P, half}, stat), sn = filled(be, {P, half}, stat);
    return time_it(be, [&] { be.rope_apply(x, o.c, o.d, o.e, 0, cs, sn, o.inverse); });
  }
  if (o.op == "attention_forward" || o.op == "attention_backward") {
    const ops::AttentionShape s{o.a, o.b, o.c, o.d, o.e};
    const int64_t N = s.batch * s.seq;
    Tensor qkv = filled(be, {N, s.qkv_stride()}, act), out = filled(be, {N, s.heads * s.head_dim}, act),
           lse = be.empty({s.batch, s.heads, s.seq}, stat);
    be.attention_forward(qkv, out, lse, s);
    if (o.op == "attention_forward") return time_it(be, [&] { be.attention_forward(qkv, out, lse, s); });
    Tensor dout = filled(be, {N, s.heads * s.head_dim}, act), dqkv = be.empty({N, s.qkv_stride()}, act);
    return time_it(be, [&] { be.attention_backward(qkv, out, lse, dout, dqkv, s); });
  }
  if (o.op == "attention_block_forward" || o.op == "attention_block_backward" || o.op == "attention_merge") {
    // A ring-attention block: query chunk and key chunk of [batch, seq] rows each.
    const ops::AttentionShape s{o.a, o.b, o.c, o.d, o.e};
    const int64_t N = s.batch * s.seq, HD = s.heads * s.head_dim, KV = 2 * s.groups * s.head_dim;
    Tensor qkv = filled(be, {N, s.qkv_stride()}, act), kv = filled(be, {N, KV}, act), out = filled(be, {N, HD}, act),
           lse = be.empty({s.batch, s.heads, s.seq}, stat);
    be.attention_block_forward(qkv, kv, out, lse, s, o.causal);
    if (o.op == "attention_block_forward")
      return time_it(be, [&] { be.attention_block_forward(qkv, kv, out, lse, s, o.causal); });
    if (o.op == "attention_merge") {
      Tensor acc = filled(be, {N, HD}, stat), acc_lse = filled(be, {s.batch, s.heads, s.seq}, stat);
      return time_it(be, [&] { be.attention_merge(acc, acc_lse, out, lse, s); });
    }
    Tensor dout = filled(be, {N, HD}, act), dq = filled(be, {N, HD}, stat, 0.0f), dkv = filled(be, {N, KV}, stat, 0.0f);
    return time_it(be, [&] { be.attention_block_backward(qkv, kv, out, lse, dout, dq, dkv, s, o.causal); });
  }
  if (o.op == "copy") {
    Tensor src = filled(be, {r, c}, act), dst = be.empty({r, c}, act);
    return time_it(be, [&] { dst.copy_from(src); });
  }
  if (o.op == "gather_rows" || o.op == "scatter_add_rows" || o.op == "row_dots") {
    // The MoE block's routing row ops: r rows of width c, each from (or to, or against) one of
    // the o.c source rows, spread evenly as balanced routing spreads them.
    const int64_t src_rows = std::max<int64_t>(o.c, 1);
    std::vector<int32_t> rows(static_cast<size_t>(r));
    for (int64_t i = 0; i < r; ++i) rows[size_t(i)] = int32_t(i % src_rows);
    const std::vector<double> scale(size_t(r), 0.5);
    Tensor many = filled(be, {r, c}, act), few = filled(be, {src_rows, c}, act);
    if (o.op == "gather_rows") return time_it(be, [&] { be.gather_rows(few, rows, scale, many); });
    if (o.op == "scatter_add_rows") return time_it(be, [&] { be.scatter_add_rows(many, rows, scale, few); });
    volatile double sink = 0;
    return time_it(be, [&] { sink = sink + be.row_dots(few, rows, many)[0]; });
  }
  if (o.op == "embedding_forward") {
    Tensor t = tokens(be, r, o.c), table = filled(be, {o.c, c}, act), out = be.empty({r, c}, act);
    return time_it(be, [&] { be.embedding_forward(t, table, out); });
  }
  if (o.op == "embedding_backward") {
    std::vector<int32_t> t(static_cast<size_t>(r));
    for (int64_t i = 0; i < r; ++i) t[size_t(i)] = int32_t((i * 7919) % std::max<int64_t>(o.c, 1));
    Tensor dout = filled(be, {r, c}, act), table = filled(be, {o.c, c}, stat, 0.0f);
    return time_it(be, [&] { be.embedding_backward(t, dout, table); });
  }
  if (o.op == "column_sum_accumulate") {
    Tensor dy = filled(be, {r, c}, act), out = filled(be, {c}, stat, 0.0f);
    return time_it(be, [&] { be.column_sum_accumulate(dy, out); });
  }
  if (o.op == "add") {
    Tensor a = filled(be, {r, c}, act), b = filled(be, {r, c}, act), out = be.empty({r, c}, act);
    return time_it(be, [&] { be.add(a, b, out); });
  }
  if (o.op == "cast") {
    Tensor src = filled(be, {r, c}, stat), dst = be.empty({r, c}, act);
    return time_it(be, [&] { be.cast(src, dst); });
  }
  if (o.op.rfind("ce_", 0) == 0) {
    Tensor m = be.empty({r}, stat), s = be.empty({r}, stat), zt = be.empty({r}, stat), lse = filled(be, {r}, stat);
    Tensor tg = tokens(be, r, std::max<int64_t>(c, 1));
    be.ce_init(m, s, zt);
    if (o.op == "ce_init") return time_it(be, [&] { be.ce_init(m, s, zt); });
    if (o.op == "ce_finish") return time_it(be, [&] { be.ce_finish(m, s, zt, tg, lse); });
    Tensor logits = filled(be, {r, c}, stat);
    if (o.op == "ce_chunk_forward") return time_it(be, [&] { be.ce_chunk_forward(logits, tg, 0, m, s, zt); });
    if (o.op == "ce_chunk_backward") {
      Tensor d = be.empty({r, c}, act);
      return time_it(be, [&] { be.ce_chunk_backward(logits, lse, tg, 0, d); });
    }
  }
  fail("the projection cannot time op {}", o.op);
}

// The per-element costs of the optimizer, norm and zeroing, measured once on 4M elements.
double MeasuredOps::optimizer_seconds(int64_t n, bool working_bf16) {
  const int64_t probe = int64_t(1) << 22;
  if (adam_per_elem_ < 0) {
    if (sync_) sync_();
    FlatAdamW adam(AdamWOptions{}, {{"probe", 0, probe, true}}, probe, be_.device());
    Tensor values = filled(be_, {probe}, DType::F32), grads = filled(be_, {probe}, DType::F32, 1e-3f);
    Tensor working = be_.empty({probe}, DType::BF16);
    const double t = time_it(be_, [&] { adam.step(values, grads, working_bf16 ? &working : nullptr, 1e-4); });
    adam_per_elem_ = t / double(probe);
  }
  return adam_per_elem_ * double(n);
}

double MeasuredOps::grad_norm_seconds(int64_t n) {
  const int64_t probe = int64_t(1) << 22;
  if (norm_per_elem_ < 0) {
    if (sync_) sync_();
    FlatAdamW adam(AdamWOptions{}, {{"probe", 0, probe, true}}, probe, be_.device());
    Tensor grads = filled(be_, {probe}, DType::F32, 1e-3f);
    const std::vector<int> all = {0};
    volatile double sink = 0;
    norm_per_elem_ = time_it(be_, [&] { sink = sink + adam.grad_sq_sum(grads, all); }) / double(probe);
  }
  return norm_per_elem_ * double(n);
}

double MeasuredOps::zero_grad_seconds(int64_t n) {
  const int64_t probe = int64_t(1) << 22;
  if (zero_per_elem_ < 0) {
    if (sync_) sync_();
    Tensor grads = filled(be_, {probe}, DType::F32);
    zero_per_elem_ = time_it(be_, [&] { grads.zero_(); }) / double(probe);
  }
  return zero_per_elem_ * double(n);
}

// ---------------------------------------------------------------------------------------------

double RooflineOps::memory_seconds(double bytes) const {
  return bytes / (hw_.memory_bandwidth_gbs * 1e9 * eff_.memory);
}

double RooflineOps::seconds(const OpSpec& o) {
  const bool attn = o.op.rfind("attention", 0) == 0;
  const double peak = hw_.peak_tflops * 1e12 * (o.op == "gemm" ? eff_.gemm : attn ? eff_.attention : 1.0);
  const double compute = (o.op == "gemm" || attn) ? o.flops / peak : 0.0;
  return std::max(compute, memory_seconds(o.bytes)) + eff_.launch_us * 1e-6;
}

std::string RooflineOps::describe() const {
  return fmt::format("roofline of {} ({}: {:.1f} TFLOP/s dense bf16, {:.0f} GB/s; GEMM at {:.0f}% of peak, attention "
                     "{:.0f}%, memory {:.0f}% of bandwidth, {:.0f} us per op)",
                     hw_.name, hw_.description, hw_.peak_tflops, hw_.memory_bandwidth_gbs, 100 * eff_.gemm,
                     100 * eff_.attention, 100 * eff_.memory, eff_.launch_us);
}

// AdamW reads parameter, gradient and both moments and writes parameter and moments (28 bytes per
// element), plus the bf16 working copy.
double RooflineOps::optimizer_seconds(int64_t n, bool working_bf16) {
  return memory_seconds(double(n) * (28.0 + (working_bf16 ? 2.0 : 0.0))) + eff_.launch_us * 1e-6;
}
double RooflineOps::grad_norm_seconds(int64_t n) { return memory_seconds(4.0 * double(n)) + eff_.launch_us * 1e-6; }
double RooflineOps::zero_grad_seconds(int64_t n) { return memory_seconds(4.0 * double(n)) + eff_.launch_us * 1e-6; }

}  // namespace primus::projection
