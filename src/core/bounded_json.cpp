#include "core/bounded_json.h"

#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "core/bytes.h"
#include "core/error.h"

namespace primus {

using json = nlohmann::json;

nlohmann::json parse_json(std::string_view text, const std::string& what, const JsonLimits& limits) {
  // The parser's callback sees every object and array as it opens, with the depth of its parent
  // (0 for the top level), before the value is built; throwing there stops the parse.
  std::vector<std::set<std::string>> keys;  // with unique_keys: the keys of each open object
  auto bounded = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth + 1 > limits.max_depth)
          fail("{} nests objects and arrays more than {} levels deep; no file of this kind needs that many (a "
               "damaged or hostile file?)", what, limits.max_depth);
        if (limits.unique_keys) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (limits.unique_keys) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (limits.unique_keys && !keys.back().insert(parsed.get<std::string>()).second)
          fail("{} has the key '{}' twice in one object", what, parsed.get<std::string>());
        break;
      case json::parse_event_t::value: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), bounded);
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", what, e.what());
  }
}

nlohmann::json read_json_file(const std::filesystem::path& path, const std::string& what, const JsonLimits& limits) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("{} does not exist", what);
  if (std::filesystem::is_directory(path, ec)) fail("{} is a folder, expected a file", what);
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("cannot read {}: {}", what, ec.message());
  if (size > limits.max_bytes)
    fail("{} is {}, more than the {} a file of this kind may have", what, human_bytes(size),
         human_bytes(limits.max_bytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", what);
  std::string text(size, '\0');
  in.read(text.data(), std::streamsize(size));
  if (uint64_t(in.gcount()) != size) fail("cannot read {}: it changed while being read", what);
  return parse_json(text, what, limits);
}

}  // namespace primus
