// A Megatron .idx file and its .bin: the input's first 4 bytes give the .bin's size (mod 64 KiB),
// the rest is the .idx. Opening either succeeds (and then every sequence can be read) or throws
// primus::Error.
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t bin_size = 0;
  std::memcpy(&bin_size, data, 4);
  bin_size %= 65536;
  std::vector<uint8_t> bin(bin_size, 7);
  primus::fuzz::write_scratch("d.bin", bin.data(), bin.size());
  const auto idx = primus::fuzz::write_scratch("d.idx", data + 4, size - 4);
  try {
    primus::data::IndexedDataset ds((primus::fuzz::scratch_dir() / "d").string());
    for (size_t i = 0; i < ds.num_sequences(); ++i) (void)ds.get(i);
  } catch (const primus::Error& e) {
    primus::fuzz::refused(e);
  }
  return 0;
}
