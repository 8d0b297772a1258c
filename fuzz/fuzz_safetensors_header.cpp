// A safetensors file as `checkpoint import` opens it (8-byte header length, JSON header, data):
// either every tensor reads back as fp32 or the file is refused with primus::Error.
#include <cstdint>

#include "core/error.h"
#include "fuzz_util.h"
#include "hf/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = primus::fuzz::write_scratch("model.safetensors", data, size);
  try {
    const primus::hf::SafetensorsReader reader(path.string());
    for (const auto& [name, entry] : reader.tensors()) (void)reader.as_f32(name);
  } catch (const primus::Error& e) {
    primus::fuzz::refused(e);
  }
  return 0;
}
