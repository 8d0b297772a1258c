// Internals shared by the emulator (emulator.cpp) and its CUDA runtime API (runtime_api.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace emu::detail {

// ---- runtime_api.cpp ----
// The device allocation holding [p, p + bytes), or false.
bool find_allocation(const void* p, size_t bytes, const char** base = nullptr, size_t* size = nullptr);
// Whether a fault address lies in the guard page after a device allocation (for messages).
bool in_allocation_guard(const void* p, const char** base, size_t* size);
bool valid_stream(cudaStream_t s);
void set_last_error(cudaError_t e);
// The dynamic shared memory limit cudaFuncSetAttribute gave `kernel` (48 KB by default).
size_t max_dynamic_smem(const void* kernel);
constexpr size_t kDefaultSmemPerBlock = 48 * 1024;
constexpr size_t kMaxSmemPerBlockOptin = 227 * 1024;  // H100: 227 KB opt-in per block
constexpr size_t kSmemPerSm = 228 * 1024;

// ---- emulator.cpp ----
// Reports a kernel bug (or a misuse of the emulation) with the kernel, block, thread and seed, and
// aborts.
[[noreturn]] void fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace emu::detail
