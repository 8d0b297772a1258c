// The bf16 GEMM through oneDNN's matmul primitive (gemm.h). oneDNN picks its kernel from the CPU
// at run time: AMX tiles on CPUs with AMX, AVX512-BF16 dot products otherwise. Primitives are
// compiled once per problem (shape, strides, output type, bias, beta, whether alpha is 1) and
// kept; alpha is a run-time scale so that a changing loss scale does not recompile.
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/dtype.h"
#include "kernels/cpu/bf16/gemm.h"

namespace primus::cpu::bf16k {
namespace {

using dt = dnnl::memory::data_type;
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, float, bool>;

struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, dnnl::matmul> cache;
  std::mutex mutex;
};

OneDnn& onednn() {
  static OneDnn o;
  return o;
}

dnnl::memory::desc matrix(int64_t rows, int64_t cols, int64_t ld, bool transposed, dt type) {
  // The logical [rows, cols] matrix; stored transposed means element (r, c) sits at c * ld + r.
  return dnnl::memory::desc({rows, cols}, type, transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
}

}  // namespace

void gemm_onednn(const GemmArgs& g) {
  if (g.M <= 0 || g.N <= 0) return;
  const bool scaled = g.alpha != 1.0f;
  if (g.bias && scaled) {
    // oneDNN would scale the bias too: the scaled product in fp32, then D = it + beta C + bias,
    // rounded once (the model never asks for this; the contract allows it).
    std::vector<float> prod(size_t(g.M) * size_t(g.N));
    GemmArgs p = g;
    p.beta = 0.0f;
    p.C = nullptr;
    p.D = prod.data();
    p.f32_out = true;
    p.bias = nullptr;
    gemm_onednn(p);
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < g.N; ++j) {
        const int64_t e = i * g.N + j;
        float v = prod[size_t(e)] + bf16{g.bias[j]}.to_float();
        if (g.beta != 0.0f)
          v += g.beta * (g.f32_out ? static_cast<const float*>(g.C)[e] : bf16{static_cast<const uint16_t*>(g.C)[e]}.to_float());
        if (g.f32_out)
          static_cast<float*>(g.D)[e] = v;
        else
          static_cast<uint16_t*>(g.D)[e] = bf16::from_float(v).bits;
      }
    return;
  }
  OneDnn& o = onednn();
  const dt out = g.f32_out ? dt::f32 : dt::bf16;
  const Key key{g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, g.f32_out, g.bias != nullptr, g.beta, scaled};
  dnnl::matmul prim;
  {
    std::lock_guard<std::mutex> lock(o.mutex);
    auto it = o.cache.find(key);
    if (it == o.cache.end()) {
      dnnl::primitive_attr attr;
      if (scaled) attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
      if (g.beta != 0.0f) {
        dnnl::post_ops po;
        po.append_sum(g.beta);
        attr.set_post_ops(po);
      }
      const auto a = matrix(g.M, g.K, g.lda, g.trans_a, dt::bf16), b = matrix(g.K, g.N, g.ldb, g.trans_b, dt::bf16);
      const auto d = matrix(g.M, g.N, g.N, false, out);
      const auto desc = g.bias
                            ? dnnl::matmul::desc(a, b, dnnl::memory::desc({1, g.N}, dt::bf16, {g.N, 1}), d)
                            : dnnl::matmul::desc(a, b, d);
      it = o.cache.emplace(key, dnnl::matmul(dnnl::matmul::primitive_desc(desc, attr, o.engine))).first;
    }
    prim = it->second;
  }
  const size_t out_size = g.f32_out ? 4 : 2;
  if (g.beta != 0.0f && g.C != g.D)  // the sum post-op adds onto D: start D as a copy of C
    std::memcpy(g.D, g.C, size_t(g.M) * size_t(g.N) * out_size);
  auto mem = [&](const dnnl::memory::desc& d, const void* p) { return dnnl::memory(d, o.engine, const_cast<void*>(p)); };
  float alpha = g.alpha;
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, mem(matrix(g.M, g.K, g.lda, g.trans_a, dt::bf16), g.A)},
      {DNNL_ARG_WEIGHTS, mem(matrix(g.K, g.N, g.ldb, g.trans_b, dt::bf16), g.B)},
      {DNNL_ARG_DST, mem(matrix(g.M, g.N, g.N, false, out), g.D)}};
  if (g.bias) args.emplace(DNNL_ARG_BIAS, mem(dnnl::memory::desc({1, g.N}, dt::bf16, {g.N, 1}), g.bias));
  if (scaled) args.emplace(DNNL_ARG_ATTR_OUTPUT_SCALES, mem(dnnl::memory::desc({1}, dt::f32, {1}), &alpha));
  prim.execute(o.stream, args);
  o.stream.wait();
}

}  // namespace primus::cpu::bf16k
