#include "projection/op_timing.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "core/device.h"
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

double MeasuredOps::seconds(const ops::OpCall& op) {
  const std::string k = op.key();
  auto it = cache_.find(k);
  if (it != cache_.end()) return it->second;
  if (sync_) sync_();
  const double s = run(op);
  cache_[k] = s;
  return s;
}

std::string MeasuredOps::describe() const { return fmt::format("ops measured on this machine's {} backend", be_.name()); }

// Runs the call on the backend with operands of its shapes and dtypes (kernels/op_call.h's
// dimensions), filled with small values.
double MeasuredOps::run(const ops::OpCall& o) {
  ops::Backend& be = be_;
  const std::string op = o.op;
  const DType dt = o.dtype, stat = ops::stat_dtype(dt);
  if (op == "gemm") {
    const int64_t m = o.a, n = o.b, k = o.c;
    Tensor A = filled(be, o.trans_a ? Shape{k, m} : Shape{m, k}, dt);
    Tensor B = filled(be, o.trans_b ? Shape{n, k} : Shape{k, n}, dt, 0.05f);
    Tensor D = filled(be, {m, n}, o.out, 0.0f);
    Tensor bias = o.bias ? filled(be, {n}, dt, 0.01f) : Tensor();
    return time_it(be, [&] {
      be.gemm(o.trans_a, o.trans_b, 1.0f, A, B, o.accumulate ? 1.0f : 0.0f, o.accumulate ? D : Tensor(), D, bias);
    });
  }
  if (op == "grouped_gemm") {
    std::vector<Tensor> A, B, D;
    for (const auto& [m, n, k] : o.problems) {
      A.push_back(filled(be, o.trans_a ? Shape{k, m} : Shape{m, k}, dt));
      B.push_back(filled(be, o.trans_b ? Shape{n, k} : Shape{k, n}, dt, 0.05f));
      D.push_back(filled(be, {m, n}, o.out, 0.0f));
    }
    return time_it(be, [&] { be.grouped_gemm(o.trans_a, o.trans_b, 1.0f, A, B, o.accumulate ? 1.0f : 0.0f, D); });
  }
  const int64_t r = o.a, c = o.b;
  if (op == "rmsnorm_forward") {
    Tensor x = filled(be, {r, c}, dt), w = filled(be, {c}, dt), y = be.empty({r, c}, dt), rstd = be.empty({r}, stat);
    return time_it(be, [&] { be.rmsnorm_forward(x, w, y, rstd, 1e-5f); });
  }
  if (op == "rmsnorm_backward_input") {
    Tensor x = filled(be, {r, c}, dt), w = filled(be, {c}, dt), dy = filled(be, {r, c}, dt),
           res = o.accumulate ? filled(be, {r, c}, dt) : Tensor(), rstd = filled(be, {r}, stat),
           dx = be.empty({r, c}, dt);
    return time_it(be, [&] { be.rmsnorm_backward_input(dy, x, w, rstd, res, dx); });
  }
  if (op == "rmsnorm_backward_weight") {
    Tensor x = filled(be, {r, c}, dt), dy = filled(be, {r, c}, dt), rstd = filled(be, {r}, stat),
           dw = filled(be, {c}, stat, 0.0f);
    return time_it(be, [&] { be.rmsnorm_backward_weight(dy, x, rstd, dw); });
  }
  if (op == "swiglu_forward") {
    Tensor gu = filled(be, {r, 2 * c}, dt), a = be.empty({r, c}, dt);
    return time_it(be, [&] { be.swiglu_forward(gu, a); });
  }
  if (op == "swiglu_backward") {
    Tensor gu = filled(be, {r, 2 * c}, dt), da = filled(be, {r, c}, dt), dgu = be.empty({r, 2 * c}, dt);
    return time_it(be, [&] { be.swiglu_backward(da, gu, dgu); });
  }
  if (op == "rope_apply") {
    const int64_t P = std::max<int64_t>(o.e, 1), half = o.d / 2;
    Tensor x = filled(be, {r, c}, dt), cs = filled(be, {P, half}, stat), sn = filled(be, {P, half}, stat);
    return time_it(be, [&] { be.rope_apply(x, o.c, o.d, P, 0, cs, sn, o.inverse); });
  }
  if (op == "attention_forward" || op == "attention_backward" || op == "attention_sink_backward") {
    ops::AttentionShape s{o.a, o.b, o.c, o.d, o.e};
    s.window = o.window;
    const int64_t N = s.batch * s.seq;
    Tensor qkv = filled(be, {N, s.qkv_stride()}, dt), out = filled(be, {N, s.heads * s.head_dim}, dt),
           lse = be.empty({s.batch, s.heads, s.seq}, stat);
    be.attention_forward(qkv, out, lse, s);
    if (op == "attention_forward") return time_it(be, [&] { be.attention_forward(qkv, out, lse, s); });
    if (op == "attention_sink_backward") {
      s.sinks = filled(be, {s.heads}, stat);
      Tensor dout = filled(be, {N, s.heads * s.head_dim}, dt), dsinks = filled(be, {s.heads}, stat, 0.0f);
      return time_it(be, [&] { be.attention_sink_backward(out, lse, dout, dsinks, s); });
    }
    Tensor dout = filled(be, {N, s.heads * s.head_dim}, dt), dqkv = be.empty({N, s.qkv_stride()}, dt);
    return time_it(be, [&] { be.attention_backward(qkv, out, lse, dout, dqkv, s); });
  }
  if (op == "attention_block_forward" || op == "attention_block_backward" || op == "attention_merge") {
    // A ring-attention block: query chunk and key chunk of [batch, seq] rows each.
    const ops::AttentionShape s{o.a, o.b, o.c, o.d, o.e};
    const int64_t N = s.batch * s.seq, HD = s.heads * s.head_dim, KV = 2 * s.groups * s.head_dim;
    Tensor qkv = filled(be, {N, s.qkv_stride()}, dt), kv = filled(be, {N, KV}, dt), out = filled(be, {N, HD}, dt),
           lse = be.empty({s.batch, s.heads, s.seq}, stat);
    be.attention_block_forward(qkv, kv, out, lse, s, o.causal);
    if (op == "attention_block_forward")
      return time_it(be, [&] { be.attention_block_forward(qkv, kv, out, lse, s, o.causal); });
    if (op == "attention_merge") {
      Tensor acc = filled(be, {N, HD}, stat), acc_lse = filled(be, {s.batch, s.heads, s.seq}, stat);
      return time_it(be, [&] { be.attention_merge(acc, acc_lse, out, lse, s); });
    }
    Tensor dout = filled(be, {N, HD}, dt), dq = filled(be, {N, HD}, stat, 0.0f), dkv = filled(be, {N, KV}, stat, 0.0f);
    return time_it(be, [&] { be.attention_block_backward(qkv, kv, out, lse, dout, dq, dkv, s, o.causal); });
  }
  if (op == "copy" || op == "zero") {
    // Bytes: a copy of r rows of c bytes (pitches o.c and o.d), zeroing of r bytes.
    const int64_t dpitch = std::max(o.c, c), spitch = std::max(o.d, c);
    const int64_t words = op == "zero" ? (r + 3) / 4 : (std::max(dpitch, spitch) * r + 3) / 4;
    Tensor dst = filled(be, {std::max<int64_t>(words, 1)}, DType::F32),
           src = filled(be, {std::max<int64_t>(words, 1)}, DType::F32);
    if (op == "zero") return time_it(be, [&] { device_zero(be.device(), dst.raw(), size_t(r)); });
    return time_it(be, [&] {
      device_copy_2d(be.device(), dst.raw(), size_t(dpitch), src.raw(), size_t(spitch), size_t(c), size_t(r));
    });
  }
  if (op == "gather_rows" || op == "scatter_add_rows" || op == "row_dots") {
    // The MoE block's routing row ops: r rows of width c, each from (or to, or against) one of
    // the o.c rows of the other side, spread evenly as balanced routing spreads them.
    const int64_t src_rows = std::max<int64_t>(o.c, 1);
    std::vector<int32_t> rows(static_cast<size_t>(r));
    for (int64_t i = 0; i < r; ++i) rows[size_t(i)] = int32_t(i % src_rows);
    const std::vector<double> scale(size_t(r), 0.5);
    Tensor many = filled(be, {r, c}, dt), few = filled(be, {src_rows, c}, dt);
    if (op == "gather_rows") return time_it(be, [&] { be.gather_rows(few, rows, scale, many); });
    if (op == "scatter_add_rows") return time_it(be, [&] { be.scatter_add_rows(many, rows, scale, few); });
    volatile double sink = 0;
    return time_it(be, [&] { sink = sink + be.row_dots(few, rows, many)[0]; });
  }
  if (op == "embedding_forward") {
    Tensor t = tokens(be, r, o.c), table = filled(be, {o.c, c}, dt), out = be.empty({r, c}, dt);
    return time_it(be, [&] { be.embedding_forward(t, table, out); });
  }
  if (op == "embedding_backward") {
    std::vector<int32_t> t(static_cast<size_t>(r));
    for (int64_t i = 0; i < r; ++i) t[size_t(i)] = int32_t((i * 7919) % std::max<int64_t>(o.c, 1));
    Tensor dout = filled(be, {r, c}, dt), table = filled(be, {o.c, c}, o.out, 0.0f);
    return time_it(be, [&] { be.embedding_backward(t, dout, table); });
  }
  if (op == "column_sum_accumulate") {
    Tensor dy = filled(be, {r, c}, dt), out = filled(be, {c}, o.out, 0.0f);
    return time_it(be, [&] { be.column_sum_accumulate(dy, out); });
  }
  if (op == "add") {
    Tensor a = filled(be, {r, c}, dt), b = filled(be, {r, c}, dt), out = be.empty({r, c}, dt);
    return time_it(be, [&] { be.add(a, b, out); });
  }
  if (op == "dropout") {
    Tensor x = filled(be, {r, c}, dt), y = be.empty({r, c}, dt);
    return time_it(be, [&] { be.dropout(x, y, 0.05, 1); });
  }
  if (op == "cast") {
    Tensor src = filled(be, {r, c}, dt), dst = be.empty({r, c}, o.out);
    return time_it(be, [&] { be.cast(src, dst); });
  }
  if (op.rfind("ce_", 0) == 0) {  // row statistics in the call's dtype (the stat dtype)
    Tensor m = be.empty({r}, dt), s = be.empty({r}, dt), zt = be.empty({r}, dt), lse = filled(be, {r}, dt);
    Tensor tg = tokens(be, r, std::max<int64_t>(c, 1));
    be.ce_init(m, s, zt);
    if (op == "ce_init") return time_it(be, [&] { be.ce_init(m, s, zt); });
    if (op == "ce_finish") return time_it(be, [&] { be.ce_finish(m, s, zt, tg, lse); });
    if (op == "ce_merge_max") {
      Tensor g = filled(be, {r}, dt);
      return time_it(be, [&] { be.ce_merge_max(m, s, g); });
    }
    Tensor logits = filled(be, {r, c}, dt);
    if (op == "ce_chunk_forward") return time_it(be, [&] { be.ce_chunk_forward(logits, tg, 0, 0.0, m, s, zt); });
    Tensor d = be.empty({r, c}, o.out);
    if (op == "ce_chunk_backward") return time_it(be, [&] { be.ce_chunk_backward(logits, lse, tg, 0, 0.0, d); });
    if (op == "ce_forward_backward") return time_it(be, [&] { be.ce_forward_backward(logits, tg, 0, 0.0, lse, d); });
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

double RooflineOps::seconds(const ops::OpCall& o) {
  const std::string op = o.op;
  const bool attn = op.rfind("attention", 0) == 0, gemm = op == "gemm" || op == "grouped_gemm";
  const double matrix_peak = gemm && o.fp8 && hw_.runs_fp8(o.fp8->coarsest()) ? hw_.fp8_tflops : hw_.peak_tflops;
  const double peak = matrix_peak * 1e12 * (gemm ? eff_.gemm : attn ? eff_.attention : 1.0);
  const double compute = (gemm || attn) ? o.flops / peak : 0.0;
  return std::max(compute, memory_seconds(o.bytes)) + eff_.launch_us * 1e-6;
}

std::string RooflineOps::describe() const {
  const std::string fp8 = hw_.fp8_tflops > 0 ? fmt::format(", {:.1f} FP8{}", hw_.fp8_tflops,
                                                            hw_.mx_blocks ? " (MX blocks too)" : "")
                                              : ", FP8 GEMMs at the bf16 peak";
  return fmt::format("roofline of {} ({}: {:.1f} TFLOP/s dense bf16{}, {:.0f} GB/s; GEMM at {:.0f}% of peak, attention "
                     "{:.0f}%, memory {:.0f}% of bandwidth, {:.0f} us per op)",
                     hw_.name, hw_.description, hw_.peak_tflops, fp8, hw_.memory_bandwidth_gbs, 100 * eff_.gemm,
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
