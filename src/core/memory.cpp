#include "core/memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

namespace primus {
namespace {


struct Pool {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  MemoryStats stats;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: tensors may be freed during static destruction
  return *p;
}

}  // namespace

void* host_block_alloc(size_t bytes) {
  static const bool advise = [] {
    const char* env = std::getenv("PRIMUS_HUGE_PAGES");
    return !env || std::string(env) != "0";
  }();
  if (!advise || bytes < kHugePageBytes) return std::aligned_alloc(kHostAlignment, host_rounded(bytes));
  void* ptr = nullptr;
  if (::posix_memalign(&ptr, kHugePageBytes, bytes) != 0) return nullptr;
  ::madvise(ptr, bytes, MADV_HUGEPAGE);  // advice: where the kernel has no huge pages, nothing changes
  return ptr;
}

void* host_alloc(size_t bytes) {
  bytes = host_rounded(bytes);
  Pool& p = pool();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.free_blocks.find(bytes);
    if (it != p.free_blocks.end() && !it->second.empty()) {
      void* ptr = it->second.back();
      it->second.pop_back();
      p.stats.cached -= bytes;
      p.stats.in_use += bytes;
      if (p.stats.in_use > p.stats.peak) p.stats.peak = p.stats.in_use;
      return ptr;
    }
  }
  void* ptr = host_block_alloc(bytes);
  if (!ptr) {
    release_cached_host_memory();  // give the cache back and try once more
    ptr = host_block_alloc(bytes);
    if (!ptr) throw std::bad_alloc();
  }
  std::lock_guard<std::mutex> lock(p.mu);
  p.stats.in_use += bytes;
  if (p.stats.in_use > p.stats.peak) p.stats.peak = p.stats.in_use;
  return ptr;
}

void host_free(void* ptr, size_t bytes) {
  if (!ptr) return;
  bytes = host_rounded(bytes);
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  p.free_blocks[bytes].push_back(ptr);
  p.stats.in_use -= bytes;
  p.stats.cached += bytes;
}

MemoryStats host_memory_stats() {
  std::lock_guard<std::mutex> lock(pool().mu);
  return pool().stats;
}

void reset_peak_host_memory() {
  std::lock_guard<std::mutex> lock(pool().mu);
  pool().stats.peak = pool().stats.in_use;
}

void release_cached_host_memory() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mu);
  for (auto& [size, blocks] : p.free_blocks)
    for (void* b : blocks) std::free(b);
  p.free_blocks.clear();
  p.stats.cached = 0;
}

}  // namespace primus
