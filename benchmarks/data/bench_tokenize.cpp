// Tokenizer throughput alone (no JSON, no I/O): encode() over every text of a JSONL file, one thread.
//   bench_tokenize --input F.jsonl --tokenizer-type TikTokenizer --tokenizer-model cl100k_base.tiktoken
#include <chrono>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app{"encode() throughput of a tokenizer on a JSONL file"};
  std::string input, key = "text";
  int repeat = 1;
  primus::data::TokenizerOptions o;
  app.add_option("--input", input, "JSONL file")->required();
  app.add_option("--json-key", key, "key holding the text")->capture_default_str();
  app.add_option("--tokenizer-type", o.type)->required();
  app.add_option("--tokenizer-model", o.model);
  app.add_option("--tiktoken-pattern", o.tiktoken_pattern);
  app.add_option("--repeat", repeat, "passes over the texts")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    auto tok = primus::data::build_tokenizer(o);
    std::ifstream f(input);
    if (!f) primus::fail("cannot open '{}'", input);
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (std::string line; std::getline(f, line);) {
      if (line.empty()) continue;
      texts.push_back(nlohmann::json::parse(line).at(key).get<std::string>());
      bytes += texts.back().size();
    }
    size_t tokens = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeat; ++r)
      for (const auto& t : texts) tokens += tok->encode(t).size();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << fmt::format("{} texts, {:.1f} MB, {} tokens in {:.3f} s: {:.2f} MB/s, {:.0f} tokens/s\n",
                             texts.size(), bytes * repeat / 1e6, tokens, s, bytes * repeat / 1e6 / s, tokens / s);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
