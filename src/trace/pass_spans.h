// PassSpans: a pipeline StageRunner that opens an F, B or W span around each pass of the runner
// it wraps (microbatch and chunk in the span), so that the ops inside are attributed to their
// pass and `analyze trace` can measure the bubble. With a null or inactive profiler it only
// forwards.
#pragma once

#include "pipeline/executor.h"
#include "trace/profiler.h"

namespace primus::trace {

class PassSpans final : public pipeline::StageRunner {
 public:
  PassSpans(pipeline::StageRunner& inner, Profiler* profiler) : r_(inner), p_(profiler) {}
  Shape message_shape() const override { return r_.message_shape(); }
  DType message_dtype() const override { return r_.message_dtype(); }
  Tensor forward(int microbatch, int chunk, const Tensor& input) override {
    PassSpan s(p_, Pass::F, microbatch, chunk);
    return r_.forward(microbatch, chunk, input);
  }
  Tensor backward_input(int microbatch, int chunk, const Tensor& grad_output) override {
    PassSpan s(p_, Pass::B, microbatch, chunk);
    return r_.backward_input(microbatch, chunk, grad_output);
  }
  void backward_weight(int microbatch, int chunk) override {
    PassSpan s(p_, Pass::W, microbatch, chunk);
    r_.backward_weight(microbatch, chunk);
  }
  // The default runs the three passes above one after the other, each in its span.

 private:
  pipeline::StageRunner& r_;
  Profiler* p_;
};

}  // namespace primus::trace
