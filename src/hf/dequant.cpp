#include "hf/dequant.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace primus::hf {

float e4m3_to_float(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 0xF, man = b & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = exp == 0 ? std::ldexp(float(man), -9)  // subnormal: man / 8 * 2^-6
                             : std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

float e2m1_to_float(uint8_t b) {
  static const float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kValues[b & 0x7];
  return (b & 0x8) ? -v : v;
}

std::vector<float> dequant_fp8_blocks(const std::string& fp8, int64_t rows, int64_t cols,
                                      const std::vector<float>& scale_inv, const std::vector<int64_t>& scale_shape,
                                      int64_t block, const std::string& what) {
  const int64_t br = (rows + block - 1) / block, bc = (cols + block - 1) / block;
  if (int64_t(fp8.size()) != rows * cols) fail("{}: {} fp8 bytes for a [{}, {}] weight", what, fp8.size(), rows, cols);
  if (scale_shape != std::vector<int64_t>{br, bc} || int64_t(scale_inv.size()) != br * bc)
    fail("{}: its weight_scale_inv has shape [{}], a [{}, {}] weight in {}x{} blocks needs [{}, {}]", what,
         fmt::join(scale_shape, ", "), rows, cols, block, block, br, bc);
  std::vector<float> out(size_t(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[size_t(i * cols + j)] = e4m3_to_float(uint8_t(fp8[size_t(i * cols + j)])) *
                                  scale_inv[size_t((i / block) * bc + j / block)];
  return out;
}

std::vector<float> dequant_mxfp4(const std::string& blocks, const std::string& scales, int64_t n, int64_t groups,
                                 const std::string& what) {
  if (int64_t(blocks.size()) != n * groups * 16 || int64_t(scales.size()) != n * groups)
    fail("{}: MXFP4 blocks of {} bytes and scales of {} bytes do not make {} rows of {} 32-value blocks", what,
         blocks.size(), scales.size(), n, groups);
  std::vector<float> out(size_t(n * groups * 32));
  for (int64_t r = 0; r < n * groups; ++r) {
    const float scale = std::ldexp(1.0f, int(uint8_t(scales[size_t(r)])) - 127);
    for (int64_t k = 0; k < 16; ++k) {
      const uint8_t b = uint8_t(blocks[size_t(r * 16 + k)]);
      out[size_t(r * 32 + 2 * k)] = e2m1_to_float(b & 0xF) * scale;
      out[size_t(r * 32 + 2 * k + 1)] = e2m1_to_float(b >> 4) * scale;
    }
  }
  return out;
}

}  // namespace primus::hf
