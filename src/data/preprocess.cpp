#include "data/preprocess.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/indexed_dataset.h"

namespace primus::data {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A fixed set of threads, so --workers N means N cores of tokenization.
class WorkerPool {
 public:
  explicit WorkerPool(int n) {
    for (int i = 0; i < n; ++i)
      threads_.emplace_back([this] {
        for (;;) {
          std::function<void()> job;
          {
            std::unique_lock lk(mu_);
            cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
            if (jobs_.empty()) return;
            job = std::move(jobs_.front());
            jobs_.pop_front();
          }
          job();
        }
      });
  }
  ~WorkerPool() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  template <typename F>
  auto submit(F f) -> std::future<decltype(f())> {
    auto task = std::make_shared<std::packaged_task<decltype(f())()>>(std::move(f));
    auto fut = task->get_future();
    {
      std::lock_guard lk(mu_);
      jobs_.emplace_back([task] { (*task)(); });
    }
    cv_.notify_one();
    return fut;
  }

 private:
  std::vector<std::thread> threads_;
  std::deque<std::function<void()>> jobs_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

struct Batch {
  std::string text;  // whole lines, each ending in '\n' (the last one may not at end of input)
  int64_t first_line = 1;
};

struct KeyOut {
  std::vector<int32_t> tokens;
  std::vector<int32_t> seq_lens;   // sequences of all documents, in order
  std::vector<int32_t> doc_nseqs;  // sequences per document
};

struct BatchOut {
  std::vector<KeyOut> keys;
  int64_t lines = 0, docs = 0, skipped = 0, empty = 0, bytes = 0, tokens = 0;
  std::vector<std::string> skipped_msgs;
};

BatchOut process_batch(const Batch& b, const PreprocessOptions& o, const Tokenizer& tok, const std::string& input) {
  BatchOut out;
  out.keys.resize(o.json_keys.size());
  out.bytes = static_cast<int64_t>(b.text.size());
  std::string_view all = b.text;
  int64_t lineno = b.first_line;
  std::vector<std::vector<int32_t>> seqs;
  for (size_t pos = 0; pos < all.size(); ++lineno) {
    size_t end = all.find('\n', pos);
    if (end == std::string_view::npos) end = all.size();
    std::string_view line = all.substr(pos, end - pos);
    pos = end + 1;
    ++out.lines;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) {
      ++out.empty;  // blank lines (a trailing newline, say) carry no document
      continue;
    }
    // Tokenize every key first, so that a bad line adds nothing to any output.
    std::vector<std::vector<std::vector<int32_t>>> per_key;
    try {
      per_key = encode_jsonl_line(line, o.json_keys, tok, o.append_eod);
    } catch (const Error& e) {
      std::string msg = fmt::format("{}:{}: {}", input, lineno, e.what());
      if (!o.skip_bad) fail("{} (use --skip-bad to skip such lines)", msg);
      ++out.skipped;
      if (out.skipped_msgs.size() < 5) out.skipped_msgs.push_back(msg);
      continue;
    }
    ++out.docs;
    for (size_t k = 0; k < per_key.size(); ++k) {
      KeyOut& ko = out.keys[k];
      for (auto& s : per_key[k]) {
        ko.seq_lens.push_back(static_cast<int32_t>(s.size()));
        ko.tokens.insert(ko.tokens.end(), s.begin(), s.end());
        out.tokens += static_cast<int64_t>(s.size());
      }
      ko.doc_nseqs.push_back(static_cast<int32_t>(per_key[k].size()));
    }
  }
  return out;
}

}  // namespace

std::vector<std::vector<std::vector<int32_t>>> encode_jsonl_line(std::string_view line,
                                                                 const std::vector<std::string>& keys,
                                                                 const Tokenizer& tok, bool append_eod) {
  std::vector<std::vector<std::vector<int32_t>>> per_key(keys.size());
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number that overflows
    fail("malformed JSON: {}", e.what());
  }
  if (!j.is_object()) fail("expected a JSON object, got {}", j.type_name());
  for (size_t k = 0; k < keys.size(); ++k) {
    auto it = j.find(keys[k]);
    if (it == j.end()) fail("no key '{}'", keys[k]);
    auto add = [&](const json& v) {
      if (!v.is_string()) fail("key '{}' holds {}, expected a string", keys[k], v.type_name());
      auto ids = tok.encode(v.get_ref<const std::string&>());
      if (!ids.empty()) per_key[k].push_back(std::move(ids));
    };
    if (it->is_array()) {  // a list of sentences, as Megatron's --split-sentences output
      for (const auto& s : *it) add(s);
    } else {
      add(*it);
    }
    if (append_eod && !per_key[k].empty()) per_key[k].back().push_back(tok.eod());
  }
  return per_key;
}

std::string document_prefix(const std::string& output_prefix, const std::string& key) {
  return fmt::format("{}_{}_document", output_prefix, key);
}

PreprocessStats preprocess(const PreprocessOptions& o, const Tokenizer& tok) {
  if (o.json_keys.empty()) fail("--json-keys needs at least one key");
  if (o.output_prefix.empty()) fail("--output-prefix is required");
  if (o.workers < 1) fail("--workers must be at least 1, got {}", o.workers);
  std::FILE* in = o.input == "-" ? stdin : std::fopen(o.input.c_str(), "rb");
  if (!in) fail("cannot open input '{}': {}", o.input, std::strerror(errno));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> in_guard(in == stdin ? nullptr : in, &std::fclose);
  {
    auto parent = std::filesystem::path(o.output_prefix).parent_path();
    std::error_code ec;
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
      fail("output folder '{}' does not exist", parent.string());
  }

  PreprocessStats st;
  TokenDType dtype = optimal_dtype(tok.vocab_size());
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const auto& k : o.json_keys) {
    st.outputs.push_back(document_prefix(o.output_prefix, k));
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(st.outputs.back(), dtype));
  }
  auto t0 = Clock::now();
  auto last_log = t0;
  const bool tty = isatty(STDERR_FILENO);
  auto log = [&](bool final) {
    if (o.log_interval_s <= 0) return;
    auto now = Clock::now();
    if (!final && std::chrono::duration<double>(now - last_log).count() < o.log_interval_s) return;
    last_log = now;
    double s = std::chrono::duration<double>(now - t0).count();
    std::cerr << fmt::format("{}preprocess: {} docs, {:.1f} MB, {} tokens, {:.1f} MB/s{}{}", tty ? "\r" : "",
                             st.documents, st.bytes / 1e6, st.tokens, s > 0 ? st.bytes / 1e6 / s : 0.0,
                             st.skipped ? fmt::format(", {} skipped", st.skipped) : "",
                             tty && !final ? "" : "\n");
  };

  auto write = [&](BatchOut&& r) {
    for (size_t k = 0; k < r.keys.size(); ++k) {
      const KeyOut& ko = r.keys[k];
      size_t tok_at = 0, seq_at = 0;
      for (int32_t nseq : ko.doc_nseqs) {
        for (int32_t s = 0; s < nseq; ++s) {
          int32_t len = ko.seq_lens[seq_at++];
          builders[k]->add_item(std::span<const int32_t>(ko.tokens.data() + tok_at, len));
          tok_at += len;
        }
        builders[k]->end_document();
      }
    }
    for (const auto& m : r.skipped_msgs) std::cerr << "warning: skipped " << m << "\n";
    st.lines += r.lines, st.documents += r.docs, st.skipped += r.skipped, st.empty += r.empty;
    st.bytes += r.bytes, st.tokens += r.tokens;
    log(false);
  };

  try {
    WorkerPool pool(o.workers);
    std::deque<std::future<BatchOut>> inflight;
    std::string carry;
    std::vector<char> buf(o.batch_bytes);
    int64_t next_line = 1;
    bool eof = false;
    while (!eof) {
      Batch b;
      b.first_line = next_line;
      b.text.swap(carry);
      carry.clear();
      // Fill to batch_bytes, then cut after the last newline; a line longer than a batch grows it.
      for (;;) {
        size_t n = std::fread(buf.data(), 1, buf.size(), in);
        if (n == 0) {
          if (std::ferror(in)) fail("cannot read input '{}': {}", o.input, std::strerror(errno));
          eof = true;
          break;
        }
        b.text.append(buf.data(), n);
        if (b.text.size() >= o.batch_bytes && b.text.find('\n', b.text.size() - n) != std::string::npos) break;
      }
      if (!eof) {
        size_t cut = b.text.rfind('\n') + 1;
        carry.assign(b.text, cut, std::string::npos);
        b.text.resize(cut);
      }
      if (b.text.empty()) continue;
      for (char c : b.text) next_line += c == '\n';
      auto shared = std::make_shared<Batch>(std::move(b));
      inflight.push_back(pool.submit([shared, &o, &tok] { return process_batch(*shared, o, tok, o.input); }));
      while (inflight.size() >= static_cast<size_t>(2 * o.workers)) {
        write(inflight.front().get());
        inflight.pop_front();
      }
    }
    while (!inflight.empty()) {
      write(inflight.front().get());
      inflight.pop_front();
    }
    for (auto& b : builders) b->finalize();
  } catch (...) {
    // The builders write temporary files and rename them into place only when finished: closing
    // them removes those, and a dataset already at the output names (maybe in use by a training
    // job) is left as it was.
    builders.clear();
    throw;
  }
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  log(true);
  return st;
}

}  // namespace primus::data
