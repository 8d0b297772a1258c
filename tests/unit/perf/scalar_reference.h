// The cross-entropy head's row passes of the CPU backend (kernels/cpu/elementwise.cpp,
// ce_chunk_forward and ce_chunk_backward over a whole row: running max, sum of fast_exp(z - max),
// then fast_exp(z - lse) - onehot in place), written as plain loops in a file compiled with
// vectorisation switched off (tests/unit/perf/CMakeLists.txt): what those passes cost when the
// compiler leaves them scalar.
#pragma once

#include <cstdint>

namespace primus::test {

// Returns the mean loss; z becomes softmax - onehot.
double scalar_cross_entropy(float* z, const int32_t* targets, int64_t n, int64_t v);

}  // namespace primus::test
