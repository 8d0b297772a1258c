#include "model/generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/rng.h"

namespace primus {

KVCacheDecoder::KVCacheDecoder(const LlamaModel& model, int64_t max_positions)
    : model_(model), state_(model.start_decoding(max_positions)) {}

const std::vector<float>& KVCacheDecoder::step(int32_t token) {
  logits_ = model_.decode(state_, {token});
  return logits_;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& opt, Rng& rng) {
  const int64_t V = int64_t(logits.size());
  if (opt.temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> prob(V);
  double z = 0;
  for (int64_t i = 0; i < V; ++i) z += (prob[i] = std::exp((logits[i] - mx) / opt.temperature));
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
  // Keep the smallest prefix whose mass reaches top_p, then draw within it.
  double kept = 0;
  int64_t n = 0;
  while (n < V && (n == 0 || kept < opt.top_p * z)) kept += prob[order[n++]];
  double u = rng.uniform() * kept;
  for (int64_t i = 0; i < n; ++i) {
    u -= prob[order[i]];
    if (u <= 0) return order[i];
  }
  return order[n - 1];
}

std::vector<int32_t> KVCacheDecoder::generate(const std::vector<int32_t>& prompt, int64_t max_new,
                                              const SamplingOptions& opt, int32_t stop_token,
                                              const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) fail("generation needs a prompt of at least one token");
  if (int64_t(prompt.size()) > state_.capacity - state_.position)
    fail("the prompt has {} tokens; the model takes at most {}", prompt.size(), state_.capacity - state_.position);
  logits_ = model_.decode(state_, prompt);
  const std::vector<float>* logits = &logits_;
  Rng rng(opt.seed);
  std::vector<int32_t> out;
  while (int64_t(out.size()) < max_new) {
    const int32_t next = sample_token(*logits, opt, rng);
    out.push_back(next);
    if (on_token) on_token(next);
    if (next == stop_token || state_.position >= state_.capacity) break;
    logits = &step(next);
  }
  return out;
}

}  // namespace primus
