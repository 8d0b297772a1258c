// Chat templates rendered as Hugging Face's `tokenizer.apply_chat_template(..., tokenize=False)`
// renders them: the Jinja `chat_template` of a model's tokenizer_config.json, interpreted by our own
// Jinja interpreter (src/data/jinja_*) for the subset of the language real chat templates use, in
// Hugging Face's environment (trim_blocks, lstrip_blocks, loop controls, a tojson filter that is
// json.dumps with ensure_ascii=False, raise_exception, strftime_now, the {% generation %} tag).
// docs/chat_templates.md lists what is supported and what is refused.
//
//   ChatTemplate t(read_chat_template("models/Qwen3-8B"));   // parsed once; errors name line:column
//   ChatRenderInput in;
//   in.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
//   in.add_generation_prompt = true;
//   Rendered r = t.render(in);    // r.text; r.generation_spans for {% generation %} blocks
//
// A template is data a user hands us: rendering is bounded (output size, steps, call depth, nesting)
// and every failure is a primus::Error naming the template's line and column, never a crash.
// ChatTemplate is immutable after construction; render() may run on many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace primus::data {

struct ChatTemplateLimits {
  size_t max_output_bytes = size_t(64) << 20;  // the rendered text; also any one string or list built
  int64_t max_steps = 10'000'000;              // statements run, loop iterations and calls, per render
  int max_call_depth = 64;                     // macros calling macros
};

// The variables apply_chat_template passes to the template.
struct ChatRenderInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role": ..., "content": ...}, ...]
  std::string bos_token;                                              // passed when not empty
  std::string eos_token;                                              // passed when not empty
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools;  // a list of tool schemas, or null (the template sees None, as in HF)
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables: enable_thinking, ...
};

struct Rendered {
  std::string text;
  // [begin, end) byte offsets into `text` of each {% generation %} block, in render order (Hugging
  // Face reports the same spans in characters; the assistant mask is built from them).
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

class ChatTemplate {
 public:
  explicit ChatTemplate(const std::string& source, ChatTemplateLimits limits = {});
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  Rendered render(const ChatRenderInput& input) const;
  // Every variable given in one JSON object (messages, add_generation_prompt, bos_token, ...).
  Rendered render(const nlohmann::ordered_json& variables) const;

  // Whether the template marks assistant turns with {% generation %} (else a loss mask must be
  // found from the turn boundaries).
  bool has_generation_blocks() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The `chat_template` of a parsed tokenizer_config.json: the string, or from the list form
// [{"name": ..., "template": ...}] the one called `name` ("default" unless asked otherwise).
// `what` names the file in errors.
std::string chat_template_from_config(const nlohmann::json& config, const std::string& what,
                                      const std::string& name = "default");

// Reads the chat template of a tokenizer_config.json file, or of the one in a model folder; a
// chat_template.jinja beside it (newer Hugging Face layouts) wins over the config's entry, as in
// transformers.
std::string read_chat_template(const std::filesystem::path& config_or_folder, const std::string& name = "default");

}  // namespace primus::data
