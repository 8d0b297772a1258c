#include "kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace primus::cpu {

namespace {

uint64_t xgetbv0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

std::string model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "";
}

// Linux keeps AMX tile data off until a process asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); a tile instruction before that faults. Returns "" or why not.
std::string request_amx() {
#ifdef __linux__
  constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0)
    return std::string("the kernel refused tile data (arch_prctl ARCH_REQ_XCOMP_PERM: ") + std::strerror(errno) +
           "; Linux 5.16 or later is needed)";
  unsigned long mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0 || !(mask & (1ul << kXfeatureXtiledata)))
    return "the kernel did not grant tile data";
  return "";
#else
  return "AMX permission is only requested on Linux";
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char v[13] = {};
    std::memcpy(v, &b, 4);
    std::memcpy(v + 4, &d, 4);
    std::memcpy(v + 8, &c, 4);
    f.vendor = v;
  }
  f.model = model_name();
  const unsigned max_leaf = a;
  bool osxsave = false;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    f.fma = c & (1u << 12);
    osxsave = c & (1u << 27);
  }
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  // SSE and AVX state (bits 1-2), then opmask, upper zmm0-15 and zmm16-31 (5-7), tile config
  // and tile data (17-18).
  const bool os_avx = (xcr0 & 0x6) == 0x6;
  f.os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
  f.os_amx = (xcr0 & 0x60000) == 0x60000;
  if (max_leaf >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = os_avx && (b & (1u << 5));
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.amx_bf16 = d & (1u << 22);
    f.amx_tile = d & (1u << 24);
    const unsigned subleaves = a;
    if (subleaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512_bf16 = a & (1u << 5);
  }
  // Features switched off on purpose.
  if (const char* env = std::getenv("PRIMUS_CPU_MASK")) {
    std::stringstream list(env);
    std::string item;
    while (std::getline(list, item, ',')) {
      if (item == "avx512") f.avx512f = false;
      else if (item == "avx512_bf16") f.avx512_bf16 = false;
      else if (item == "amx") f.amx_tile = f.amx_bf16 = false;
      else continue;
      f.masked += (f.masked.empty() ? "" : ",") + item;
    }
  }
  if (f.amx_tile && f.amx_bf16) {
    if (!f.os_amx)
      f.amx_problem = "the OS does not save tile state (XCR0)";
    else if ((f.amx_problem = request_amx()).empty())
      f.amx_permitted = true;
  }
  return f;
}

}  // namespace

std::string CpuFeatures::summary() const {
  auto yn = [](bool v) { return v ? "yes" : "no"; };
  std::string s = std::string("AVX-512 ") + yn(avx512()) + ", AVX512-BF16 " + yn(avx512_bf16_usable()) + ", AMX " +
                  yn(amx_usable());
  if (amx_tile && amx_bf16 && !amx_usable()) s += " (" + amx_problem + ")";
  if (!masked.empty()) s += " [masked by PRIMUS_CPU_MASK: " + masked + "]";
  return s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace primus::cpu
