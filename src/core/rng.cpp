#include "core/rng.h"

#include <cmath>

namespace primus {

static double box_muller(uint64_t a, uint64_t b) {
  double u1 = ((a >> 11) + 1) * 0x1.0p-53;  // (0, 1]: log stays finite
  double u2 = (b >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double Rng::normal() {
  uint64_t a = next_u64(), b = next_u64();
  return box_muller(a, b);
}

double Rng::normal_at(uint64_t index) const { return box_muller(at(2 * index), at(2 * index + 1)); }

}  // namespace primus
