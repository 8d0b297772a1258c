#include "data/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/bounded_json.h"
#include "core/error.h"
#include "data/jinja_eval.h"
#include "data/jinja_lexer.h"
#include "data/jinja_parser.h"

namespace primus::data {

namespace {

constexpr uint64_t kMaxTemplateBytes = uint64_t(1) << 20;  // real templates are a few KiB

bool uses_generation(const jinja::Body& body) {
  for (const jinja::StmtPtr& s : body) {
    if (s->kind == jinja::StmtKind::Generation) return true;
    for (const jinja::Body& b : s->bodies)
      if (uses_generation(b)) return true;
    if (uses_generation(s->else_body)) return true;
  }
  return false;
}

}  // namespace

struct ChatTemplate::Impl {
  std::string source;  // normalized
  jinja::Body body;
  ChatTemplateLimits limits;
  bool generation = false;
};

ChatTemplate::ChatTemplate(const std::string& source, ChatTemplateLimits limits) : impl_(std::make_unique<Impl>()) {
  if (source.size() > kMaxTemplateBytes)
    fail("chat template: {} bytes, more than the {} a chat template may have", source.size(), kMaxTemplateBytes);
  try {
    jinja::utf8_to_u32(source);
  } catch (const Error& e) {
    fail("chat template: {}", e.what());
  }
  impl_->source = jinja::normalize_source(source);
  impl_->body = jinja::parse_template(impl_->source);
  impl_->limits = limits;
  impl_->generation = uses_generation(impl_->body);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

bool ChatTemplate::has_generation_blocks() const { return impl_->generation; }

Rendered ChatTemplate::render(const ChatRenderInput& input) const {
  if (!input.messages.is_array()) fail("chat template input: messages must be a JSON array");
  if (!input.extra.is_object()) fail("chat template input: extra variables must be a JSON object");
  // What apply_chat_template passes: the conversation, tools and documents (None when not given),
  // add_generation_prompt, the special tokens, then the caller's own variables.
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = input.messages;
  vars["tools"] = input.tools;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = input.add_generation_prompt;
  if (!input.bos_token.empty()) vars["bos_token"] = input.bos_token;
  if (!input.eos_token.empty()) vars["eos_token"] = input.eos_token;
  for (auto it = input.extra.begin(); it != input.extra.end(); ++it) vars[it.key()] = it.value();
  return render(vars);
}

Rendered ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object()) fail("chat template input: the variables must be a JSON object");
  return jinja::evaluate(impl_->source, impl_->body, jinja::from_json(variables), impl_->limits);
}

std::string chat_template_from_config(const nlohmann::json& config, const std::string& what, const std::string& name) {
  if (!config.is_object() || !config.contains("chat_template"))
    fail("{} has no chat_template (the model's tokenizer_config.json carries it)", what);
  const nlohmann::json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (!t.is_array()) fail("{}: chat_template must be a string or a list of {{name, template}}", what);
  std::string names;
  for (const nlohmann::json& entry : t) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
        !entry["template"].is_string())
      fail("{}: each entry of the chat_template list must have a string name and template", what);
    if (entry["name"] == name) return entry["template"].get<std::string>();
    names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
  }
  fail("{}: no chat template named '{}' (it has: {})", what, name, names);
}

std::string read_chat_template(const std::filesystem::path& config_or_folder, const std::string& name) {
  namespace fs = std::filesystem;
  fs::path config = config_or_folder;
  if (fs::is_directory(config_or_folder)) {
    const fs::path jinja_file = config_or_folder / "chat_template.jinja";
    if (name == "default" && fs::is_regular_file(jinja_file)) {
      if (fs::file_size(jinja_file) > kMaxTemplateBytes)
        fail("chat template file '{}' is larger than {} bytes", jinja_file.string(), kMaxTemplateBytes);
      std::ifstream in(jinja_file, std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      if (!in) fail("cannot read the chat template file '{}'", jinja_file.string());
      return text.str();
    }
    config = config_or_folder / "tokenizer_config.json";
  }
  const std::string what = fmt::format("tokenizer config '{}'", config.string());
  return chat_template_from_config(read_json_file(config, what), what, name);
}

}  // namespace primus::data
