// Byte-level BPE, the algorithm of tiktoken and of Hugging Face's byte-level BPE models.
//
// Text is split by a pre-tokenizer regex (PCRE2 with Unicode properties, JIT-compiled); each piece's
// UTF-8 bytes start as one token per byte and the adjacent pair with the lowest merge rank is merged
// until no pair merges, leftmost first on ties. Merges are looked up by (left id, right id), so the
// loop works on integers. A piece that is a whole vocabulary entry maps to it directly when
// `whole_piece_lookup` is set (tiktoken always does this; Hugging Face with "ignore_merges").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace primus::data {

// A compiled pre-tokenizer regex. Rewrites \s and \S to Unicode's White_Space property so PCRE2 splits
// exactly as Rust's regex (tiktoken, HF tokenizers) does: PCRE2's own \s also matches U+180E.
class PretokenRegex {
 public:
  explicit PretokenRegex(const std::string& pattern);
  ~PretokenRegex();
  PretokenRegex(const PretokenRegex&) = delete;
  PretokenRegex& operator=(const PretokenRegex&) = delete;

  // Calls f(start, length) for each match in text, in order. Text between matches (only possible for
  // patterns that do not cover every character; OpenAI's and Megatron's do) is passed as its own piece
  // so nothing is lost. `text` must be valid UTF-8 (checked by the caller once per document).
  template <typename F>
  void split(std::string_view text, F&& f) const;
  // The same pieces, each with whether it is a match (true) or text between matches (false).
  template <typename F>
  void split_marked(std::string_view text, F&& f) const;

  const std::string& pattern() const { return pattern_; }

 private:
  // Returns false when no further match; sets [ms, me).
  bool next(std::string_view text, size_t start, size_t& ms, size_t& me) const;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

template <typename F>
void PretokenRegex::split(std::string_view text, F&& f) const {
  split_marked(text, [&](size_t b, size_t n, bool) { f(b, n); });
}

template <typename F>
void PretokenRegex::split_marked(std::string_view text, F&& f) const {
  size_t pos = 0, ms = 0, me = 0;
  while (pos < text.size() && next(text, pos, ms, me)) {
    if (ms > pos) f(pos, ms - pos, false);
    if (me == ms) {  // an empty match cannot advance; step one UTF-8 character
      size_t n = 1;
      while (ms + n < text.size() && (static_cast<unsigned char>(text[ms + n]) & 0xC0) == 0x80) ++n;
      f(ms, n, false);
      pos = ms + n;
    } else {
      f(ms, me - ms, true);
      pos = me;
    }
  }
  if (pos < text.size()) f(pos, text.size() - pos, false);
}

// Byte offset of the first invalid UTF-8 sequence, or npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);

// The regexes of OpenAI's encodings and of Megatron's TikTokenizer, by name; "" when unknown.
std::string known_tiktoken_pattern(const std::string& name);

class BytePairEncoder {
 public:
  // A merge rule: left+right -> merged, applied in increasing rank. Several rules may share a rank
  // (tiktoken: every split of one token has that token's rank); ties go to the leftmost pair.
  struct MergeRule {
    int32_t left, right, merged;
    uint32_t rank;
  };
  // token_bytes[id] are the raw bytes of token id ("" for ids with no bytes, e.g. special tokens).
  BytePairEncoder(std::vector<std::string> token_bytes, const std::vector<MergeRule>& merges,
                  bool whole_piece_lookup);
  BytePairEncoder(const BytePairEncoder&) = delete;
  BytePairEncoder& operator=(const BytePairEncoder&) = delete;

  // tiktoken's rank file: token bytes by rank; a merge (a, b) exists whenever a+b is a token, with
  // priority = rank(a+b). ids = rank + id_offset.
  static std::unique_ptr<BytePairEncoder> from_ranks(const std::vector<std::string>& bytes_by_rank,
                                                     int32_t id_offset, int32_t total_ids);

  // Appends the ids of one pre-tokenized piece.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // SentencePiece-style BPE (a tokenizer.json whose vocabulary is text, not bytes: Llama 2, Mistral,
  // Gemma): the piece starts as one symbol per UTF-8 character; a character outside the vocabulary
  // becomes the <0xXX> tokens of its bytes (byte_fallback), else `unk` (consecutive ones fused into
  // one with fuse_unk). Then the same merges.
  struct CharFallback {
    bool byte_fallback = false;
    int32_t unk = -1;
    bool fuse_unk = false;
  };
  void encode_chars(std::string_view piece, const CharFallback& fb, std::vector<int32_t>& out) const;
  const std::string& bytes_of(int32_t id) const { return token_bytes_[id]; }
  int32_t id_of(std::string_view bytes) const;  // -1 when absent
  size_t size() const { return token_bytes_.size(); }

 private:
  struct Merge {
    uint32_t rank;
    int32_t id;
  };
  const Merge* find_merge(int32_t a, int32_t b) const {
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    for (uint64_t i = mix(key) & merge_mask_;; i = (i + 1) & merge_mask_) {
      const MergeSlot& s = merge_slots_[i];
      if (s.key == key) return &s.merge;
      if (s.key == kEmptyKey) return nullptr;
    }
  }
  static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    return x ^ (x >> 33);
  }
  static uint64_t hash_bytes(std::string_view s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return mix(h);
  }
  int32_t find_bytes(std::string_view s) const;
  void merge_small(std::vector<int32_t>& sym) const;
  void merge_large(std::vector<int32_t>& sym) const;
  void merge(std::vector<int32_t>& sym) const { sym.size() <= 64 ? merge_small(sym) : merge_large(sym); }

  // Open-addressing tables: the encode loop's lookups are cache misses, and a probe into a flat array
  // costs one where a node-based std::unordered_map costs about three (measured: 44% of encode time).
  struct BytesSlot {
    uint64_t hash = 0;
    int32_t id = -1;
    uint32_t len = 0;
    char head[16] = {};  // the first bytes inline: most tokens compare without touching token_bytes_
  };
  static constexpr uint64_t kEmptyKey = ~0ull;
  struct MergeSlot {
    uint64_t key = kEmptyKey;
    Merge merge{};
  };
  std::vector<std::string> token_bytes_;
  std::vector<BytesSlot> bytes_slots_;
  uint64_t bytes_mask_ = 0;
  std::vector<MergeSlot> merge_slots_;
  uint64_t merge_mask_ = 0;
  int32_t byte_id_[256];
  bool whole_piece_lookup_;
};

// Finds special tokens (exact strings) in text: calls on_text(begin, len) for plain stretches and
// on_special(id) for each special token, longest match first at a position.
class SpecialSplitter {
 public:
  explicit SpecialSplitter(const std::vector<std::pair<std::string, int32_t>>& specials);
  bool empty() const { return tokens_.empty(); }
  template <typename T, typename S>
  void split(std::string_view text, T&& on_text, S&& on_special) const;

 private:
  std::vector<std::pair<std::string, int32_t>> tokens_;  // longest first
  // Indices into tokens_ by first byte (longest first): files with thousands of added tokens
  // (Gemma 3: 6,400) test only those that can start at a position.
  std::vector<uint32_t> by_first_byte_[256];
};

template <typename T, typename S>
void SpecialSplitter::split(std::string_view text, T&& on_text, S&& on_special) const {
  size_t plain = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    for (uint32_t k : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const auto& [tok, id] = tokens_[k];
      if (text.compare(i, tok.size(), tok) == 0) {
        if (i > plain) on_text(plain, i - plain);
        on_special(id);
        i += tok.size() - 1;
        plain = i + 1;
        break;
      }
    }
  }
  if (plain < text.size()) on_text(plain, text.size() - plain);
}

}  // namespace primus::data
