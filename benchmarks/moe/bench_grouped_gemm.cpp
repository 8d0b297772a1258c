// The MoE experts' GEMMs of one layer and one microbatch on the CPU bf16 backend: one gemm() per
// expert (what the model ran before the grouped GEMM) beside one grouped_gemm() call (what it runs
// now), and, for the weight gradients, this project's grouped kernel beside oneDNN's loop. The
// routing is redrawn every round, as training redraws it every microbatch (so a GEMM library that
// compiles a kernel per shape pays for it here as it does there). Rounds interleave the variants;
// medians are reported.
//
//   bench_grouped_gemm --model moe_100M --tokens 512 --rounds 30 [--skew 1]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/rng.h"
#include "kernels/cpu/bf16/bf16_backend.h"
#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/cpu_features.h"
#include "model/model_spec.h"

using namespace primus;
using Clock = std::chrono::steady_clock;

namespace {

Tensor random_bf16(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::BF16);
  const Rng rng(seed);
  bf16* p = t.data<bf16>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16(0.1f * float(2.0 * ((rng.at(uint64_t(i)) >> 11) * 0x1.0p-53) - 1.0));
  return t;
}

// Tokens per expert for tokens * topk choices, expert e drawn with weight 1 / (e + 1)^skew.
std::vector<int64_t> draw_counts(int64_t tokens, int64_t topk, int64_t experts, double skew, uint64_t seed) {
  std::vector<double> cdf(static_cast<size_t>(experts));
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) cdf[size_t(e)] = total += 1.0 / std::pow(double(e + 1), skew);
  std::vector<int64_t> counts(size_t(experts), 0);
  const Rng rng(seed);
  for (int64_t i = 0; i < tokens * topk; ++i) {
    const double u = ((rng.at(uint64_t(i)) >> 11) * 0x1.0p-53) * total;
    ++counts[size_t(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin())];
  }
  return counts;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The MoE experts' GEMMs: a loop of gemm() beside one grouped_gemm() (CPU bf16)"};
  std::string model = "moe_100M";
  int64_t tokens = 512;
  int rounds = 30;
  double skew = 0;
  app.add_option("--model", model, "an MoE preset name or YAML path");
  app.add_option("--tokens", tokens, "tokens of the microbatch (micro batch x sequence)");
  app.add_option("--rounds", rounds, "rounds, each with its own routing");
  app.add_option("--skew", skew, "routing imbalance: expert e is drawn with weight 1/(e+1)^skew (0: uniform)");
  CLI11_PARSE(app, argc, argv);
  std::string why;
  if (!cpu::Bf16Backend::supported(&why)) {
    std::fprintf(stderr, "bench_grouped_gemm: %s\n", why.c_str());
    return 1;
  }
  const ModelSpec spec = load_model_spec(model);
  if (!spec.is_moe()) {
    std::fprintf(stderr, "bench_grouped_gemm: %s has no experts\n", model.c_str());
    return 1;
  }
  const int64_t E = spec.num_experts, C = spec.hidden_size, F = spec.expert_ffn(), k = spec.moe_router_topk;
  const int64_t M = tokens * k;
  cpu::Bf16Backend be;
  // The expert side of one MoE layer: permuted rows and the experts' weights and gradients.
  const Tensor xp = random_bf16({M, C}, 1), act = random_bf16({M, F}, 2), dy = random_bf16({M, C}, 3),
               dgu = random_bf16({M, 2 * F}, 4);
  Tensor gu = Tensor::empty({M, 2 * F}, DType::BF16), yp = Tensor::empty({M, C}, DType::BF16);
  Tensor da = Tensor::empty({M, F}, DType::BF16), dx = Tensor::empty({M, C}, DType::BF16);
  std::vector<Tensor> w1, w2, g1, g2;
  for (int64_t e = 0; e < E; ++e) {
    w1.push_back(random_bf16({2 * F, C}, 10 + uint64_t(e)));
    w2.push_back(random_bf16({C, F}, 100 + uint64_t(e)));
    g1.push_back(Tensor::zeros({2 * F, C}, DType::F32));
    g2.push_back(Tensor::zeros({C, F}, DType::F32));
  }
  struct Form {
    const char* name;
    bool ta, tb;
    float beta;
    // A, B, D of expert e over rows [o, o + n)
    std::function<void(int64_t, int64_t, int64_t, Tensor&, Tensor&, Tensor&)> operands;
  };
  const std::vector<Form> forms = {
      {"fc1 forward   [n,2F] = x W1^T", false, true, 0.0f,
       [&](int64_t e, int64_t o, int64_t n, Tensor& a, Tensor& b, Tensor& d) {
         a = xp.slice(0, o, n), b = w1[size_t(e)], d = gu.slice(0, o, n);
       }},
      {"fc2 forward   [n,C]  = act W2^T", false, true, 0.0f,
       [&](int64_t e, int64_t o, int64_t n, Tensor& a, Tensor& b, Tensor& d) {
         a = act.slice(0, o, n), b = w2[size_t(e)], d = yp.slice(0, o, n);
       }},
      {"fc2 input grad [n,F] = dy W2", false, false, 0.0f,
       [&](int64_t e, int64_t o, int64_t n, Tensor& a, Tensor& b, Tensor& d) {
         a = dy.slice(0, o, n), b = w2[size_t(e)], d = da.slice(0, o, n);
       }},
      {"fc1 input grad [n,C] = dgu W1", false, false, 0.0f,
       [&](int64_t e, int64_t o, int64_t n, Tensor& a, Tensor& b, Tensor& d) {
         a = dgu.slice(0, o, n), b = w1[size_t(e)], d = dx.slice(0, o, n);
       }},
      {"fc2 weight grad [C,F] += dy^T act", true, false, 1.0f,
       [&](int64_t e, int64_t o, int64_t n, Tensor& a, Tensor& b, Tensor& d) {
         a = dy.slice(0, o, n), b = act.slice(0, o, n), d = g2[size_t(e)];
       }},
      {"fc1 weight grad [2F,C] += dgu^T x", true, false, 1.0f,
       [&](int64_t e, int64_t o, int64_t n, Tensor& a, Tensor& b, Tensor& d) {
         a = dgu.slice(0, o, n), b = xp.slice(0, o, n), d = g1[size_t(e)];
       }},
  };
  const char* variants[] = {"loop of gemm()", "grouped_gemm()", "grouped, ours (avx512)", "loop, oneDNN"};
  // seconds[form][variant] per round
  std::vector<std::vector<std::vector<double>>> sec(forms.size(), std::vector<std::vector<double>>(4));
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
    const std::vector<int64_t> counts = draw_counts(tokens, k, E, skew, 1000 + uint64_t(r));
    for (size_t f = 0; f < forms.size(); ++f) {
      const Form& fm = forms[f];
      std::vector<Tensor> A, B, D;
      std::vector<cpu::bf16k::GemmArgs> args;
      int64_t o = 0;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t n = counts[size_t(e)];
        if (n > 0) {
          Tensor a, b, d;
          fm.operands(e, o, n, a, b, d);
          A.push_back(a), B.push_back(b), D.push_back(d);
          cpu::bf16k::GemmArgs g;
          g.trans_a = fm.ta, g.trans_b = fm.tb, g.beta = fm.beta;
          g.M = d.size(0), g.N = d.size(1), g.K = fm.ta ? a.size(0) : a.size(1);
          g.A = reinterpret_cast<const uint16_t*>(a.raw()), g.lda = a.size(1);
          g.B = reinterpret_cast<const uint16_t*>(b.raw()), g.ldb = b.size(1);
          g.C = fm.beta != 0 ? d.raw() : nullptr, g.D = d.raw(), g.f32_out = d.dtype() == DType::F32;
          args.push_back(g);
        }
        o += n;
      }
      const int nv = fm.ta ? 4 : 2;  // the implementation comparison only where they differ
      for (int i = 0; i < nv; ++i) {
        const int v = (i + r) % nv;  // rotate the order every round
        const auto t0 = Clock::now();
        if (v == 0) {
          for (size_t j = 0; j < A.size(); ++j)
            be.gemm(fm.ta, fm.tb, 1.0f, A[j], B[j], fm.beta, fm.beta != 0 ? D[j] : Tensor(), D[j], Tensor());
        } else if (v == 1) {
          be.grouped_gemm(fm.ta, fm.tb, 1.0f, A, B, fm.beta, D);
        } else if (v == 2) {
          cpu::bf16k::gemm_avx512_grouped(args.data(), int64_t(args.size()));
        } else {
          for (const auto& g : args) cpu::bf16k::gemm_onednn(g);
        }
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r > 0) sec[f][size_t(v)].push_back(s);
      }
    }
  }
  std::printf("%s: %lld experts, hidden %lld, expert ffn %lld, top-%lld, %lld tokens (%lld rows), skew %.2f, "
              "%d rounds, %d threads, %s\n",
              spec.name.c_str(), (long long)E, (long long)C, (long long)F, (long long)k, (long long)tokens,
              (long long)M, skew, rounds, omp_get_max_threads(), be.name().c_str());
  std::printf("medians in ms (one MoE layer, one microbatch):\n");
  std::printf("  %-36s %12s %12s %8s %14s %12s\n", "GEMM", variants[0], variants[1], "ratio", variants[2],
              variants[3]);
  double total[4] = {0, 0, 0, 0};
  for (size_t f = 0; f < forms.size(); ++f) {
    double m[4];
    for (int v = 0; v < 4; ++v) m[v] = median(sec[f][size_t(v)]) * 1e3;
    for (int v = 0; v < 2; ++v) total[v] += m[v];
    if (forms[f].ta)
      std::printf("  %-36s %12.3f %12.3f %7.2fx %14.3f %12.3f\n", forms[f].name, m[0], m[1], m[0] / m[1], m[2], m[3]);
    else
      std::printf("  %-36s %12.3f %12.3f %7.2fx\n", forms[f].name, m[0], m[1], m[0] / m[1]);
  }
  // FLOPs of the six GEMMs of one layer: 2 * rows * (2F*C + C*F) * 3 passes
  const double layer_flops = 2.0 * double(M) * (3.0 * double(F) * double(C)) * 3.0;
  std::printf("  %-36s %12.3f %12.3f %7.2fx   (%.1f and %.1f GFLOP/s)\n", "all six", total[0], total[1],
              total[0] / total[1], layer_flops / total[0] / 1e6, layer_flops / total[1] / 1e6);
  return 0;
}
