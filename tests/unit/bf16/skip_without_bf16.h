// Skips a test, with the reason, on a CPU that cannot run the CPU bf16 backend.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kernels/cpu/bf16/bf16_backend.h"

#define SKIP_WITHOUT_BF16()                                                       \
  do {                                                                            \
    std::string why;                                                              \
    if (!primus::cpu::Bf16Backend::supported(&why)) {                             \
      GTEST_SKIP() << "CPU bf16 backend not runnable: " << why;                   \
    }                                                                             \
  } while (0)
