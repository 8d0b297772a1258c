// Device memory hooks. core knows nothing of CUDA: a GPU backend registers how to allocate, zero
// and copy its memory, and Tensor uses those hooks for storage on that device. Without a
// registered backend, asking for device storage is an error that says so. The shape-only device
// (Device::Meta) has its hooks built in (core/meta_device.h).
#pragma once

#include <cstddef>

#include "core/dtype.h"
#include "core/memory.h"

namespace primus {

enum class CopyKind : unsigned char { HostToDevice, DeviceToHost, DeviceToDevice };

struct DeviceHooks {
  void* (*alloc)(size_t bytes) = nullptr;  // never returns null: throws primus::Error when out of memory
  void (*free)(void* ptr, size_t bytes) = nullptr;
  void (*zero)(void* ptr, size_t bytes) = nullptr;
  // Ordered after all work the backend queued before it; returns when dst can be read (host) or
  // used by later device work.
  void (*copy)(void* dst, const void* src, size_t bytes, CopyKind kind) = nullptr;
  // Device to device, `rows` rows of `width` bytes, each `dpitch` / `spitch` bytes apart; ordered
  // like copy.
  void (*copy_2d)(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) = nullptr;
  MemoryStats (*stats)() = nullptr;
};

void register_device_hooks(Device device, const DeviceHooks& hooks);
// The hooks of `device` (CUDA: registered by its backend, Meta: built in); throws primus::Error
// when no backend registered them.
const DeviceHooks& device_hooks(Device device);
bool device_registered(Device device);

// Byte copies and zeroing within `device`'s memory: memcpy / memset on the host, the hooks on a
// device (ordered after the backend's queued work).
void device_copy(Device device, void* dst, const void* src, size_t bytes);
void device_zero(Device device, void* dst, size_t bytes);
// A strided copy within `device`'s memory: rows of `width` bytes, `dpitch` and `spitch` bytes
// apart on each side (a column block of a row-major matrix, a row of padded slots).
void device_copy_2d(Device device, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t rows);

}  // namespace primus
