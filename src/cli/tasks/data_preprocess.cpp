// data preprocess: JSONL -> Megatron .bin/.idx, with Megatron's tools/preprocess_data.py flag names.
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "cli/registry.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"

namespace primus::cli {
namespace data_preprocess_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct Args {
  data::PreprocessOptions pre;
  data::TokenizerOptions tok;
  double log_interval = 1.0;
};

TaskRegistrar reg{{"data", "preprocess", "tokenize JSONL into Megatron .bin/.idx (--input --output-prefix ...)",
                   [](CLI::App& app) -> TaskAction {
                     auto a = std::make_shared<Args>();
                     app.add_option("--input", a->pre.input, "JSONL file, one JSON object per line ('-' = stdin)")
                         ->required();
                     app.add_option("--json-keys", a->pre.json_keys, "keys to tokenize; one output per key")
                         ->capture_default_str();
                     app.add_option("--output-prefix", a->pre.output_prefix,
                                    "writes <prefix>_<key>_document.bin/.idx")
                         ->required();
                     app.add_option("--tokenizer-type", a->tok.type,
                                    fmt::format("one of: {}", fmt::join(data::tokenizer_types(), ", ")))
                         ->required();
                     app.add_option("--tokenizer-model", a->tok.model,
                                    "tokenizer file: tokenizer.json, .tiktoken, SentencePiece .model");
                     app.add_option("--vocab-size", a->tok.vocab_size, "NullTokenizer / TikTokenizer vocabulary size");
                     app.add_option("--tiktoken-pattern", a->tok.tiktoken_pattern,
                                    "cl100k_base, o200k_base, gpt2, v1, v2 or a regex");
                     app.add_option("--tiktoken-num-special-tokens", a->tok.tiktoken_num_special_tokens,
                                    "Megatron-layout TikTokenizer: ids reserved for special tokens")
                         ->capture_default_str();
                     app.add_flag("--append-eod", a->pre.append_eod, "append the end-of-document token");
                     app.add_option("--workers", a->pre.workers, "tokenizer threads")->capture_default_str();
                     app.add_flag("--skip-bad", a->pre.skip_bad, "skip (and count) malformed lines");
                     app.add_option("--log-interval", a->log_interval, "seconds between progress lines; 0 = quiet")
                         ->capture_default_str();
                     return [a]() {
                       a->pre.log_interval_s = a->log_interval;
                       auto tok = data::build_tokenizer(a->tok);
                       auto st = data::preprocess(a->pre, *tok);
                       for (const auto& p : st.outputs) std::cout << "wrote " << p << ".bin/.idx\n";
                       std::cout << fmt::format(
                           "{} documents, {} tokens, {:.1f} MB in {:.2f} s ({:.1f} MB/s, {:.0f} tokens/s); "
                           "{} lines skipped, {} blank\n",
                           st.documents, st.tokens, st.bytes / 1e6, st.seconds,
                           st.seconds > 0 ? st.bytes / 1e6 / st.seconds : 0.0,
                           st.seconds > 0 ? st.tokens / st.seconds : 0.0, st.skipped, st.empty);
                       return 0;
                     };
                   }}};

}  // namespace
}  // namespace primus::cli
