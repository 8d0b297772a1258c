#include "kernels/cpu/bf16/scratch.h"

#include <cstdlib>
#include <memory>
#include <new>

#include "core/memory.h"

namespace primus::cpu::bf16k {

namespace {
struct Buffer {
  std::unique_ptr<char, decltype(&std::free)> data{nullptr, &std::free};
  size_t bytes = 0;
};
}  // namespace

void* thread_scratch(ScratchSlot slot, size_t bytes) {
  thread_local Buffer buffers[kScratchSlots];
  Buffer& b = buffers[slot];
  if (b.bytes < bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    b.data.reset(static_cast<char*>(host_block_alloc(rounded)));
    if (!b.data) throw std::bad_alloc();
    b.bytes = rounded;
  }
  return b.data.get();
}

}  // namespace primus::cpu::bf16k
