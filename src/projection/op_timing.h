// How long a call of an op of the op set takes (kernels/op_call.h, as the shape-only walk records
// it): measured by running it on a backend of this machine (each distinct call once, the median
// of a few runs after a warm-up), or from the roofline of a named machine: max(FLOPs / (peak x
// efficiency), bytes / (bandwidth x efficiency)) plus a launch cost. The efficiencies are
// assumptions, listed in docs/profiling.md.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "kernels/backend.h"
#include "kernels/op_call.h"
#include "trace/hardware.h"

namespace primus::projection {

class OpTimer {
 public:
  virtual ~OpTimer() = default;
  virtual double seconds(const ops::OpCall& op) = 0;
  virtual std::string describe() const = 0;
  // AdamW over n parameters (fp32 master, moments and gradients; a bf16 working copy when
  // `working_bf16`), the gradient norm's sum of squares over n, and zeroing n gradients.
  virtual double optimizer_seconds(int64_t n, bool working_bf16) = 0;
  virtual double grad_norm_seconds(int64_t n) = 0;
  virtual double zero_grad_seconds(int64_t n) = 0;
};

// Measures on `backend` (the CPU backends, or the GPU's).
// `sync`, when given, runs before each measurement: the ranks of a node that measure together
// (projection run with --nproc) keep in step, so each op is timed while the cores are shared as
// they are in training.
class MeasuredOps final : public OpTimer {
 public:
  explicit MeasuredOps(ops::Backend& backend, std::function<void()> sync = {}) : be_(backend), sync_(std::move(sync)) {}
  double seconds(const ops::OpCall& op) override;
  std::string describe() const override;
  double optimizer_seconds(int64_t n, bool working_bf16) override;
  double grad_norm_seconds(int64_t n) override;
  double zero_grad_seconds(int64_t n) override;
  int measured() const { return int(cache_.size()); }

 private:
  double run(const ops::OpCall& op);
  ops::Backend& be_;
  std::function<void()> sync_;
  std::map<std::string, double> cache_;
  double adam_per_elem_ = -1, norm_per_elem_ = -1, zero_per_elem_ = -1;
};

// The roofline of a named machine.
struct RooflineEfficiency {
  double gemm = 0.70;       // of the dense peak
  double attention = 0.50;  // flash attention, of the dense peak
  double memory = 0.80;     // of the memory bandwidth
  double launch_us = 5.0;   // per op
};

class RooflineOps final : public OpTimer {
 public:
  RooflineOps(trace::Hardware hw, RooflineEfficiency eff = {}) : hw_(std::move(hw)), eff_(eff) {}
  double seconds(const ops::OpCall& op) override;
  std::string describe() const override;
  double optimizer_seconds(int64_t n, bool working_bf16) override;
  double grad_norm_seconds(int64_t n) override;
  double zero_grad_seconds(int64_t n) override;
  const RooflineEfficiency& efficiency() const { return eff_; }

 private:
  double memory_seconds(double bytes) const;
  trace::Hardware hw_;
  RooflineEfficiency eff_;
};

}  // namespace primus::projection
