// JSON from files a user hands us (tokenizer.json, config.json, safetensors headers, traces), read
// within limits checked before anything is built: the file's size before it is read, and the
// nesting depth while it is parsed. nlohmann::json's parser itself keeps its own stack on the heap,
// but a deep document is still a trap for the code that walks or copies it afterwards (copies,
// dump(), and every recursive reader of ours recurse once per level): 50,000 nested arrays kill the
// process with a stack overflow. Real files nest fewer than ten levels; the limit is 64.
//
// Errors are primus::Error and name `what` (e.g. "tokenizer file 'x/tokenizer.json'"):
//   "<what> is not valid JSON: <nlohmann's message>"
//   "<what> nests objects and arrays more than 64 levels deep; ..."
//   "<what> has the key 'k' twice in one object"   (with unique_keys)
//   "<what> is 300.0 MiB, more than the 256.0 MiB such a file may have"
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace primus {

struct JsonLimits {
  uint64_t max_bytes = uint64_t(64) << 20;  // read_json_file: the largest file read
  int max_depth = 64;                       // objects and arrays inside each other; the top level is 1
  bool unique_keys = false;                 // a key twice in one object is an error (else the last one wins)
};

// Parses `text`, refusing documents deeper than limits.max_depth before they are built.
nlohmann::json parse_json(std::string_view text, const std::string& what, const JsonLimits& limits = {});

// Reads and parses the file at `path`, refusing a file larger than limits.max_bytes before reading
// it. A missing or unreadable file is an error naming `what`.
nlohmann::json read_json_file(const std::filesystem::path& path, const std::string& what,
                              const JsonLimits& limits = {});

}  // namespace primus
