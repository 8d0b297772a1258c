// The PyTorch peer model (tests/oracles/hf_llama_peer.py, Debian's python3-torch) writing a Hugging
// Face folder of one of our presets: the source of the import tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/generation.h"
#include "model/llama.h"
#include "support/run_command.h"

namespace primus::test {

inline const std::string kHfPeer = std::string(PRIMUS_SOURCE_DIR) + "/tests/oracles/hf_llama_peer.py";

// Writes <out>/config.json and the safetensors file(s) of `model` (a preset name or YAML path).
inline void peer_write(const std::string& out, const std::string& model, const std::string& dtype, uint64_t shard) {
  auto r = run_command(fmt::format("/usr/bin/python3 {} write {} --model {} --dtype {} --max-shard-bytes {} 2>&1",
                                   kHfPeer, out, model, dtype, shard));
  ASSERT_EQ(r.code, 0) << r.out;
}

// A tiny random model of a mixture-of-experts family (hf_moe_peer.py FAMILIES: mixtral, qwen2_moe,
// qwen3_moe, deepseek_v2, deepseek_v2_grouped (group_limited_greedy), deepseek_v3, deepseek_v3_mtp with
// one multi-token-prediction layer, ...)
// in its Hugging Face layout.
inline void peer_write_family(const std::string& out, const std::string& family, const std::string& dtype,
                              uint64_t shard) {
  auto r = run_command(fmt::format("/usr/bin/python3 {} write {} --family {} --dtype {} --max-shard-bytes {} 2>&1",
                                   kHfPeer, out, family, dtype, shard));
  ASSERT_EQ(r.code, 0) << r.out;
}

// The tokens whose logits the tests compare with the peer's.
inline const std::vector<int32_t> kPeerTokens = {1, 17, 200, 3, 3, 255, 42, 0, 99, 128, 7, 64};

// The peer's logits at every position of `tokens` for a Hugging Face folder.
inline std::vector<std::vector<float>> peer_logits(const std::string& dir, const std::vector<int32_t>& tokens) {
  auto r = test::run_command(
      fmt::format("/usr/bin/python3 {} logits {} --tokens '{}' 2>&1", kHfPeer, dir, fmt::join(tokens, " ")));
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) return {};
  return nlohmann::json::parse(r.out).get<std::vector<std::vector<float>>>();
}

// DeepSeek-V3's multi-token-prediction logits of a Hugging Face folder: per depth k, the positions
// with a token k + 1 ahead (hf_moe_peer.py mtp_logits).
inline std::vector<std::vector<std::vector<float>>> peer_mtp_logits(const std::string& dir,
                                                                    const std::vector<int32_t>& tokens) {
  auto r = test::run_command(
      fmt::format("/usr/bin/python3 {} mtp-logits {} --tokens '{}' 2>&1", kHfPeer, dir, fmt::join(tokens, " ")));
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) return {};
  return nlohmann::json::parse(r.out).get<std::vector<std::vector<std::vector<float>>>>();
}

// Our model's logits at every position, from a checkpoint of ours; `edit`, when given, changes its
// model first (a test's counterfactual: the same weights under another rule).
inline std::vector<std::vector<float>> our_logits(const std::string& ckpt, const std::vector<int32_t>& tokens,
                                                  const std::function<void(ModelSpec&)>& edit = {}) {
  const YAML::Node cfg = YAML::Load(checkpoint::read_checkpoint_config(ckpt));
  ModelSpec spec = model_spec_from_yaml(cfg["modules"]["pre_trainer"]["model_spec"], ckpt);
  if (edit) edit(spec);
  LlamaModel model(spec, cpu::cpu_backend(), Precision::Fp32);
  checkpoint::LoadOptions lo;
  lo.optimizer = false;
  auto ck = checkpoint::load_checkpoint(ckpt, model.params(), lo);
  std::copy(ck.params.begin(), ck.params.end(), model.params().values().data<float>());
  KVCacheDecoder dec(model, spec.max_position_embeddings);
  std::vector<std::vector<float>> out;
  for (int32_t t : tokens) out.push_back(dec.step(t));
  return out;
}

inline void expect_close(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    for (size_t k = 0; k < a[i].size(); ++k) {
      worst = std::max(worst, double(std::abs(a[i][k] - b[i][k])));
      scale = std::max(scale, double(std::abs(b[i][k])));
    }
  }
  EXPECT_GT(scale, 0.05);  // logits that say something
  EXPECT_LT(worst, 2e-5 * std::max(1.0, scale))
      << "largest logit difference " << worst << " (largest logit " << scale << ")";
}

}  // namespace primus::test
