// JSONL -> Megatron indexed dataset, like Megatron's tools/preprocess_data.py: each line is a JSON
// object; the text under each --json-keys key becomes one document of `<prefix>_<key>_document`.bin/.idx.
//
// Streaming with bounded memory: lines are read in batches, tokenized by `workers` threads, and
// written in input order; at most 2 * workers batches are in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace primus::data {

struct PreprocessOptions {
  std::string input;  // .jsonl, or "-" for stdin
  std::vector<std::string> json_keys{"text"};
  std::string output_prefix;
  bool append_eod = false;
  int workers = 1;
  bool skip_bad = false;       // count and skip malformed lines instead of failing on the first
  size_t batch_bytes = 1 << 20;  // read this much input per batch
  double log_interval_s = 1.0;   // progress lines on stderr; <= 0 silences them
};

struct PreprocessStats {
  int64_t lines = 0, documents = 0, skipped = 0, empty = 0;
  int64_t bytes = 0, tokens = 0;
  double seconds = 0;
  std::vector<std::string> outputs;  // the prefixes written, one per key
};

// Output prefix for a key, Megatron's naming: <output_prefix>_<key>_document.
std::string document_prefix(const std::string& output_prefix, const std::string& key);

// One JSONL line's documents: for each key, its sequences (a string, or a list of strings as
// --split-sentences writes), tokenized, with eod appended when asked. Throws primus::Error naming
// what is wrong with the line (malformed JSON, a missing key, a value that is not a string).
std::vector<std::vector<std::vector<int32_t>>> encode_jsonl_line(std::string_view line,
                                                                 const std::vector<std::string>& keys,
                                                                 const Tokenizer& tok, bool append_eod);

PreprocessStats preprocess(const PreprocessOptions& options, const Tokenizer& tokenizer);

}  // namespace primus::data
