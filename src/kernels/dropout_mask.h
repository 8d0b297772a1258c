// Dropout's mask, defined once for every backend (the op set's dropout, kernels/backend.h): element
// i of a tensor is kept when a 32-bit hash of (seed, i) is at least p 2^32, and a kept element is
// scaled by 1 / (1 - p) (torch.nn.Dropout's rule). The mask is a pure function of the seed and the
// element's flat index: the backward redraws its forward's mask instead of saving it, a resumed run
// draws the masks it would have drawn, and the CPU and the GPU draw the same bits. Host and device
// code (the CUDA kernel includes it; PRIMUS_HD marks the functions both sides call).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define PRIMUS_HD __host__ __device__
#else
#define PRIMUS_HD
#endif

namespace primus::ops {

// SplitMix64's finaliser over the seed and the index (core/rng.h's mixer, restated for the device).
PRIMUS_HD inline uint32_t dropout_hash(uint64_t seed, uint64_t index) {
  uint64_t x = seed ^ (index * 0x9e3779b97f4a7c15ull);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return uint32_t((x ^ (x >> 31)) >> 32);
}

struct DropoutMask {
  uint64_t seed = 0;
  uint32_t threshold = 0;  // floor(p 2^32): an element is dropped when its hash is below it
  double scale = 1.0;      // 1 / (1 - p)
  // p in [0, 1) (the config checks it).
  DropoutMask(double p, uint64_t s)
      : seed(s), threshold(uint32_t(std::floor(p * 4294967296.0))), scale(1.0 / (1.0 - p)) {}
  PRIMUS_HD bool keeps(uint64_t index) const { return dropout_hash(seed, index) >= threshold; }
};

}  // namespace primus::ops
