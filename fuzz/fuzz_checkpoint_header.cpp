// A checkpoint shard file's prefix and JSON header (what a reader parses before any data): either
// accepted or refused with primus::Error.
#include <cstdint>
#include <string>

#include "checkpoint/format.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    primus::checkpoint::parse_shard_header(std::string(reinterpret_cast<const char*>(data), size), "rank_00000.bin");
  } catch (const primus::Error& e) {
    primus::fuzz::refused(e);
  }
  return 0;
}
