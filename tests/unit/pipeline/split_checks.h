// Checks shared by the layer-split tests (test_partition.cpp, test_balance.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "pipeline/partition.h"

namespace primus::pipeline::test {

// Layers per stage, in stage order.
inline std::vector<int64_t> counts(const std::vector<LayerRange>& split) {
  std::vector<int64_t> c;
  for (auto& r : split) c.push_back(r.num_layers);
  return c;
}

// The ranges are consecutive from layer 0, each holds a layer at least, and they cover
// num_layers exactly.
inline void expect_contiguous(const std::vector<LayerRange>& split, int64_t num_layers) {
  int64_t next = 0;
  for (auto& r : split) {
    EXPECT_EQ(r.first_layer, next);
    EXPECT_GT(r.num_layers, 0);
    next += r.num_layers;
  }
  EXPECT_EQ(next, num_layers);
}

}  // namespace primus::pipeline::test
