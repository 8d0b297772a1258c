// A guard against silent de-vectorisation (issue 38): a hot loop of the CPU backend timed against
// the same loop left scalar, in the same process and thread, so that the machine's load cancels.
// GCC 12 once left the softmax loops scalar without a word (4.4 ns per logit against 0.74 once
// vectorised, docs/engine.md); a change of compiler, flags or code that does it again fails here.
// Thread CPU time, one thread, the two timed alternately, best of several rounds each.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <vector>

#include "core/rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "scalar_reference.h"

using namespace primus;

namespace {

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// The cross-entropy row passes (statistics, loss, softmax - onehot in place) on 64 rows of a
// 32000-word vocabulary: the backend's against scalar_cross_entropy. Vectorised for AVX2 (the
// build's floor, x86-64-v3) they run at about a fifth of the scalar loop's time or less (measured:
// see the printed line); scalar they would run at about its time. The bound, half, leaves room for
// a loaded machine and other CPUs.
TEST(Vectorisation, CrossEntropyRowPassesRunFarBelowTheScalarLoop) {
  omp_set_num_threads(1);
  const int64_t n = 64, v = 32000;
  auto& be = cpu::cpu_backend();
  Tensor logits = be.empty({n, v}, DType::F32), z = be.empty({n, v}, DType::F32);
  Tensor targets = Tensor::empty({n}, DType::I32);
  Rng rng(1);
  for (int64_t i = 0; i < n * v; ++i) logits.data<float>()[i] = float(rng.normal()) * 3.0f;
  for (int64_t i = 0; i < n; ++i) targets.data<int32_t>()[i] = int32_t((i * 7919) % v);
  Tensor m = be.empty({n}, DType::F32), s = be.empty({n}, DType::F32), zt = be.empty({n}, DType::F32),
         lse = be.empty({n}, DType::F32);
  std::vector<float> scalar_z(n * v);
  double best_backend = 1e9, best_scalar = 1e9, loss_backend = 0, loss_scalar = 0;
  for (int round = 0; round < 9; ++round) {
    std::copy_n(logits.data<float>(), n * v, z.data<float>());
    double t0 = thread_seconds();
    be.ce_init(m, s, zt);
    be.ce_chunk_forward(z, targets, 0, 0.0, m, s, zt);
    loss_backend = be.ce_finish(m, s, zt, targets, lse) / double(n);
    be.ce_chunk_backward(z, lse, targets, 0, 0.0, z);
    const double t_backend = thread_seconds() - t0;

    std::copy_n(logits.data<float>(), n * v, scalar_z.data());
    t0 = thread_seconds();
    loss_scalar = test::scalar_cross_entropy(scalar_z.data(), targets.data<int32_t>(), n, v);
    const double t_scalar = thread_seconds() - t0;
    if (round > 0) best_backend = std::min(best_backend, t_backend), best_scalar = std::min(best_scalar, t_scalar);
  }
  // The same passes: the same loss and gradient.
  EXPECT_NEAR(loss_backend, loss_scalar, 1e-4 * std::fabs(loss_scalar));
  double max_diff = 0;
  for (int64_t i = 0; i < n * v; ++i)
    max_diff = std::max(max_diff, double(std::fabs(z.data<float>()[i] - scalar_z[i])));
  EXPECT_LT(max_diff, 1e-4);
  const double ns_backend = best_backend / double(n * v) * 1e9, ns_scalar = best_scalar / double(n * v) * 1e9;
  std::printf("cross-entropy row passes: backend %.3f ns per logit, scalar loop %.3f ns per logit (ratio %.2f)\n",
              ns_backend, ns_scalar, ns_backend / ns_scalar);
  EXPECT_LT(ns_backend, 0.5 * ns_scalar) << "the backend's cross-entropy loops run at the speed of scalar code: "
                                            "has the compiler stopped vectorising them?";
}

}  // namespace
