// The "normalizer" of a Hugging Face tokenizer.json: Unicode normalization forms (NFC, NFKC, NFD,
// NFKD; by ICU), Prepend, Replace with a literal pattern, and Sequence of these (an empty Sequence
// is the identity: DeepSeek-V3's). Anything else is refused by name when the file is read.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace primus::data {

// s in Unicode normalization form `form` ("NFC", "NFKC", "NFD", "NFKD"); s must be valid UTF-8.
std::string unicode_normalize(std::string_view s, const std::string& form);

class TextNormalizer {
 public:
  TextNormalizer() = default;
  // From the tokenizer.json node (null: the identity); errors name `where` and the unsupported type.
  static TextNormalizer from_json(const nlohmann::json& node, const std::string& where);
  bool identity() const { return steps_.empty(); }
  std::string apply(std::string_view s) const;

 private:
  struct Step {
    enum Kind { Form, Prepend, Replace } kind;
    std::string a, b;  // Form: the form; Prepend: the prefix; Replace: pattern, content
  };
  std::vector<Step> steps_;
};

}  // namespace primus::data
