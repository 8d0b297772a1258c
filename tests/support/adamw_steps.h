// The precision-aware AdamW tests' common scaffolding (tests/unit/optim: test_adamw_bf16.cpp,
// test_adamw_scaled.cpp): an optimizer with low-precision state stepped beside an fp32-state one
// that restarts every step from the low one's stored moments, so that each step's stored values
// can be held to the fp32 update of that same step, and the parameters to the fp32 ones bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "optim/adamw.h"

namespace primus::test {

// The options both files step with (Megatron's betas 0.9 / 0.95, eps 1e-8, weight decay 0.1),
// with the moments' and the master parameters' storage.
inline AdamWOptions adamw_options(DType exp_avg, DType exp_avg_sq, DType params = DType::F32) {
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  o.exp_avg_dtype = exp_avg;
  o.exp_avg_sq_dtype = exp_avg_sq;
  o.main_params_dtype = params;
  return o;
}

// A moment as the optimizer stores it, read back in fp32.
inline std::vector<float> adamw_moment(const AdamW& a, bool second) {
  std::vector<float> out(static_cast<size_t>(a.numel()));
  a.moment(second, 0, a.numel(), out.data());
  return out;
}

// What a step of step_beside_fp32 hands its check.
struct StepBesideFp32 {
  int step;
  const AdamW& fp32;                  // the fp32-state optimizer after the step
  const std::vector<float>& exp_avg;  // the low-precision optimizer's stored moments after it
  const std::vector<float>& exp_avg_sq;
};

// Steps 1 .. steps of `low` over p with gradient(step) and lr, each beside an fp32-state optimizer
// (adamw_options(fp32, fp32)) set to low's stored moments and step count and stepping a copy of p
// with the same gradient; check(step) after each, then the parameters must be equal bit for bit.
inline void step_beside_fp32(AdamW& low, std::vector<float>& p, const std::vector<ParamSegment>& segs, double lr,
                             int steps, const std::function<std::vector<float>(int)>& gradient,
                             const std::function<void(const StepBesideFp32&)>& check) {
  for (int step = 1; step <= steps; ++step) {
    AdamW ref(adamw_options(DType::F32, DType::F32), low.numel());
    const std::vector<float> m0 = adamw_moment(low, false), v0 = adamw_moment(low, true);
    ref.set_state(low.step_count(), m0.data(), v0.data());
    std::vector<float> pr = p;
    const std::vector<float> g = gradient(step);
    low.step(p.data(), g.data(), segs, lr);
    ref.step(pr.data(), g.data(), segs, lr);
    const std::vector<float> m = adamw_moment(low, false), v = adamw_moment(low, true);
    check({step, ref, m, v});
    for (size_t i = 0; i < p.size(); ++i)
      ASSERT_EQ(std::memcmp(&p[i], &pr[i], 4), 0)
          << "param[" << i << "] step " << step << ": " << p[i] << " against " << pr[i];
  }
}

}  // namespace primus::test
