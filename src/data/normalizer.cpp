#include "data/normalizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/component_steps.h"

namespace primus::data {

using json = nlohmann::json;

std::string unicode_normalize(std::string_view s, const std::string& form) {
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = form == "NFC"    ? unorm2_getNFCInstance(&err)
                          : form == "NFKC" ? unorm2_getNFKCInstance(&err)
                          : form == "NFD"  ? unorm2_getNFDInstance(&err)
                          : form == "NFKD" ? unorm2_getNFKDInstance(&err)
                                           : nullptr;
  if (!n) fail("unknown Unicode normalization form '{}' (NFC, NFKC, NFD, NFKD)", form);
  if (U_FAILURE(err)) fail("ICU has no {} normalizer: {}", form, u_errorName(err));
  // ASCII is unchanged by every form: the common case skips ICU's UTF-16 round trip.
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);
  // UTF-8 -> UTF-16 -> normalized UTF-16 -> UTF-8.
  int32_t n16 = 0;
  u_strFromUTF8(nullptr, 0, &n16, s.data(), int32_t(s.size()), &err);
  err = U_ZERO_ERROR;
  std::u16string in(size_t(n16), u'\0');
  u_strFromUTF8(reinterpret_cast<UChar*>(in.data()), n16, nullptr, s.data(), int32_t(s.size()), &err);
  if (U_FAILURE(err)) fail("text is not valid UTF-8 ({})", u_errorName(err));
  std::u16string out(in.size() * 3 + 16, u'\0');  // NFKC can expand up to 18x for rare characters
  int32_t n_out = unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), int32_t(in.size()),
                                   reinterpret_cast<UChar*>(out.data()), int32_t(out.size()), &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    out.assign(size_t(n_out), u'\0');
    n_out = unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), int32_t(in.size()),
                             reinterpret_cast<UChar*>(out.data()), n_out, &err);
  }
  if (U_FAILURE(err)) fail("{} normalization failed: {}", form, u_errorName(err));
  int32_t n8 = 0;
  u_strToUTF8(nullptr, 0, &n8, reinterpret_cast<const UChar*>(out.data()), n_out, &err);
  err = U_ZERO_ERROR;
  std::string r(size_t(n8), '\0');
  u_strToUTF8(r.data(), n8, nullptr, reinterpret_cast<const UChar*>(out.data()), n_out, &err);
  if (U_FAILURE(err)) fail("{} normalization failed: {}", form, u_errorName(err));
  return r;
}

TextNormalizer TextNormalizer::from_json(const json& node, const std::string& where) {
  TextNormalizer t;
  for (const json* step : component_steps(node, "normalizers", fmt::format("tokenizer file '{}': normalizer", where))) {
    const json& n = *step;
    const std::string type = n.value("type", "");
    if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") {
      t.steps_.push_back({Step::Form, type, ""});
    } else if (type == "Prepend") {
      t.steps_.push_back({Step::Prepend, n.at("prepend").get<std::string>(), ""});
    } else if (type == "Replace") {
      const json& p = n.at("pattern");
      if (!p.contains("String"))
        fail("tokenizer file '{}': normalizer Replace with a regex pattern is not supported (a String pattern is)",
             where);
      const std::string from = p["String"].get<std::string>();
      if (from.empty()) fail("tokenizer file '{}': normalizer Replace has an empty pattern", where);
      t.steps_.push_back({Step::Replace, from, n.at("content").get<std::string>()});
    } else {
      fail("tokenizer file '{}': normalizer '{}' is not supported (NFC, NFKC, NFD, NFKD, Prepend, Replace, "
           "Sequence)", where, type);
    }
  }
  return t;
}

std::string TextNormalizer::apply(std::string_view s) const {
  std::string cur(s);
  for (const Step& st : steps_) {
    switch (st.kind) {
      case Step::Form: cur = unicode_normalize(cur, st.a); break;
      case Step::Prepend:
        if (!cur.empty()) cur.insert(0, st.a);  // as the HF library: never onto empty text
        break;
      case Step::Replace: {
        std::string out;
        size_t pos = 0;
        for (size_t at; (at = cur.find(st.a, pos)) != std::string::npos; pos = at + st.a.size())
          out.append(cur, pos, at - pos).append(st.b);
        out.append(cur, pos, std::string::npos);
        cur = std::move(out);
        break;
      }
    }
  }
  return cur;
}

}  // namespace primus::data
