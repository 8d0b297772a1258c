// The shape-only device, Device::Meta (docs/architecture.md, "The shape-only backend"). A tensor
// on it has a shape, a dtype and a Storage that holds no bytes. Its address is unique and lies in
// a range no process maps (reading or writing it faults at once), so that pointer identity (which
// weight an op reads, whether it writes in place) means what it means on a real device. The
// device counts the bytes in use and their peak as the host pool counts its blocks (64-byte
// rounding), so that a walk of the model's passes on it holds exactly what the real passes hold.
//
// Copies and zeroing move nothing; an observer (the shape-only backend, kernels/meta) is told of
// each, to count them as ops. A copy to the host writes zeros there: a shape-only tensor reads as
// zeros.
#pragma once

#include <cstddef>

#include "core/device.h"
#include "core/memory.h"

namespace primus {

class MetaObserver {
 public:
  virtual ~MetaObserver() = default;
  // A copy of `rows` rows of `width` bytes, `dpitch` and `spitch` bytes apart on each side (rows 1:
  // one contiguous range).
  virtual void on_copy(size_t width, size_t rows, size_t dpitch, size_t spitch, CopyKind kind) = 0;
  virtual void on_zero(size_t bytes) = 0;
};

// The observer of every meta copy and zeroing (one at a time: setting a second while one is set is
// an error; nullptr removes it).
void set_meta_observer(MetaObserver* observer);

// The hooks core/device.h hands out for Device::Meta.
const DeviceHooks& meta_device_hooks();
bool is_meta_address(const void* ptr);
MemoryStats meta_memory_stats();
void reset_peak_meta_memory();

}  // namespace primus
