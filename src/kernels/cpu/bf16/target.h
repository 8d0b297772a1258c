// The instruction sets of this folder's AVX-512 code. A file opens its AVX-512 part with
// PRIMUS_AVX512_BF16_BEGIN after all of its includes and closes it with PRIMUS_AVX512_BF16_END: the
// project builds for x86-64-v3 so that its binaries run on AVX2 machines, and the bf16 backend runs
// this code only where cpu_features.h finds the instructions. (gcc 12 warns that the
// self-initialised "undefined" vectors inside its own masked intrinsics may be uninitialised;
// that warning is off in between.)
#pragma once

#if defined(__clang__)
// clang has no `#pragma GCC target`, and its attribute push does not reach OpenMP's outlined
// regions: src/kernels/CMakeLists.txt gives the *_avx512.cpp files the flags instead
// (bf16_isa_isolation then checks that no shared function picked them up).
#define PRIMUS_AVX512_BF16_BEGIN
#define PRIMUS_AVX512_BF16_END
#else
#define PRIMUS_AVX512_BF16_BEGIN                                                                  \
  _Pragma("GCC push_options")                                                                     \
      _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,bmi2\")")           \
          _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define PRIMUS_AVX512_BF16_END _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#endif
