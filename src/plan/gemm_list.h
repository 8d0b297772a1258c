// The GEMMs a run's model performs, as `benchmark gemm --shapes-from` lists, tunes and compares
// them: every gemm and grouped_gemm call of one microbatch's F, B and W through every pipeline
// stage, on one tensor-parallel rank, taken from the shape-only walk (plan/model_walk.h) of the
// real model, so that the list is what a profiled step of the config runs (shapes and counts),
// whatever the model's attention, feed-forward, recompute, vocabulary chunks and parallel layout.
//
// Each entry is a problem D[m, n] = op(A) op(B) (+ C) with its dtypes, named by the parameter it
// reads (its B) or whose gradient it writes (its D when A is transposed): "self_attention.
// linear_qkv forward", "mlp.linear_fc2 input grad", "output_layer weight grad". Identical
// problems of the same parameter kind merge into one entry with their count per microbatch. A
// grouped GEMM (the MoE experts') gives one entry per distinct problem, marked grouped, and one
// entry in `grouped` as the profiler records the call: its rows (forward and input gradient) or
// its K (weight gradient) stacked, and its problem count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "kernels/op_call.h"
#include "model/llama.h"
#include "model/model_spec.h"
#include "plan/parallel_layout.h"

namespace primus::plan {

struct GemmEntry {
  std::string what;  // "self_attention.linear_qkv forward", "mlp.experts.linear_fc1 weight grad (grouped)"
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  DType in = DType::F32, out = DType::F32;  // A and B's dtype; C and D's
  // An FP8 GEMM (its operands quantized copies of `in` values): their kinds, as OpCall::fp8; none
  // otherwise.
  std::optional<ops::OpCall::Fp8Operands> fp8;
  bool bias = false;                        // a bias[n] on every row
  bool accumulate = false;                  // C is read (beta = 1): a residual or the running sum
  bool grouped = false;                     // a problem of a grouped GEMM
  int64_t groups = 0;                       // in GemmList::grouped: the problems of the call
  int64_t count = 0;                        // runs per microbatch
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(count); }
};

// With fp8: "E4M3 tensor x E4M3 tensor", A's then B's format and scaling; "" otherwise.
std::string fp8_operands_name(const GemmEntry& g);
// How `benchmark gemm` and `bench_engine --profile` name a problem: its form "NT" (op(A) op(B)),
// its types "bf16>bf16" (an FP8 GEMM: "fp8>bf16"), its extras "+bias+C", and all of it in one
// label, "NT 2048x2304x768 bf16>bf16 +C".
std::string op_name(bool trans_a, bool trans_b);
std::string types_name(const GemmEntry& g);
std::string extras_name(const GemmEntry& g);
std::string gemm_label(const GemmEntry& g);

struct GemmList {
  std::string model;
  int64_t micro_batch = 0, seq = 0, rows = 0;  // rows: this rank's tokens of a microbatch
  int64_t microbatches = 1;                    // per step on a data-parallel rank
  bool recompute = false;                      // recompute_granularity full
  Precision precision = Precision::Fp32;
  std::vector<GemmEntry> gemms;    // in the order the step first runs them
  std::vector<GemmEntry> grouped;  // the grouped calls as the profiler records them
};

// `options` replaces the trainer's LlamaOptions (plan/model_options.h: recompute, FP8), e.g. with
// the head's vocabulary chunking; the layout's tp, sp, cp, ep and etp and the config's micro
// batch, sequence and precision apply.
GemmList model_gemms(const ModelSpec& spec, const ParallelLayout& layout, const config::TrainingArgs& args,
                     const LlamaOptions* options = nullptr);

}  // namespace primus::plan
