// A checkpoint's meta.json (format version, its own checksum, the file list, the tensor index):
// either accepted or refused with primus::Error.
#include <cstdint>
#include <string>

#include "checkpoint/format.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    primus::checkpoint::parse_meta_json(std::string(reinterpret_cast<const char*>(data), size), "meta.json");
  } catch (const primus::Error& e) {
    primus::fuzz::refused(e);
  }
  return 0;
}
