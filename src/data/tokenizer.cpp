#include "data/tokenizer.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sentencepiece_processor.h>

#include "core/bounded_json.h"
#include "core/bytes.h"
#include "core/error.h"
#include "data/bpe.h"
#include "data/component_steps.h"
#include "data/normalizer.h"

namespace primus::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Tokenizer files are read whole; the largest real ones (Gemma 3's tokenizer.json) are about 33 MB.
constexpr uint64_t kMaxTokenizerFileBytes = uint64_t(256) << 20;

std::string read_file(const std::string& path, const char* what) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{} '{}' does not exist", what, path);
  if (fs::is_directory(path, ec)) fail("{} '{}' is a folder, expected a file", what, path);
  if (const uint64_t size = fs::file_size(path, ec); !ec && size > kMaxTokenizerFileBytes)
    fail("{} '{}' is {}, more than the {} a tokenizer file may have", what, path, human_bytes(size),
         human_bytes(kMaxTokenizerFileBytes));
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot read {} '{}'", what, path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string base64_decode(std::string_view s, const std::string& where) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(a[i])] = static_cast<int8_t>(i);
    t['-'] = 62, t['_'] = 63;
    return t;
  }();
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    int v = table[static_cast<unsigned char>(c)];
    if (v < 0) fail("{}: invalid base64 '{}'", where, s);
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

void check_utf8(std::string_view text) {
  size_t bad = find_invalid_utf8(text);
  if (bad != std::string_view::npos) fail("text is not valid UTF-8 (byte {} of {})", bad, text.size());
}

// ----------------------------------------------------------------------------------------------
// Byte-level BPE tokenizer: tiktoken rank files and Hugging Face tokenizer.json.

class BpeTokenizer : public Tokenizer {
 public:
  // One pre-tokenizer step of tokenizer.json, applied to each piece the previous step made.
  struct PreStep {
    enum Kind { Regex, PrefixSpace, Metaspace } kind = Regex;
    std::string pattern;      // Regex: split at each match, the match kept as `behavior` says
    // Split's behaviors (the HF library's names): what becomes of each match ("delimiter").
    enum Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous } behavior = Isolated;
    bool invert = false;      // Regex: the text between matches is the delimiter
    std::string replacement;  // Metaspace: stands for ' '
    enum Prepend { Never, First, Always } prepend = Always;  // Metaspace: prepend `replacement`
    bool split = false;       // Metaspace: a piece starts at each `replacement`
    static PreStep of(Kind k, std::string pattern = "") {
      PreStep s;
      s.kind = k;
      s.pattern = std::move(pattern);
      return s;
    }
  };
  struct Config {
    std::string type;
    std::vector<std::string> patterns;  // applied in sequence; empty = the whole text is one piece
    bool add_prefix_space = false;
    std::vector<PreStep> pre;  // tokenizer.json's steps; when empty, add_prefix_space then patterns
    TextNormalizer normalizer;
    // A vocabulary of text, not bytes (SentencePiece-style BPE): pieces start as characters.
    bool char_level = false;
    BytePairEncoder::CharFallback fallback;
    // Decoding a char-level vocabulary: `space_marker` back to ' ', <0xXX> to its byte, then at
    // most strip_leading spaces off the start.
    std::string space_marker;
    bool byte_fallback_decode = false;
    int strip_leading = 0;
    std::vector<std::pair<std::string, int32_t>> specials;  // text -> id (decode, and split when split_specials)
    bool split_specials = false;
    std::vector<int32_t> prefix, suffix;  // post-processor template
    int32_t bos = -1, eos = -1, pad = -1, eod = -1;
    int64_t vocab_size = 0;
  };

  BpeTokenizer(Config cfg, std::unique_ptr<BytePairEncoder> bpe)
      : cfg_(std::move(cfg)), bpe_(std::move(bpe)), splitter_(cfg_.split_specials ? cfg_.specials : decltype(cfg_.specials){}) {
    if (cfg_.pre.empty()) {
      if (cfg_.add_prefix_space) cfg_.pre.push_back(PreStep::of(PreStep::PrefixSpace));
      for (const auto& p : cfg_.patterns) cfg_.pre.push_back(PreStep::of(PreStep::Regex, p));
    }
    for (const auto& st : cfg_.pre)
      regexes_.push_back(st.kind == PreStep::Regex ? std::make_unique<PretokenRegex>(st.pattern) : nullptr);
    for (const auto& [text, id] : cfg_.specials) special_text_[id] = text;
  }

  std::vector<int32_t> encode(std::string_view text) const override { return encode_with(text, true); }
  std::vector<int32_t> encode_bare(std::string_view text) const override { return encode_with(text, false); }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= cfg_.vocab_size) fail("token id {} is outside the vocabulary [0, {})", id, cfg_.vocab_size);
      // Added tokens go through the decoder too (the HF library's order), which matters for a
      // char-level vocabulary: Gemma 3's added "▁▁" decodes to two spaces.
      auto sp = special_text_.find(id);
      if (sp != special_text_.end()) cfg_.char_level ? append_token(sp->second, out) : void(out += sp->second);
      else if (static_cast<size_t>(id) < bpe_->size()) append_token(bpe_->bytes_of(id), out);
    }
    for (int k = 0; k < cfg_.strip_leading && !out.empty() && out[0] == ' '; ++k) out.erase(0, 1);
    return out;
  }

  int64_t vocab_size() const override { return cfg_.vocab_size; }
  int32_t bos() const override { return cfg_.bos; }
  int32_t eos() const override { return cfg_.eos; }
  int32_t pad() const override { return cfg_.pad; }
  int32_t eod() const override { return cfg_.eod; }
  std::vector<std::pair<std::string, int32_t>> special_tokens() const override { return cfg_.specials; }
  std::string type() const override { return cfg_.type; }

 private:
  // around: the post-processor's template tokens before and after the text.
  std::vector<int32_t> encode_with(std::string_view text, bool around) const {
    check_utf8(text);  // once per document, so regex matching can skip its own check
    std::vector<int32_t> out;
    if (around) out = cfg_.prefix;
    out.reserve(text.size() / 3 + 8);
    auto plain = [&](size_t b, size_t n) { encode_plain(text.substr(b, n), b == 0, out); };
    if (splitter_.empty()) plain(0, text.size());
    else splitter_.split(text, plain, [&](int32_t id) { out.push_back(id); });
    if (around) out.insert(out.end(), cfg_.suffix.begin(), cfg_.suffix.end());
    return out;
  }
  // One stretch of text between added tokens; at_origin: it starts the input (Metaspace "first").
  void encode_plain(std::string_view text, bool at_origin, std::vector<int32_t>& out) const {
    if (cfg_.normalizer.identity()) {
      split_level(text, 0, at_origin, out);
    } else {
      const std::string normalized = cfg_.normalizer.apply(text);
      split_level(normalized, 0, at_origin, out);
    }
  }
  void split_level(std::string_view text, size_t level, bool at_origin, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    if (level == cfg_.pre.size()) {
      if (cfg_.char_level) bpe_->encode_chars(text, cfg_.fallback, out);
      else bpe_->encode_piece(text, out);
      return;
    }
    const PreStep& st = cfg_.pre[level];
    auto next = [&](size_t b, size_t n) { split_level(text.substr(b, n), level + 1, at_origin && b == 0, out); };
    if (st.kind == PreStep::Regex && st.behavior == PreStep::Isolated && !st.invert) {
      regexes_[level]->split(text, next);
    } else if (st.kind == PreStep::Regex) {
      split_delimited(text, *regexes_[level], st, next);
    } else if (st.kind == PreStep::PrefixSpace) {
      if (text[0] == ' ') return split_level(text, level + 1, at_origin, out);
      split_level(" " + std::string(text), level + 1, at_origin, out);
    } else {  // Metaspace: spaces become the marker, which may start the text and each piece
      std::string s;
      for (char c : text) c == ' ' ? s += st.replacement : s += c;
      const bool prepend = st.prepend == PreStep::Always || (st.prepend == PreStep::First && at_origin);
      if (prepend && s.compare(0, st.replacement.size(), st.replacement) != 0) s.insert(0, st.replacement);
      if (!st.split) return split_level(s, level + 1, at_origin, out);
      std::string_view v(s);
      size_t start = 0;
      for (size_t at = v.find(st.replacement, 1); at != std::string_view::npos; at = v.find(st.replacement, at + 1)) {
        split_level(v.substr(start, at - start), level + 1, at_origin && start == 0, out);
        start = at;
      }
      split_level(v.substr(start), level + 1, at_origin && start == 0, out);
    }
  }
  // Split with a behavior other than Isolated: pieces as the HF library forms them from the
  // delimiters (the matches, or with invert the text between them).
  template <typename F>
  static void split_delimited(std::string_view text, const PretokenRegex& re, const PreStep& st, F&& next) {
    struct Piece {
      size_t b, n;
      bool delim;
    };
    std::vector<Piece> ps, out;
    re.split_marked(text, [&](size_t b, size_t n, bool match) { ps.push_back({b, n, match != st.invert}); });
    bool prev_delim = false;
    switch (st.behavior) {
      case PreStep::Isolated: out = ps; break;
      case PreStep::Removed:
        for (const Piece& p : ps)
          if (!p.delim) out.push_back(p);
        break;
      case PreStep::MergedWithPrevious:  // a delimiter joins the piece before it, unless that is one too
        for (const Piece& p : ps) {
          if (p.delim && !prev_delim && !out.empty()) out.back().n += p.n;
          else out.push_back(p);
          prev_delim = p.delim;
        }
        break;
      case PreStep::MergedWithNext:  // a delimiter joins the piece after it, unless that is one too
        for (size_t i = ps.size(); i-- > 0;) {
          const Piece& p = ps[i];
          if (p.delim && !prev_delim && !out.empty()) out.back().b = p.b, out.back().n += p.n;
          else out.push_back(p);
          prev_delim = p.delim;
        }
        std::reverse(out.begin(), out.end());
        break;
      case PreStep::Contiguous:  // a run of delimiters becomes one piece
        for (const Piece& p : ps) {
          if (p.delim && prev_delim && !out.empty()) out.back().n += p.n;
          else out.push_back(p);
          prev_delim = p.delim;
        }
        break;
    }
    for (const Piece& p : out) next(p.b, p.n);
  }

  void append_token(const std::string& tok, std::string& out) const {
    if (!cfg_.char_level) {
      out += tok;
      return;
    }
    unsigned byte = 0;
    if (cfg_.byte_fallback_decode && tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>' &&
        std::sscanf(tok.c_str() + 3, "%2X", &byte) == 1) {
      out += static_cast<char>(byte);
      return;
    }
    if (cfg_.space_marker.empty()) {
      out += tok;
      return;
    }
    size_t pos = 0;
    for (size_t at; (at = tok.find(cfg_.space_marker, pos)) != std::string::npos; pos = at + cfg_.space_marker.size())
      out.append(tok, pos, at - pos).append(" ");
    out.append(tok, pos, std::string::npos);
  }

  Config cfg_;
  std::unique_ptr<BytePairEncoder> bpe_;
  SpecialSplitter splitter_;
  std::vector<std::unique_ptr<PretokenRegex>> regexes_;
  std::unordered_map<int32_t, std::string> special_text_;
};

std::unique_ptr<Tokenizer> build_tiktoken(const TokenizerOptions& o) {
  if (o.model.empty()) fail("TikTokenizer needs --tokenizer-model (a .tiktoken rank file)");
  std::string data = read_file(o.model, "tiktoken rank file");
  std::vector<std::string> ranks;
  if (!data.empty() && data[0] == '[') {
    // Megatron's JSON list: [{"rank": i, "token_bytes": base64, "token_str": ...}, ...]
    const json j = parse_json(data, fmt::format("tiktoken rank file '{}'", o.model));
    try {
      for (size_t i = 0; i < j.size(); ++i) {
        if (j[i].at("rank").get<size_t>() != i) fail("{}: entry {} has rank {}", o.model, i, j[i].at("rank").dump());
        ranks.push_back(base64_decode(j[i].at("token_bytes").get<std::string>(), o.model));
      }
    } catch (const json::exception& e) {
      fail("tiktoken rank file '{}' is not a valid Megatron vocabulary JSON: {}", o.model, e.what());
    }
  } else {
    std::istringstream in(data);
    std::string line;
    size_t lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      if (line.empty()) continue;
      auto sp = line.find(' ');
      int64_t rank = -1;
      if (sp != std::string::npos) std::from_chars(line.data() + sp + 1, line.data() + line.size(), rank);
      if (sp == std::string::npos || rank != static_cast<int64_t>(ranks.size()))
        fail("tiktoken rank file '{}' line {}: expected '<base64> {}'", o.model, lineno, ranks.size());
      ranks.push_back(base64_decode(std::string_view(line).substr(0, sp), fmt::format("{} line {}", o.model, lineno)));
    }
  }
  if (ranks.size() < 256) fail("tiktoken rank file '{}' has {} ranks, fewer than the 256 bytes", o.model, ranks.size());

  std::string pname = o.tiktoken_pattern;
  if (pname.empty()) {  // cl100k_base.tiktoken and the like name their pattern
    std::string stem = fs::path(o.model).stem().string();
    if (!known_tiktoken_pattern(stem).empty()) pname = stem;
  }
  if (pname.empty())
    fail("TikTokenizer needs --tiktoken-pattern: cl100k_base, o200k_base, gpt2, v1, v2 or a regex");
  std::string pattern = known_tiktoken_pattern(pname);

  BpeTokenizer::Config cfg;
  cfg.type = "TikTokenizer";
  std::unique_ptr<BytePairEncoder> bpe;
  if (pname == "cl100k_base" || pname == "o200k_base" || pname == "gpt2" || pname == "r50k_base" ||
      pname == "p50k_base") {
    // OpenAI's layout: ranks are ids, special tokens after them (tiktoken_ext/openai_public.py).
    int32_t n = static_cast<int32_t>(ranks.size());
    if (pname == "cl100k_base")
      cfg.specials = {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259},
                      {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276}};
    else if (pname == "o200k_base")
      cfg.specials = {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
    else
      cfg.specials = {{"<|endoftext|>", 50256}};
    int32_t total = n;
    for (auto& [t, id] : cfg.specials) {
      if (id < n) fail("tiktoken rank file '{}' has {} ranks, more than {} expects", o.model, n, pname);
      total = std::max(total, id + 1);
    }
    cfg.eos = cfg.eod = cfg.specials[0].second;
    cfg.vocab_size = total;
    bpe = BytePairEncoder::from_ranks(ranks, 0, total);
  } else {
    // Megatron's layout (CustomTikTokenizer): num_special_tokens ids first, ranks shifted after them.
    if (pattern.empty()) pattern = pname;  // a literal regex
    int64_t ns = o.tiktoken_num_special_tokens;
    if (ns < 3) fail("--tiktoken-num-special-tokens must be at least 3 (<unk> <s> </s>), got {}", ns);
    int64_t inner = o.vocab_size > 0 ? o.vocab_size - ns : static_cast<int64_t>(ranks.size());
    if (inner <= 0 || inner > static_cast<int64_t>(ranks.size()))
      fail("--vocab-size {} does not fit {} special tokens plus the {} ranks of '{}'", o.vocab_size, ns,
           ranks.size(), o.model);
    ranks.resize(inner);
    std::vector<std::string> names = {"<unk>", "<s>", "</s>"};
    for (int64_t i = 3; i < ns; ++i) names.push_back(fmt::format("<SPECIAL_{}>", i));
    for (int64_t i = 0; i < ns; ++i) cfg.specials.emplace_back(names[i], static_cast<int32_t>(i));
    cfg.bos = 1;
    cfg.eos = cfg.eod = 2;
    cfg.vocab_size = ns + inner;
    bpe = BytePairEncoder::from_ranks(ranks, static_cast<int32_t>(ns), static_cast<int32_t>(ns + inner));
  }
  cfg.patterns = {pattern};
  cfg.split_specials = false;  // Megatron's TikTokenizer calls encode_ordinary: special text is plain text
  return std::make_unique<BpeTokenizer>(std::move(cfg), std::move(bpe));
}

// GPT-2's byte <-> printable-character table used by every byte-level tokenizer.json.
std::array<uint32_t, 256> bytes_to_unicode() {
  std::array<uint32_t, 256> m{};
  std::vector<bool> direct(256, false);
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) m[b] = direct[b] ? b : 256 + n++;
  return m;
}

std::string token_text(const json& v) {  // "<s>" or {"content": "<s>", ...}
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
  return "";
}

// A token id from tokenizer.json: a 32-bit integer, or an error (converting 1e78 would be undefined).
int32_t token_id(const json& v, const std::string& where, const std::string& token) {
  if (!v.is_number_integer() || v.get<int64_t>() > std::numeric_limits<int32_t>::max() ||
      v.get<int64_t>() < std::numeric_limits<int32_t>::min())
    fail("tokenizer file '{}': the id of '{}' is not a 32-bit integer: {}", where, token, v.dump());
  return v.get<int32_t>();
}

// Byte-level BPE (GPT-2, Llama 3, Qwen) names ByteLevel in its pre-tokenizer or decoder; otherwise
// the vocabulary is text with a space marker (SentencePiece-style: Llama 2, Mistral, Gemma).
bool has_byte_level(const json& component, const char* list_key, const std::string& where, const char* what) {
  for (const json* step : component_steps(component, list_key, fmt::format("tokenizer file '{}': {}", where, what)))
    if (step->value("type", "") == "ByteLevel") return true;
  return false;
}

// Pre-tokenizer: Split(regex) steps, ByteLevel (whose use_regex means GPT-2's regex) and
// Metaspace, applied in order.
void read_pre_tokenizer(const json& component, const std::string& where, BpeTokenizer::Config& cfg) {
  using Step = BpeTokenizer::PreStep;
  for (const json* step :
       component_steps(component, "pretokenizers", fmt::format("tokenizer file '{}': pre-tokenizer", where))) {
    const json& p = *step;
    const std::string t = p.value("type", "");
    if (t == "Split") {
      const json& pat = p.at("pattern");
      Step st;
      if (pat.contains("Regex")) st = Step::of(Step::Regex, pat["Regex"].get<std::string>());
      else if (pat.contains("String"))  // a literal: quoted for PCRE2
        st = Step::of(Step::Regex, "\\Q" + pat["String"].get<std::string>() + "\\E");
      else fail("tokenizer file '{}': Split has neither a Regex nor a String pattern", where);
      const std::string behavior = p.value("behavior", "Isolated");
      const std::vector<std::string> names = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                              "Contiguous"};
      auto it = std::find(names.begin(), names.end(), behavior);
      if (it == names.end())
        fail("tokenizer file '{}': Split behavior '{}' is unknown ({})", where, behavior, fmt::join(names, ", "));
      st.behavior = static_cast<Step::Behavior>(it - names.begin());
      st.invert = p.value("invert", false);
      cfg.pre.push_back(st);
    } else if (t == "ByteLevel") {
      if (p.value("add_prefix_space", false)) cfg.pre.push_back(Step::of(Step::PrefixSpace));
      if (p.value("use_regex", true)) cfg.pre.push_back(Step::of(Step::Regex, known_tiktoken_pattern("gpt2")));
    } else if (t == "Metaspace") {
      Step st = Step::of(Step::Metaspace);
      st.replacement = p.value("replacement", "\u2581");
      // Older files say add_prefix_space (false: never), newer ones prepend_scheme; the HF library
      // lets an explicit false win.
      std::string scheme = p.value("add_prefix_space", true) ? p.value("prepend_scheme", "always") : "never";
      if (scheme == "always") st.prepend = Step::Always;
      else if (scheme == "first") st.prepend = Step::First;
      else if (scheme == "never") st.prepend = Step::Never;
      else fail("tokenizer file '{}': Metaspace prepend_scheme '{}' is unknown (always, first, never)", where, scheme);
      st.split = p.value("split", true);
      if (st.replacement.empty()) fail("tokenizer file '{}': Metaspace has an empty replacement", where);
      cfg.pre.push_back(st);
    } else {
      fail("tokenizer file '{}': pre-tokenizer '{}' is not supported (Split, ByteLevel, Metaspace, Sequence)", where,
           t);
    }
  }
}

// Decoder of a char-level vocabulary: the space marker back to spaces, <0xXX> tokens to bytes.
void read_decoder(const json& component, const std::string& where, BpeTokenizer::Config& cfg) {
  for (const json* step : component_steps(component, "decoders", fmt::format("tokenizer file '{}': decoder", where))) {
    const json& d = *step;
    const std::string t = d.value("type", "");
    if (t == "Replace" && d.at("pattern").contains("String") && d.value("content", "") == " ") {
      cfg.space_marker = d["pattern"]["String"].get<std::string>();
    } else if (t == "Metaspace") {
      cfg.space_marker = d.value("replacement", "\u2581");
      if (d.value("add_prefix_space", true) && d.value("prepend_scheme", "always") != "never") cfg.strip_leading = 1;
    } else if (t == "ByteFallback") {
      cfg.byte_fallback_decode = true;
    } else if (t == "Strip") {
      if (d.value("content", " ") != " " || d.value("stop", 0) != 0)
        fail("tokenizer file '{}': decoder Strip other than of leading spaces is not supported", where);
      cfg.strip_leading = d.value("start", 0);
    } else if (t != "Fuse" && t != "ByteLevel") {
      fail("tokenizer file '{}': decoder '{}' is not supported (Replace, ByteFallback, Fuse, Strip, Metaspace, "
           "ByteLevel, Sequence)", where, t);
    }
  }
}

// Post-processor: the single-sequence template's special tokens (e.g. Llama 3's BOS).
void read_post_processor(const json& component, const std::string& where, BpeTokenizer::Config& cfg) {
  for (const json* step :
       component_steps(component, "processors", fmt::format("tokenizer file '{}': post-processor", where))) {
    const json& p = *step;
    const std::string t = p.value("type", "");
    if (t == "TemplateProcessing") {
      bool after = false;
      for (const auto& item : p.at("single")) {
        if (item.contains("Sequence")) {
          after = true;
        } else if (item.contains("SpecialToken")) {
          std::string name = item["SpecialToken"].at("id").get<std::string>();
          for (const json& id : p.at("special_tokens").at(name).at("ids"))
            (after ? cfg.suffix : cfg.prefix).push_back(token_id(id, where, name));
        }
      }
    } else if (t != "ByteLevel") {
      fail("tokenizer file '{}': post-processor '{}' is not supported (TemplateProcessing, ByteLevel)", where, t);
    }
  }
}

std::unique_ptr<Tokenizer> build_hf(const TokenizerOptions& o) {
  if (o.model.empty()) fail("HuggingFaceTokenizer needs --tokenizer-model (tokenizer.json or its folder)");
  fs::path path = o.model;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path /= "tokenizer.json";
  std::string text = read_file(path.string(), "tokenizer file");
  const std::string where = path.string();
  const json j = parse_json(text, fmt::format("tokenizer file '{}'", where));
  BpeTokenizer::Config cfg;
  cfg.type = "HuggingFaceTokenizer";
  std::vector<std::string> token_bytes;
  std::vector<BytePairEncoder::MergeRule> merges;
  bool ignore_merges = false;
  try {
    const json& model = j.at("model");
    std::string mtype = model.value("type", "BPE");
    if (mtype != "BPE")
      fail("tokenizer file '{}': model type '{}' is not supported (BPE only; for a SentencePiece .model use "
           "GPTSentencePieceTokenizer)", where, mtype);
    ignore_merges = model.value("ignore_merges", false);
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
        fail("tokenizer file '{}': BPE {} '{}' is not supported", where, k, model[k].get<std::string>());
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() > 0)
      fail("tokenizer file '{}': BPE dropout is not supported (it makes encoding random)", where);
    cfg.char_level = !has_byte_level(j.value("pre_tokenizer", json()), "pretokenizers", where, "pre-tokenizer") &&
                     !has_byte_level(j.value("decoder", json()), "decoders", where, "decoder");

    // Byte-level vocabulary: each character stands for one byte.
    auto b2u = bytes_to_unicode();
    std::unordered_map<uint32_t, char> u2b;
    for (int b = 0; b < 256; ++b) u2b[b2u[b]] = static_cast<char>(b);
    auto to_bytes = [&](const std::string& tok, std::string& out) -> bool {
      out.clear();
      for (size_t i = 0; i < tok.size();) {
        unsigned char c = tok[i];
        uint32_t cp;
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (size_t k = 1; k < len && i + k < tok.size(); ++k) cp = (cp << 6) | (tok[i + k] & 0x3F);
        i += len;
        auto it = u2b.find(cp);
        if (it == u2b.end()) return false;
        out += it->second;
      }
      return true;
    };
    std::unordered_map<std::string, int32_t> vocab;
    int32_t max_id = -1;
    for (auto& [tok, idv] : model.at("vocab").items()) {
      int32_t id = token_id(idv, where, tok);
      if (id < 0) fail("tokenizer file '{}': negative id for '{}'", where, tok);
      vocab[tok] = id;
      max_id = std::max(max_id, id);
    }
    // Ids are (nearly) dense in every real vocabulary; one stray huge id would size the table.
    if (int64_t(max_id) >= 2 * int64_t(vocab.size()) + 65536)
      fail("tokenizer file '{}': ids go up to {} for {} vocabulary entries; a vocabulary's ids must be dense", where,
           max_id, vocab.size());
    token_bytes.assign(max_id + 1, "");
    std::string b;
    size_t non_byte_level = 0;
    for (auto& [tok, id] : vocab) {
      if (cfg.char_level) token_bytes[id] = tok;
      else if (to_bytes(tok, b)) token_bytes[id] = b;
      else ++non_byte_level;
    }
    if (cfg.char_level) {
      cfg.fallback.byte_fallback = model.value("byte_fallback", false);
      cfg.fallback.fuse_unk = model.value("fuse_unk", false);
      if (model.contains("unk_token") && model["unk_token"].is_string()) {
        auto u = vocab.find(model["unk_token"].get<std::string>());
        if (u == vocab.end())
          fail("tokenizer file '{}': unk_token '{}' is not in the vocabulary", where, model["unk_token"].get<std::string>());
        cfg.fallback.unk = u->second;
      }
    }
    if (non_byte_level > vocab.size() / 10)
      fail("tokenizer file '{}': {} of {} vocabulary entries are not byte-level; only byte-level BPE is supported",
           where, non_byte_level, vocab.size());
    uint32_t rank = 0;
    for (const auto& m : model.at("merges")) {
      std::string a, c;
      if (m.is_string()) {
        std::string s = m.get<std::string>();
        auto sp = s.find(' ', 1);
        if (sp == std::string::npos) fail("tokenizer file '{}': merge '{}' has no space", where, s);
        a = s.substr(0, sp), c = s.substr(sp + 1);
      } else {
        a = m.at(0).get<std::string>(), c = m.at(1).get<std::string>();
      }
      auto ia = vocab.find(a), ic = vocab.find(c), im = vocab.find(a + c);
      if (ia == vocab.end() || ic == vocab.end() || im == vocab.end())
        fail("tokenizer file '{}': merge {} '{} {}' uses a token not in the vocabulary", where, rank, a, c);
      merges.push_back({ia->second, ic->second, im->second, rank++});
    }

    // Added tokens are matched in the raw text before anything else, as HF tokenizers does.
    for (const auto& t : j.value("added_tokens", json::array())) {
      int32_t id = token_id(t.at("id"), where, t.at("content").dump());
      if (id < 0) fail("tokenizer file '{}': negative id for added token {}", where, t.at("content").dump());
      cfg.specials.emplace_back(t.at("content").get<std::string>(), id);
      max_id = std::max(max_id, id);
    }
    cfg.split_specials = true;
    cfg.vocab_size = max_id + 1;
    if (static_cast<int64_t>(token_bytes.size()) < cfg.vocab_size) token_bytes.resize(cfg.vocab_size);

    cfg.normalizer = TextNormalizer::from_json(j.value("normalizer", json()), where);
    // Added tokens are matched in the raw text, before normalization: right for those marked
    // "normalized": false, and for the others as long as normalizing is the identity.
    for (const auto& t : j.value("added_tokens", json::array())) {
      for (const char* k : {"lstrip", "rstrip", "single_word"})
        if (t.value(k, false))
          fail("tokenizer file '{}': added token {} has {} true, which is not supported", where,
               t.at("content").dump(), k);
      if (t.value("normalized", false) && !cfg.normalizer.identity())
        fail("tokenizer file '{}': added token {} is matched after normalization, which is not supported", where,
             t.at("content").dump());
    }

    read_pre_tokenizer(j.value("pre_tokenizer", json()), where, cfg);
    read_decoder(j.value("decoder", json()), where, cfg);
    read_post_processor(j.value("post_processor", json()), where, cfg);
  } catch (const json::exception& e) {
    fail("tokenizer file '{}' is not a tokenizer.json this reader understands: {}", where, e.what());
  }

  // bos/eos/pad come from tokenizer_config.json beside it when present, else from common names.
  auto id_of = [&](const std::string& s) -> int32_t {
    for (auto& [t, id] : cfg.specials)
      if (t == s) return id;
    return -1;
  };
  fs::path config = path.parent_path() / "tokenizer_config.json";
  if (fs::exists(config, ec)) {
    try {
      const json c = parse_json(read_file(config.string(), "tokenizer config"),
                                fmt::format("tokenizer config '{}'", config.string()));
      if (c.contains("bos_token")) cfg.bos = id_of(token_text(c["bos_token"]));
      if (c.contains("eos_token")) cfg.eos = id_of(token_text(c["eos_token"]));
      if (c.contains("pad_token")) cfg.pad = id_of(token_text(c["pad_token"]));
    } catch (const json::exception& e) {
      fail("tokenizer config '{}' is not valid JSON: {}", config.string(), e.what());
    }
  }
  for (const char* n : {"<|begin_of_text|>", "<s>", "<|startoftext|>"})
    if (cfg.bos < 0) cfg.bos = id_of(n);
  for (const char* n : {"<|end_of_text|>", "<|endoftext|>", "</s>"})
    if (cfg.eos < 0) cfg.eos = id_of(n);
  cfg.eod = cfg.eos;
  auto bpe = std::make_unique<BytePairEncoder>(std::move(token_bytes), merges, ignore_merges);
  return std::make_unique<BpeTokenizer>(std::move(cfg), std::move(bpe));
}

// ----------------------------------------------------------------------------------------------
// SentencePiece: GPTSentencePieceTokenizer (plain), Llama2Tokenizer (BOS first) and Megatron's
// SentencePieceTokenizer (adds <CLS> <SEP> <EOD> <MASK> after the vocabulary and splits on them).

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const TokenizerOptions& o) : type_(o.type) {
    if (o.model.empty()) fail("{} needs --tokenizer-model (a SentencePiece .model file)", o.type);
    read_file(o.model, "SentencePiece model");  // existence and readability, with the file's name
    auto st = sp_.Load(o.model);
    if (!st.ok()) fail("cannot load SentencePiece model '{}': {}", o.model, st.ToString());
    n_ = sp_.GetPieceSize();
    bos_ = sp_.bos_id(), eos_ = sp_.eos_id(), pad_ = sp_.pad_id();
    eod_ = eos_;
    vocab_size_ = n_;
    if (type_ == "SentencePieceTokenizer") {
      auto add = [&](const std::string& t) {
        int32_t id = sp_.PieceToId(t);
        if (id == sp_.unk_id() && t != sp_.IdToPiece(sp_.unk_id())) id = static_cast<int32_t>(vocab_size_++);
        for (auto& [s, i] : specials_)
          if (s == t) return i;
        specials_.emplace_back(t, id);
        return id;
      };
      add("<CLS>"), add("<SEP>");
      eod_ = add("<EOD>");
      add("<MASK>");
      pad_ = add(pad_ >= 0 ? sp_.IdToPiece(pad_) : "<PAD>");
      bos_ = add(bos_ >= 0 ? sp_.IdToPiece(bos_) : "<BOS>");
      eos_ = add(eos_ >= 0 ? sp_.IdToPiece(eos_) : "<EOS>");
      splitter_ = std::make_unique<SpecialSplitter>(specials_);
    } else {
      for (int32_t id : {bos_, eos_, pad_})
        if (id >= 0) specials_.emplace_back(sp_.IdToPiece(id), id);
    }
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    if (type_ == "Llama2Tokenizer" && bos_ >= 0) out.push_back(bos_);
    encode_into(text, out);
    return out;
  }
  std::vector<int32_t> encode_bare(std::string_view text) const override {
    std::vector<int32_t> out;
    encode_into(text, out);
    return out;
  }
  void encode_into(std::string_view text, std::vector<int32_t>& out) const {
    auto plain = [&](size_t b, size_t n) {
      std::vector<int> ids;
      auto st = sp_.Encode(text.substr(b, n), &ids);
      if (!st.ok()) fail("SentencePiece cannot encode text: {}", st.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
    };
    if (splitter_) splitter_->split(text, plain, [&](int32_t id) { out.push_back(id); });
    else plain(0, text.size());
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    std::vector<int> run;
    auto flush = [&] {
      std::string s;
      auto st = sp_.Decode(run, &s);
      if (!st.ok()) fail("SentencePiece cannot decode ids: {}", st.ToString());
      out += s;
      run.clear();
    };
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size_) fail("token id {} is outside the vocabulary [0, {})", id, vocab_size_);
      if (id >= n_) {  // an added special token
        flush();
        for (auto& [s, i] : specials_)
          if (i == id) out += s;
      } else {
        run.push_back(id);
      }
    }
    flush();
    return out;
  }

  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos() const override { return bos_; }
  int32_t eos() const override { return eos_; }
  int32_t pad() const override { return pad_; }
  int32_t eod() const override { return eod_; }
  std::vector<std::pair<std::string, int32_t>> special_tokens() const override { return specials_; }
  std::string type() const override { return type_; }

 private:
  std::string type_;
  sentencepiece::SentencePieceProcessor sp_;
  int32_t n_ = 0, bos_ = -1, eos_ = -1, pad_ = -1, eod_ = -1;
  int64_t vocab_size_ = 0;
  std::vector<std::pair<std::string, int32_t>> specials_;
  std::unique_ptr<SpecialSplitter> splitter_;
};

// ----------------------------------------------------------------------------------------------

// UTF-8 bytes are ids 0..255; <pad> <s> </s> follow. Needs no model: the quick-start tokenizer.
class ByteLevelTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out(text.size());
    for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id > 258) fail("token id {} is outside the vocabulary [0, 259)", id);
      if (id < 256) out += static_cast<char>(id);
      else out += id == 256 ? "<pad>" : id == 257 ? "<s>" : "</s>";
    }
    return out;
  }
  int64_t vocab_size() const override { return 259; }
  int32_t pad() const override { return 256; }
  int32_t bos() const override { return 257; }
  int32_t eos() const override { return 258; }
  std::vector<std::pair<std::string, int32_t>> special_tokens() const override {
    return {{"<pad>", 256}, {"<s>", 257}, {"</s>", 258}};
  }
  std::string type() const override { return "ByteLevelTokenizer"; }
};

// Megatron's NullTokenizer: the text is space-separated ids; eod is vocab_size (one past them).
class NullTokenizer : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t v) : v_(v) {
    if (v <= 0) fail("NullTokenizer needs --vocab-size > 0");
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i < text.size()) {
      size_t j = text.find(' ', i);
      if (j == std::string_view::npos) j = text.size();
      int64_t id = -1;
      auto r = std::from_chars(text.data() + i, text.data() + j, id);
      if (r.ec != std::errc() || r.ptr != text.data() + j || id < 0 || id >= v_)
        fail("NullTokenizer: '{}' is not an id in [0, {})", text.substr(i, j - i), v_);
      out.push_back(static_cast<int32_t>(id));
      i = j + 1;
    }
    return out;
  }
  std::string decode(std::span<const int32_t> ids) const override { return fmt::format("{}", fmt::join(ids, " ")); }
  int64_t vocab_size() const override { return v_ + 1; }
  int32_t eos() const override { return static_cast<int32_t>(v_); }
  std::string type() const override { return "NullTokenizer"; }

 private:
  int64_t v_;
};

}  // namespace

std::vector<std::string> tokenizer_types() {
  return {"HuggingFaceTokenizer",    "TikTokenizer",    "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
          "Llama2Tokenizer",         "ByteLevelTokenizer", "NullTokenizer"};
}

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& o) {
  if (o.type == "HuggingFaceTokenizer") return build_hf(o);
  if (o.type == "TikTokenizer") return build_tiktoken(o);
  if (o.type == "SentencePieceTokenizer" || o.type == "GPTSentencePieceTokenizer" || o.type == "Llama2Tokenizer")
    return std::make_unique<SentencePieceTokenizer>(o);
  if (o.type == "ByteLevelTokenizer") return std::make_unique<ByteLevelTokenizer>();
  if (o.type == "NullTokenizer") return std::make_unique<NullTokenizer>(o.vocab_size);
  fail("unknown tokenizer type '{}'; types: {}", o.type, fmt::join(tokenizer_types(), ", "));
}

}  // namespace primus::data
