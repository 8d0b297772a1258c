// One line of a JSONL corpus as `data preprocess` reads it (keys "text" and "title", a string or a
// list of strings each), tokenized byte-level: either documents or primus::Error.
#include <cstdint>
#include <memory>
#include <string_view>

#include "core/error.h"
#include "fuzz_util.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tok = primus::data::build_tokenizer({"ByteLevelTokenizer", ""});
  try {
    (void)primus::data::encode_jsonl_line(std::string_view(reinterpret_cast<const char*>(data), size),
                                          {"text", "title"}, *tok, true);
  } catch (const primus::Error& e) {
    primus::fuzz::refused(e);
  }
  return 0;
}
