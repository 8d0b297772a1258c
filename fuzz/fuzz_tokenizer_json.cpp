// A Hugging Face tokenizer.json: loading either succeeds (and then a fixed text round-trips through
// encode and decode without a crash) or throws primus::Error.
#include <cstdint>

#include "core/error.h"
#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = primus::fuzz::write_scratch("tokenizer.json", data, size);
  try {
    auto tok = primus::data::build_tokenizer({"HuggingFaceTokenizer", path.string()});
    const auto ids = tok->encode("Hello world, 123 <|endoftext|> \xc3\xa9t\xc3\xa9 \xf0\x9f\x99\x82");
    (void)tok->decode(ids);
  } catch (const primus::Error& e) {
    primus::fuzz::refused(e);
  }
  return 0;
}
