#include "core/meta_device.h"

#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "core/memory.h"

namespace primus {
namespace {

// Addresses from 2^62 up: non-canonical on x86-64 (and far above any mapping elsewhere), never
// reused, so a dangling or stray access faults instead of reading someone's memory.
constexpr uintptr_t kBase = uintptr_t(1) << 62;

struct MetaDevice {
  std::mutex mu;
  uintptr_t next = 0;
  MemoryStats stats;
  MetaObserver* observer = nullptr;
};

MetaDevice& meta() {
  static MetaDevice* d = new MetaDevice;  // never destroyed: tensors may be freed during static destruction
  return *d;
}

void* meta_alloc(size_t bytes) {
  MetaDevice& d = meta();
  std::lock_guard<std::mutex> lock(d.mu);
  const size_t n = host_rounded(bytes);
  void* p = reinterpret_cast<void*>(kBase + d.next);
  d.next += n;
  d.stats.in_use += n;
  if (d.stats.in_use > d.stats.peak) d.stats.peak = d.stats.in_use;
  return p;
}

void meta_free(void* ptr, size_t bytes) {
  if (!ptr) return;
  MetaDevice& d = meta();
  std::lock_guard<std::mutex> lock(d.mu);
  d.stats.in_use -= host_rounded(bytes);
}

MetaObserver* observer() {
  std::lock_guard<std::mutex> lock(meta().mu);
  return meta().observer;
}

void meta_zero(void*, size_t bytes) {
  if (MetaObserver* o = observer()) o->on_zero(bytes);
}

void meta_copy(void* dst, const void*, size_t bytes, CopyKind kind) {
  if (kind == CopyKind::DeviceToHost) std::memset(dst, 0, bytes);  // a shape-only tensor reads as zeros
  if (MetaObserver* o = observer()) o->on_copy(bytes, 1, bytes, bytes, kind);
}

void meta_copy_2d(void*, size_t dpitch, const void*, size_t spitch, size_t width, size_t rows) {
  if (MetaObserver* o = observer()) o->on_copy(width, rows, dpitch, spitch, CopyKind::DeviceToDevice);
}

MemoryStats meta_stats() {
  std::lock_guard<std::mutex> lock(meta().mu);
  return meta().stats;
}

}  // namespace

void set_meta_observer(MetaObserver* o) {
  MetaDevice& d = meta();
  std::lock_guard<std::mutex> lock(d.mu);
  PRIMUS_CHECK(!o || !d.observer, "the meta device has an observer already (one shape-only walk at a time)");
  d.observer = o;
}

const DeviceHooks& meta_device_hooks() {
  static const DeviceHooks hooks{meta_alloc, meta_free, meta_zero, meta_copy, meta_copy_2d, meta_stats};
  return hooks;
}

bool is_meta_address(const void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  return p >= kBase && p < kBase * 2;
}

MemoryStats meta_memory_stats() { return meta_stats(); }

void reset_peak_meta_memory() {
  MetaDevice& d = meta();
  std::lock_guard<std::mutex> lock(d.mu);
  d.stats.peak = d.stats.in_use;
}

}  // namespace primus
