// The PyTorch peer model (tests/oracles/hf_llama_peer.py, Debian's python3-torch) writing a Hugging
// Face folder of one of our presets: the source of the import tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "support/run_command.h"

namespace primus::test {

inline const std::string kHfPeer = std::string(PRIMUS_SOURCE_DIR) + "/tests/oracles/hf_llama_peer.py";

// Writes <out>/config.json and the safetensors file(s) of `model` (a preset name or YAML path).
inline void peer_write(const std::string& out, const std::string& model, const std::string& dtype, uint64_t shard) {
  auto r = run_command(fmt::format("/usr/bin/python3 {} write {} --model {} --dtype {} --max-shard-bytes {} 2>&1",
                                   kHfPeer, out, model, dtype, shard));
  ASSERT_EQ(r.code, 0) << r.out;
}

}  // namespace primus::test
