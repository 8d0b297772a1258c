// Autoregressive decoding with a key/value cache (LlamaModel::decode): each new token runs one
// row through every layer, attending to the cached keys and values of all earlier positions, so a
// token costs O(position) attention instead of a forward pass over the whole sequence. It runs on
// the model's backend and precision, like training.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "model/llama.h"

namespace primus {

struct SamplingOptions {
  double temperature = 0.8;  // 0: greedy
  double top_p = 0.95;       // nucleus sampling: smallest set of tokens with this much probability
  uint64_t seed = 0;
};

class KVCacheDecoder {
 public:
  // Reads the weights of `model` (which must outlive the decoder); the cache holds up to
  // max_positions tokens (at most the model's max_position_embeddings).
  KVCacheDecoder(const LlamaModel& model, int64_t max_positions);

  // Feeds one token at the next position; returns the logits for the position after it.
  const std::vector<float>& step(int32_t token);
  int64_t position() const { return state_.position; }

  // Feeds `prompt` (in one pass through the model), then samples up to max_new tokens; stops
  // early at `stop_token` (>= 0) or at the cache's end. on_token is called for each new token.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new, const SamplingOptions& opt,
                                int32_t stop_token, const std::function<void(int32_t)>& on_token = {});

 private:
  const LlamaModel& model_;
  DecodeState state_;
  std::vector<float> logits_;
};

// Picks a token from logits by temperature and top-p (exposed for tests).
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& opt, Rng& rng);

}  // namespace primus
