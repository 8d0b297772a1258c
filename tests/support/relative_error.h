// ||a - b|| / ||b|| over whole vectors (L2, in double): how far a result is from its reference,
// for comparisons where single elements may differ by rounding but the whole must not.
#pragma once

#include <cmath>
#include <vector>

namespace primus::test {

inline double relative_l2_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace primus::test
