// Sizes in messages: "3.2 MiB", "12 B".
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace primus {

inline std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace primus
