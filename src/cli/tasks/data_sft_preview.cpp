// data sft-preview: what SFT will train on. For each record of a chat data set: the text its
// conversation format renders, the token ids and the loss mask (1: the loss takes that token as a
// target), as `train posttrain` builds them (data/sft_format.h).
#include <algorithm>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/registry.h"
#include "config/choices.h"
#include "core/error.h"
#include "data/sft_chat_template.h"
#include "data/sft_dataset.h"
#include "data/tokenizer.h"

namespace primus::cli {
namespace data_sft_preview_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct Args {
  std::string input, split = "train", format = "alpaca";
  data::TokenizerOptions tok{"HuggingFaceTokenizer", ""};
  int64_t limit = 3;
};

int preview(const Args& a) {
  const auto format_name = config::find_choice<data::ChatFormatName>(a.format);
  if (!format_name) fail("--format: {}", config::not_a_choice<data::ChatFormatName>("format", a.format));
  const auto tokenizer = data::build_tokenizer(a.tok);
  const auto format = data::chat_format(*format_name, a.tok.model);
  const data::SftRecords records = data::read_sft_records(a.input, a.split);
  const size_t n = std::min<size_t>(records.records.size(), size_t(std::max<int64_t>(a.limit, 0)));
  for (size_t i = 0; i < n; ++i) {
    const data::SftTokens t = data::sft_sample(records.records[i], records.where[i], *format, *tokenizer);
    const data::ChatText text = format->render(data::sft_record_from_json(records.records[i], records.where[i]));
    const auto trained = std::count(t.mask.begin(), t.mask.end(), uint8_t(1));
    std::cout << fmt::format("[{}] {}: {} tokens, {} trained\n", i, records.where[i], t.ids.size(), trained)
              << "text:\n"
              << text.text << (text.end_with_eos ? "<eos>" : "") << "\n"
              << fmt::format("input_ids: {}\nloss_mask: {}\n\n", fmt::join(t.ids, " "), fmt::join(t.mask, " "));
  }
  std::cout << fmt::format("{} of {} records of {} shown ({} format)\n", n, records.records.size(), a.input,
                           config::choice_name(*format_name));
  return 0;
}

TaskRegistrar reg{{"data", "sft-preview",
                   "print what SFT trains on: each record's rendered text, input_ids and loss_mask (--input FILE)",
                   [](CLI::App& app) -> TaskAction {
                     auto a = std::make_shared<Args>();
                     app.add_option("--input", a->input, "a local JSONL or JSON chat data set")->required();
                     app.add_option("--format", a->format,
                                    "conversation format: alpaca | chatml | openai | messages | squad | chat_template (the "
                                    "--tokenizer-model folder's tokenizer_config.json)")
                         ->capture_default_str();
                     app.add_option("--split", a->split, "the split of a JSON object of splits")->capture_default_str();
                     app.add_option("--limit", a->limit, "records to print")->capture_default_str();
                     app.add_option("--tokenizer-model", a->tok.model,
                                    "the tokenizer: a Hugging Face folder or tokenizer.json, or the file of "
                                    "--tokenizer-type");
                     app.add_option("--tokenizer-type", a->tok.type, "Megatron tokenizer type")->capture_default_str();
                     return [a]() { return preview(*a); };
                   }}};

}  // namespace
}  // namespace primus::cli
