// data inspect: what an indexed dataset holds (header fields, counts) and, with a tokenizer, its text.
#include <algorithm>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "cli/registry.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"

namespace primus::cli {
namespace data_inspect_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct Args {
  std::string prefix;
  data::TokenizerOptions tok;
  int64_t show = 3;
  int64_t max_tokens = 64;
};

TaskRegistrar reg{{"data", "inspect", "summarize a Megatron .bin/.idx dataset (--prefix P)",
                   [](CLI::App& app) -> TaskAction {
                     auto a = std::make_shared<Args>();
                     app.add_option("--prefix", a->prefix, "dataset prefix (P for P.bin and P.idx)")->required();
                     app.add_option("--show", a->show, "sequences to print")->capture_default_str();
                     app.add_option("--max-tokens", a->max_tokens, "tokens to print per sequence")
                         ->capture_default_str();
                     app.add_option("--tokenizer-type", a->tok.type, "decode the printed tokens with this tokenizer");
                     app.add_option("--tokenizer-model", a->tok.model, "tokenizer file");
                     app.add_option("--tiktoken-pattern", a->tok.tiktoken_pattern, "TikTokenizer pattern");
                     app.add_option("--vocab-size", a->tok.vocab_size, "NullTokenizer vocabulary size");
                     return [a]() {
                       data::IndexedDataset ds(a->prefix);
                       auto lens = ds.sequence_lengths();
                       int64_t mx = 0, mn = lens.empty() ? 0 : INT64_MAX;
                       for (int32_t l : lens) mx = std::max<int64_t>(mx, l), mn = std::min<int64_t>(mn, l);
                       std::cout << fmt::format(
                           "{}: MMIDIDX version 1, dtype {} (code {}), {} sequences, {} documents, {} tokens\n"
                           "sequence length: min {}, mean {:.1f}, max {}\n",
                           a->prefix, data::dtype_name(ds.dtype()), static_cast<int>(ds.dtype()), ds.num_sequences(),
                           ds.num_documents(), ds.num_tokens(), mn,
                           lens.empty() ? 0.0 : static_cast<double>(ds.num_tokens()) / lens.size(), mx);
                       std::unique_ptr<data::Tokenizer> tok;
                       if (!a->tok.type.empty()) tok = data::build_tokenizer(a->tok);
                       for (int64_t i = 0; i < std::min<int64_t>(a->show, ds.num_sequences()); ++i) {
                         auto t = ds.get(i, 0, std::min<int64_t>(a->max_tokens, lens[i]));
                         std::cout << fmt::format("[{}] {} tokens: {}{}\n", i, lens[i], fmt::join(t, " "),
                                                  lens[i] > a->max_tokens ? " ..." : "");
                         if (tok) std::cout << "    " << tok->decode(t) << "\n";
                       }
                       return 0;
                     };
                   }}};

}  // namespace
}  // namespace primus::cli
