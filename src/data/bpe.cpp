#include "data/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <queue>

#include "core/error.h"

namespace primus::data {

namespace {

// Unicode White_Space (what Rust's regex means by \s), written as class contents.
constexpr const char* kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string rewrite_whitespace(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        if (in_class) fail("pre-tokenizer regex '{}': \\S inside a character class is not supported", p);
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Per-thread match state: PCRE2 match data and a JIT stack big enough for long whitespace runs.
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(8, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() { pcre2_jit_stack_assign(mc, nullptr, js); }
  ~MatchState() {
    pcre2_jit_stack_free(js);
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
  }
};

MatchState& match_state() {
  thread_local MatchState s;
  return s;
}

}  // namespace

PretokenRegex::PretokenRegex(const std::string& pattern) : pattern_(pattern) {
  std::string p = rewrite_whitespace(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP,
                                   &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("pre-tokenizer regex does not compile at offset {}: {} (pattern: {})", off,
         reinterpret_cast<const char*>(msg), pattern);
  }
  // JIT makes matching several times faster; without it (unsupported CPU) the interpreter still works.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

PretokenRegex::~PretokenRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool PretokenRegex::next(std::string_view text, size_t start, size_t& ms, size_t& me) const {
  MatchState& st = match_state();
  int rc = pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                       start, PCRE2_NO_UTF_CHECK, st.md, st.mc);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    fail("pre-tokenizer regex failed at byte {}: {}", start, reinterpret_cast<const char*>(msg));
  }
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
  ms = ov[0];
  me = ov[1];
  return true;
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string known_tiktoken_pattern(const std::string& name) {
  // OpenAI's encodings (tiktoken_ext/openai_public.py) and Megatron's TikTokenizer v1/v2 patterns.
  if (name == "cl100k_base")
    return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (name == "o200k_base")
    return R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (name == "gpt2" || name == "r50k_base" || name == "p50k_base")
    return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  if (name == "v1") return R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
  if (name == "v2")
    return R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  return "";
}

namespace {
uint64_t table_size(size_t n) {  // a power of two at most half full
  uint64_t c = 16;
  while (c < 2 * n) c <<= 1;
  return c;
}
}  // namespace

BytePairEncoder::BytePairEncoder(std::vector<std::string> token_bytes, const std::vector<MergeRule>& merges,
                                 bool whole_piece_lookup)
    : token_bytes_(std::move(token_bytes)), whole_piece_lookup_(whole_piece_lookup) {
  bytes_slots_.resize(table_size(token_bytes_.size()));
  bytes_mask_ = bytes_slots_.size() - 1;
  for (size_t id = 0; id < token_bytes_.size(); ++id) {
    const std::string& t = token_bytes_[id];
    if (t.empty() || find_bytes(t) >= 0) continue;  // the first id of duplicate bytes wins
    uint64_t h = hash_bytes(t), i = h & bytes_mask_;
    while (bytes_slots_[i].id >= 0) i = (i + 1) & bytes_mask_;
    BytesSlot& s = bytes_slots_[i];
    s.hash = h, s.id = static_cast<int32_t>(id), s.len = static_cast<uint32_t>(t.size());
    std::memcpy(s.head, t.data(), std::min<size_t>(t.size(), sizeof s.head));
  }
  for (int b = 0; b < 256; ++b) {
    char c = static_cast<char>(b);
    byte_id_[b] = find_bytes(std::string_view(&c, 1));
  }
  merge_slots_.resize(table_size(merges.size()));
  merge_mask_ = merge_slots_.size() - 1;
  for (const auto& m : merges) {
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(m.left)) << 32) | static_cast<uint32_t>(m.right);
    uint64_t i = mix(key) & merge_mask_;
    while (merge_slots_[i].key != kEmptyKey && merge_slots_[i].key != key) i = (i + 1) & merge_mask_;
    if (merge_slots_[i].key == key) continue;  // the first (highest-priority) rule for a pair wins
    merge_slots_[i] = {key, Merge{m.rank, m.merged}};
  }
}

int32_t BytePairEncoder::find_bytes(std::string_view s) const {
  uint64_t h = hash_bytes(s);
  for (uint64_t i = h & bytes_mask_;; i = (i + 1) & bytes_mask_) {
    const BytesSlot& slot = bytes_slots_[i];
    if (slot.id < 0) return -1;
    if (slot.hash == h && slot.len == s.size() &&
        std::memcmp(slot.head, s.data(), std::min<size_t>(s.size(), sizeof slot.head)) == 0 &&
        (s.size() <= sizeof slot.head || std::string_view(token_bytes_[slot.id]) == s))
      return slot.id;
  }
}

std::unique_ptr<BytePairEncoder> BytePairEncoder::from_ranks(const std::vector<std::string>& bytes_by_rank,
                                                             int32_t id_offset, int32_t total_ids) {
  std::vector<std::string> token_bytes(total_ids);
  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(bytes_by_rank.size());
  for (size_t r = 0; r < bytes_by_rank.size(); ++r) {
    token_bytes[r + id_offset] = bytes_by_rank[r];
    rank_of.emplace(bytes_by_rank[r], static_cast<int32_t>(r));
  }
  std::vector<MergeRule> merges;
  for (size_t r = 0; r < bytes_by_rank.size(); ++r) {
    std::string_view t = bytes_by_rank[r];
    for (size_t k = 1; k < t.size(); ++k) {
      auto a = rank_of.find(t.substr(0, k)), b = rank_of.find(t.substr(k));
      if (a != rank_of.end() && b != rank_of.end())
        merges.push_back({a->second + id_offset, b->second + id_offset, static_cast<int32_t>(r) + id_offset,
                          static_cast<uint32_t>(r)});
    }
  }
  return std::make_unique<BytePairEncoder>(std::move(token_bytes), merges, /*whole_piece_lookup=*/true);
}

int32_t BytePairEncoder::id_of(std::string_view bytes) const {
  return find_bytes(bytes);
}

void BytePairEncoder::merge_small(std::vector<int32_t>& sym) const {
  // tiktoken's approach: short pieces dominate, and a rescan of a few ranks beats any heap.
  constexpr uint32_t kNone = UINT32_MAX;
  thread_local std::vector<uint32_t> rank;
  thread_local std::vector<int32_t> merged;
  size_t n = sym.size();
  rank.assign(n, kNone);
  merged.assign(n, -1);
  auto set = [&](size_t i) {
    const Merge* m = i + 1 < n ? find_merge(sym[i], sym[i + 1]) : nullptr;
    rank[i] = m ? m->rank : kNone;
    merged[i] = m ? m->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) set(i);
  while (n > 1) {
    size_t best = 0;
    uint32_t best_rank = kNone;
    for (size_t i = 0; i + 1 < n; ++i)
      if (rank[i] < best_rank) best_rank = rank[i], best = i;
    if (best_rank == kNone) break;
    sym[best] = merged[best];
    sym.erase(sym.begin() + best + 1);
    rank.erase(rank.begin() + best + 1);
    merged.erase(merged.begin() + best + 1);
    --n;
    set(best);
    if (best > 0) set(best - 1);
  }
}

void BytePairEncoder::merge_large(std::vector<int32_t>& sym) const {
  // Long pieces (whitespace runs, long symbol strings): a heap ordered by (rank, position) over a
  // linked list gives the same merges as the rescan in O(n log n).
  struct Cand {
    uint32_t rank;
    uint32_t pos, right;
    int32_t left_id, right_id, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  size_t n = sym.size();
  std::vector<uint32_t> next(n), prev(n);
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i) next[i] = static_cast<uint32_t>(i + 1), prev[i] = static_cast<uint32_t>(i - 1);
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](uint32_t i) {
    if (i >= n || next[i] >= n) return;
    uint32_t j = next[i];
    if (const Merge* m = find_merge(sym[i], sym[j])) heap.push({m->rank, i, j, sym[i], sym[j], m->id});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || !alive[c.right] || next[c.pos] != c.right || sym[c.pos] != c.left_id ||
        sym[c.right] != c.right_id)
      continue;  // stale: one side was merged since this candidate was pushed
    sym[c.pos] = c.merged;
    alive[c.right] = 0;
    next[c.pos] = next[c.right];
    if (next[c.pos] < n) prev[next[c.pos]] = c.pos;
    push(c.pos);
    if (c.pos > 0) push(prev[c.pos]);
  }
  size_t w = 0;
  for (size_t i = 0; i < n; i = next[i]) sym[w++] = sym[i];
  sym.resize(w);
}

void BytePairEncoder::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (whole_piece_lookup_ || piece.size() == 1) {
    int32_t id = find_bytes(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  thread_local std::vector<int32_t> sym;
  sym.resize(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    int32_t id = byte_id_[static_cast<unsigned char>(piece[i])];
    if (id < 0) fail("byte 0x{:02x} has no token in this BPE vocabulary", static_cast<unsigned char>(piece[i]));
    sym[i] = id;
  }
  merge(sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

void BytePairEncoder::encode_chars(std::string_view piece, const CharFallback& fb, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  thread_local std::vector<int32_t> sym;
  sym.clear();
  bool last_unk = false;
  for (size_t i = 0; i < piece.size();) {
    const unsigned char c = piece[i];
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
    n = std::min(n, piece.size() - i);
    const std::string_view ch = piece.substr(i, n);
    i += n;
    if (int32_t id = find_bytes(ch); id >= 0) {
      sym.push_back(id);
      last_unk = false;
      continue;
    }
    if (fb.byte_fallback) {
      int32_t ids[4];
      bool all = true;
      for (size_t k = 0; k < n && all; ++k) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(ch[k]));
        ids[k] = find_bytes(name);
        all = ids[k] >= 0;
      }
      if (all) {
        sym.insert(sym.end(), ids, ids + n);
        last_unk = false;
        continue;
      }
    }
    if (fb.unk < 0) fail("character '{}' is not in the vocabulary, which has no unknown token", ch);
    if (!(fb.fuse_unk && last_unk)) sym.push_back(fb.unk);
    last_unk = true;
  }
  merge(sym);
  out.insert(out.end(), sym.begin(), sym.end());
}

SpecialSplitter::SpecialSplitter(const std::vector<std::pair<std::string, int32_t>>& specials) {
  for (const auto& s : specials)
    if (!s.first.empty()) tokens_.push_back(s);
  std::stable_sort(tokens_.begin(), tokens_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (size_t k = 0; k < tokens_.size(); ++k)
    by_first_byte_[static_cast<unsigned char>(tokens_[k].first[0])].push_back(static_cast<uint32_t>(k));
}

}  // namespace primus::data
