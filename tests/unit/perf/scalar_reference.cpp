#include "scalar_reference.h"

#include <cmath>

#include "kernels/cpu/fast_math.h"

namespace primus::test {

double scalar_cross_entropy(float* z, const int32_t* targets, int64_t n, int64_t v) {
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    float* zi = z + i * v;
    float mx = zi[0];
    for (int64_t j = 0; j < v; ++j) mx = zi[j] > mx ? zi[j] : mx;
    float sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += cpu::fast_exp(zi[j] - mx);
    const float lse = mx + std::log(sum);
    loss += double(lse) - double(zi[targets[i]]);
    for (int64_t j = 0; j < v; ++j) zi[j] = cpu::fast_exp(zi[j] - lse);
    zi[targets[i]] -= 1.0f;
  }
  return loss / double(n);
}

}  // namespace primus::test
