#include "core/device.h"

#include <cstring>

#include "core/error.h"
#include "core/meta_device.h"

namespace primus {

namespace {
DeviceHooks g_cuda;
bool g_cuda_set = false;
}  // namespace

void register_device_hooks(Device device, const DeviceHooks& hooks) {
  PRIMUS_CHECK(device == Device::CUDA, "only device memory takes hooks");
  PRIMUS_CHECK(hooks.alloc && hooks.free && hooks.zero && hooks.copy && hooks.copy_2d && hooks.stats,
               "incomplete device hooks");
  g_cuda = hooks;
  g_cuda_set = true;
}

bool device_registered(Device device) { return device != Device::CUDA || g_cuda_set; }

const DeviceHooks& device_hooks(Device device) {
  if (device == Device::Meta) return meta_device_hooks();
  if (device != Device::CUDA || !g_cuda_set)
    fail("{} tensors need the GPU backend, which is not built or not initialised in this process",
         device_name(device));
  return g_cuda;
}

void device_copy(Device device, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (device == Device::CPU)
    std::memcpy(dst, src, bytes);
  else
    device_hooks(device).copy(dst, src, bytes, CopyKind::DeviceToDevice);
}

void device_copy_2d(Device device, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                    size_t rows) {
  if (width == 0 || rows == 0) return;
  if (device != Device::CPU) return device_hooks(device).copy_2d(dst, dpitch, src, spitch, width, rows);
  if (dpitch == width && spitch == width) return std::memcpy(dst, src, width * rows), void();
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
}

void device_zero(Device device, void* dst, size_t bytes) {
  if (bytes == 0) return;
  if (device == Device::CPU)
    std::memset(dst, 0, bytes);
  else
    device_hooks(device).zero(dst, bytes);
}

}  // namespace primus
