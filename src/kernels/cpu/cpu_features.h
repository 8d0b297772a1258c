// What this CPU can run, found at run time (CPUID, the OS's saved register state, and on Linux the
// permission request for AMX tile data): the binaries are built for x86-64-v3, and the bf16
// backend (kernels/cpu/bf16) runs its AVX-512 code only where this says it may, so that no
// machine meets an illegal instruction.
#pragma once

#include <string>

namespace primus::cpu {

struct CpuFeatures {
  std::string vendor, model;  // "GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+"
  bool avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;  // as CPUID reports them
  bool avx512_bf16 = false;                                                   // vdpbf16ps, vcvtne2ps2bf16
  bool amx_tile = false, amx_bf16 = false;
  bool os_avx512 = false;      // the OS saves the zmm and mask registers (XCR0)
  bool os_amx = false;         // ... and the tile registers
  bool amx_permitted = false;  // Linux granted this process tile data (arch_prctl ARCH_REQ_XCOMP_PERM)
  std::string amx_problem;     // why AMX is not usable, when the CPU has it
  std::string masked;          // features turned off by PRIMUS_CPU_MASK

  bool avx512() const { return avx512f && avx512bw && avx512vl && avx512dq && os_avx512; }
  bool avx512_bf16_usable() const { return avx512() && avx512_bf16; }
  bool amx_usable() const { return amx_tile && amx_bf16 && os_amx && amx_permitted; }
  // "AVX-512 yes, AVX512-BF16 yes, AMX no"
  std::string summary() const;
};

// Detected once per process (the AMX permission is requested then). PRIMUS_CPU_MASK (a comma
// list of avx512, avx512_bf16, amx) makes features count as absent: to run the fallbacks of a
// bigger CPU on purpose (tests, comparisons).
const CpuFeatures& cpu_features();

}  // namespace primus::cpu
