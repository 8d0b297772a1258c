// Deterministic random numbers. A counter-based generator (SplitMix64 over seed + counter) so
// that a value depends only on (seed, index): weight init is the same whatever the thread count
// or the parallel layout, and the state to checkpoint is two integers.
#pragma once

#include <cstdint>

namespace primus {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t counter = 0) : seed_(seed), counter_(counter) {}
  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }

  uint64_t next_u64() { return at(counter_++); }
  double uniform() { return (next_u64() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal();                                             // N(0, 1), Box-Muller

  // Stateless draws at an index, for parallel fills.
  uint64_t at(uint64_t index) const { return splitmix64(splitmix64(seed_) ^ index); }
  double normal_at(uint64_t index) const;

 private:
  uint64_t seed_, counter_;
};

}  // namespace primus
