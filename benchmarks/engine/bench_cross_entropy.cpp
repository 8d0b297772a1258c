// The cross-entropy head's row passes alone (no GEMM) on the CPU backend, fp32: statistics of
// the stored logits, the loss, then softmax - onehot in place, as LlamaModel::head_forward runs
// them when the logits of a microbatch fit in memory. Best of 7 per shape in thread CPU time (run with OMP_NUM_THREADS=1); the passes stream
// N x V floats, so the GB/s column says how close they run to memory bandwidth. Each shape runs
// plain and soft-capped (Grok 2's final_logit_softcapping 30: a tanh per logit in each pass).
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/cpu_backend.h"

using namespace primus;

// Thread CPU time: the passes run on this thread (OMP_NUM_THREADS=1), and on a shared machine CPU
// time is what stays comparable between runs.
static double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

int main() {
  auto& be = cpu::cpu_backend();
  const int64_t shapes[][2] = {{2048, 32000}, {2048, 4096}, {512, 128256}};
  for (const auto& sh : shapes) {
    const int64_t n = sh[0], v = sh[1];
    Tensor logits = be.empty({n, v}, DType::F32), z = be.empty({n, v}, DType::F32);
    Tensor targets = Tensor::empty({n}, DType::I32);
    Rng rng(1);
    for (int64_t i = 0; i < n * v; ++i) logits.data<float>()[i] = float(rng.normal()) * 3.0f;
    for (int64_t i = 0; i < n; ++i) targets.data<int32_t>()[i] = int32_t((i * 7919) % v);
    Tensor m = be.empty({n}, DType::F32), s = be.empty({n}, DType::F32), zt = be.empty({n}, DType::F32),
           lse = be.empty({n}, DType::F32);
    for (const double cap : {0.0, 30.0}) {
      double best = 1e9, best_fwd = 1e9, loss = 0;
      for (int r = 0; r < 8; ++r) {
        std::copy_n(logits.data<float>(), n * v, z.data<float>());
        const double t0 = cpu_seconds();
        be.ce_init(m, s, zt);
        be.ce_chunk_forward(z, targets, 0, cap, m, s, zt);
        loss = be.ce_finish(m, s, zt, targets, lse) / double(n);
        const double tf = cpu_seconds() - t0;
        be.ce_chunk_backward(z, lse, targets, 0, cap, z);
        const double t = cpu_seconds() - t0;
        if (r > 0) best = std::min(best, t), best_fwd = std::min(best_fwd, tf);
      }
      std::printf("rows %ld vocab %ld softcap %g: %.2f ms (statistics and loss %.2f ms), %.2f ns per logit, loss %.6f\n",
                  n, v, cap, best * 1e3, best_fwd * 1e3, best / double(n * v) * 1e9, loss);
    }
  }
  return 0;
}
