// Host memory for tensors: 64-byte aligned blocks from a caching pool. A training step allocates
// the same activation shapes every iteration; handing freed blocks back out by exact size avoids
// the mmap/munmap and page-fault cost that large mallocs pay on every step. Also counts the
// bytes in use and their peak, which the trainer reports.
#pragma once

#include <cstddef>

namespace primus {

struct MemoryStats {
  size_t in_use = 0;  // bytes held by live tensors
  size_t peak = 0;    // high-water mark of in_use since the last reset
  size_t cached = 0;  // bytes freed by tensors and kept for reuse
};

inline constexpr size_t kHostAlignment = 64;  // bytes: every host buffer (the pool, the meta device) starts on it
// A host buffer's size: bytes rounded up to kHostAlignment (0 bytes take one unit).
inline size_t host_rounded(size_t bytes) {
  return bytes == 0 ? kHostAlignment : (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
}
void* host_alloc(size_t bytes);  // bytes rounded up to the alignment; never returns null
// The memory behind host_alloc and the CPU kernels' scratch buffers: kHostAlignment-aligned, and
// from kHugePageBytes on aligned to it and advised as huge-page memory (madvise MADV_HUGEPAGE;
// transparent huge pages are often "madvise" only), so that the kernels' strided walks (a weight
// gradient's transposed operand, attention's row gathers: rows a page or more apart) do not miss
// the TLB on every row. PRIMUS_HUGE_PAGES=0 turns the advice off. Freed with std::free; null when
// out of memory.
inline constexpr size_t kHugePageBytes = size_t(2) << 20;
void* host_block_alloc(size_t bytes);
void host_free(void* ptr, size_t bytes);
MemoryStats host_memory_stats();
void reset_peak_host_memory();
void release_cached_host_memory();

}  // namespace primus
