#include "hf/hf_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/model_fit.h"
#include "config/lora.h"
#include "core/bounded_json.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "hf/dequant.h"
#include "hf/gpt_oss_experts.h"
#include "hf/hf_families.h"
#include "hf/safetensors.h"
#include "model/linears.h"  // lora_adapter_layout
#include "model/param_store.h"
#include "plan/memory_estimate.h"
#include "safe/disk.h"

namespace primus::hf {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Every tensor of the model: ours and the Hugging Face tensors it is made of (hf_families.h), their
// names under `prefix` (a multimodal folder's text model: hf_families.h Multimodal).
std::vector<Mapping> name_map(const ModelSpec& s, Family family = Family::Llama, const std::string& prefix = "") {
  std::vector<Mapping> m;
  m.push_back({"embedding.word_embeddings.weight", {"model.embed_tokens.weight"}, {}, {}});
  for (int64_t l = 0; l < s.num_layers; ++l) layer_mappings(s, family, l, m);
  m.push_back({"decoder.final_layernorm.weight", {"model.norm.weight"}, {}, {}});
  if (s.untie_embeddings_and_output_weights) m.push_back({"output_layer.weight", {"lm_head.weight"}, {}, {}});
  mtp_mappings(s, family, m);  // DeepSeek-V3's multi-token prediction (export refuses it for other families)
  for (Mapping& x : m)
    for (std::string& t : x.theirs) t = prefix + t;
  return m;
}

// Where a folder of `a` keeps its text model's tensors: "" but in a multimodal folder.
std::string text_prefix(const Architecture& a) { return a.multimodal ? a.multimodal->weight_prefix : ""; }

// A ParamStore holding the whole model's values (no gradients: nothing is trained here) in the
// order of model_parameter_layout (as LlamaModel's).
// The whole model's tensors, and `extra` ones (LoRA adapters) after them.
std::unique_ptr<ParamStore> whole_model_store(const ModelSpec& spec,
                                              const std::vector<std::pair<std::string, Shape>>& extra = {}) {
  auto store = std::make_unique<ParamStore>();
  for (const ParamInfo& p : model_parameter_layout(spec))
    store->add(p.name, p.shape, p.shape.size() == 1 ? ParamInit::Ones : ParamInit::Normal, p.weight_decay);
  for (const auto& [name, shape] : extra) store->add(name, shape, ParamInit::Zeros, true);
  store->allocate_values();
  return store;
}

template <typename T>
T get(const json& c, const char* key, const std::string& where) {
  if (!c.contains(key) || c[key].is_null()) fail("{}: '{}' is missing", where, key);
  try {
    return c[key].get<T>();
  } catch (const json::exception&) {
    fail("{}: '{}' has the wrong type: {}", where, key, c[key].dump());
  }
}

// config.json files are a few kilobytes.
json read_json(const fs::path& p, const char* what) {
  JsonLimits limits;
  limits.max_bytes = uint64_t(16) << 20;
  return read_json_file(p, fmt::format("{} '{}'", what, p.string()), limits);
}

}  // namespace

namespace {

// Llama 3.1's rope scaling, and a sliding window (Mistral, Qwen): sliding-window attention equals
// full causal attention for sequences no longer than the window, so the model's length is capped
// there rather than compute something else beyond it. DeepSeek's YaRN: read_family_config.
void read_rope_and_window(const json& c, const Architecture& a, const std::string& where, ModelSpec& s) {
  // DeepSeek's and gpt-oss's YaRN, gpt-oss's windows by layer: read_family_config.
  if (a.family == Family::DeepseekV2 || a.family == Family::DeepseekV3 || a.family == Family::GptOss) return;
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) {
    const json& r = c["rope_scaling"];
    const std::string type = r.value("rope_type", r.value("type", ""));
    if (type == "default") {
    } else if (type == "llama3") {
      s.use_rope_scaling = true;
      s.rope_scaling_factor = get<double>(r, "factor", where + " rope_scaling");
      s.rope_low_freq_factor = get<double>(r, "low_freq_factor", where + " rope_scaling");
      s.rope_high_freq_factor = get<double>(r, "high_freq_factor", where + " rope_scaling");
      s.rope_original_max_position_embeddings = get<int64_t>(r, "original_max_position_embeddings",
                                                             where + " rope_scaling");
    } else {
      fail("{}: rope_scaling type '{}' is not supported (llama3 only)", where, type);
    }
  }
  const bool qwen = a.family == Family::Qwen2 || a.family == Family::Qwen3 || a.family == Family::Qwen2Moe ||
                    a.family == Family::Qwen3Moe;
  const bool sliding = qwen ? c.value("use_sliding_window", false)
                            : c.contains("sliding_window") && !c["sliding_window"].is_null();
  if (sliding && c.contains("sliding_window") && c["sliding_window"].is_number_integer()) {
    const int64_t w = c["sliding_window"].get<int64_t>();
    if (w < s.max_position_embeddings) {
      log::warn("{}: sliding-window attention (window {}) is not implemented; max_position_embeddings is capped from "
                "{} to {}, where it equals full attention",
                where, w, s.max_position_embeddings, w);
      s.max_position_embeddings = w;
    }
  }
}

// A quantized checkpoint: DeepSeek-V3's fp8 128 x 128 blocks are dequantized on import (dequant.h);
// any other quantization is refused by name.
void check_quantization(const json& c, const std::string& where) {
  if (!c.contains("quantization_config") || c["quantization_config"].is_null()) return;
  const json& q = c["quantization_config"];
  const std::string method = q.value("quant_method", "");
  const json block = q.value("weight_block_size", json());
  if (method == "fp8" && q.value("fmt", "e4m3") == "e4m3" && block == json({128, 128})) return;
  if (method == "mxfp4") return;  // gpt-oss's experts (gpt_oss_experts.h)
  fail("{}: quantization_config {} is not supported (fp8 e4m3 in 128x128 blocks as DeepSeek-V3's, mxfp4 as "
       "gpt-oss's)",
       where, q.dump());
}

// A multimodal folder's config (hf_families.h Multimodal): its text_config read as the config.json
// of the text architecture, which it names when it names one (Meta's names none); the folder's
// quantization_config is checked too. The other towers' configs (vision_config) are not read.
ModelSpec multimodal_text_spec(const json& c, const Architecture& a, const std::string& where) {
  const Multimodal& m = *a.multimodal;
  if (!c.contains("text_config") || c["text_config"].is_null())
    fail("{}: 'text_config' is missing ({} keeps its text model's config, a {} config, there)", where, a.name,
         m.text_architecture);
  if (!c["text_config"].is_object())
    fail("{}: 'text_config' is {}, not an object (the text model's {} config)", where, c["text_config"].type_name(),
         m.text_architecture);
  json text = c["text_config"];
  const std::string tw = where + " text_config";
  const json named = json::array({m.text_architecture});
  if (text.contains("architectures") && !text["architectures"].is_null() && text["architectures"] != named)
    fail("{}: architectures {} is not {}'s text model {}", tw, text["architectures"].dump(), a.name, named.dump());
  text["architectures"] = named;
  check_quantization(c, where);
  ModelSpec s = spec_from_hf_config(text, tw, nullptr);  // the text model's reader, model_type check included
  s.name = where;
  return s;
}

}  // namespace

ModelSpec spec_from_hf_config(const json& c, const std::string& where, std::string* architecture) {
  const std::string name = c.contains("architectures") && c["architectures"].is_array() &&
                                   !c["architectures"].empty() && c["architectures"][0].is_string()
                               ? c["architectures"][0].get<std::string>()
                               : "";
  const Architecture& a = architecture_named(name, where);
  if (architecture) *architecture = a.name;
  if (c.contains("model_type") && c["model_type"].is_string() && c["model_type"].get<std::string>() != a.model_type)
    fail("{}: model_type '{}' is not {}'s ('{}')", where, c["model_type"].get<std::string>(), a.name, a.model_type);
  if (a.multimodal) return multimodal_text_spec(c, a, where);
  const std::string act = c.value("hidden_act", "silu");
  if (act != "silu") fail("{}: hidden_act '{}' is not supported (silu: SwiGLU)", where, act);
  if (c.value("attention_bias", false) && a.family != Family::GptOss)
    fail("{}: attention_bias true (biases on q, k, v and o_proj) is not supported; QKV biases alone are Qwen2's", where);
  if (c.value("mlp_bias", false)) fail("{}: mlp_bias true is not supported", where);
  check_quantization(c, where);

  ModelSpec s;
  s.name = where;
  s.num_layers = get<int64_t>(c, "num_hidden_layers", where);
  s.hidden_size = get<int64_t>(c, "hidden_size", where);
  s.ffn_hidden_size = get<int64_t>(c, "intermediate_size", where);
  s.num_attention_heads = get<int64_t>(c, "num_attention_heads", where);
  s.num_query_groups = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                           ? get<int64_t>(c, "num_key_value_heads", where)
                           : s.num_attention_heads;
  if (c.contains("head_dim") && !c["head_dim"].is_null()) {
    const int64_t hd = get<int64_t>(c, "head_dim", where);
    if (hd * s.num_attention_heads != s.hidden_size) s.kv_channels = hd;
  }
  s.vocab_size = get<int64_t>(c, "vocab_size", where);
  s.max_position_embeddings = get<int64_t>(c, "max_position_embeddings", where);
  s.norm_epsilon = c.contains("rms_norm_eps") ? get<double>(c, "rms_norm_eps", where) : 1e-6;
  s.rotary_base = c.contains("rope_theta") ? get<double>(c, "rope_theta", where) : 10000.0;
  s.untie_embeddings_and_output_weights = !c.value("tie_word_embeddings", false);
  s.add_qkv_bias = a.family == Family::Qwen2 || a.family == Family::Qwen2Moe;
  s.qk_layernorm = a.family == Family::Qwen3 || a.family == Family::Qwen3Moe;
  if (c.contains("initializer_range") && c["initializer_range"].is_number())
    s.init_method_std = c["initializer_range"].get<double>();
  read_rope_and_window(c, a, where, s);
  read_family_config(c, a, where, s);
  s.validate();
  return s;
}

json hf_config_from_spec(const ModelSpec& s, const std::string& arch, const std::string& torch_dtype) {
  const Architecture& a = architecture_named(arch, "");
  if (a.multimodal)
    fail("a checkpoint of this engine holds a text model alone, without {} of a {} folder: export it as {} (an "
         "import of such a folder exports as its text model)",
         a.multimodal->others, arch, a.multimodal->text_architecture);
  const bool qwen2 = a.family == Family::Qwen2 || a.family == Family::Qwen2Moe;
  const bool qwen3 = a.family == Family::Qwen3 || a.family == Family::Qwen3Moe;
  if (s.add_qkv_bias && !qwen2)
    fail("the model has QKV biases, which only Qwen2ForCausalLM and Qwen2MoeForCausalLM have (not {})", arch);
  if (!s.add_qkv_bias && qwen2)
    fail("{} has QKV biases and this model has none; export it as {}", arch,
         a.family == Family::Qwen2 ? "LlamaForCausalLM" : "MixtralForCausalLM");
  if (s.qk_layernorm && !qwen3 && !s.multi_latent_attention)
    fail("the model normalizes q and k per head (qk_layernorm), which only Qwen3ForCausalLM and Qwen3MoeForCausalLM "
         "have (not {})",
         arch);
  if (!s.qk_layernorm && qwen3)
    fail("{} normalizes q and k per head and this model does not (qk_layernorm false); export it as {}", arch,
         a.family == Family::Qwen3 ? "LlamaForCausalLM" : "MixtralForCausalLM");
  json c = {{"architectures", {arch}},
            {"model_type", a.model_type},
            {"hidden_size", s.hidden_size},
            {"intermediate_size", s.ffn_hidden_size},
            {"num_hidden_layers", s.num_layers},
            {"num_attention_heads", s.num_attention_heads},
            {"num_key_value_heads", s.query_groups()},
            {"head_dim", s.head_dim()},
            {"vocab_size", s.vocab_size},
            {"max_position_embeddings", s.max_position_embeddings},
            {"rms_norm_eps", s.norm_epsilon},
            {"rope_theta", s.rotary_base},
            {"tie_word_embeddings", !s.untie_embeddings_and_output_weights},
            {"hidden_act", "silu"},
            {"initializer_range", s.init_method_std},
            {"torch_dtype", torch_dtype}};
  if (arch == "LlamaForCausalLM") c["attention_bias"] = false, c["mlp_bias"] = false;
  if (arch == "MistralForCausalLM") c["sliding_window"] = nullptr;
  if (arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM") c["use_sliding_window"] = false;
  if (arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM") c["attention_bias"] = false;
  c["rope_scaling"] = nullptr;
  if (s.use_rope_scaling)
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.rope_scaling_factor},
                         {"low_freq_factor", s.rope_low_freq_factor},
                         {"high_freq_factor", s.rope_high_freq_factor},
                         {"original_max_position_embeddings", s.rope_original_max_position_embeddings}};
  write_family_config(s, a, c);  // experts, latent attention; refuses what the family cannot hold
  return c;
}

namespace {

// Folders this command creates, removed again (when still empty) if it fails: a failed import or
// export leaves nothing behind. Records the path's missing ancestors before anything is written.
class CreatedFolders {
 public:
  explicit CreatedFolders(const fs::path& path) {
    std::error_code ec;
    for (fs::path p = fs::absolute(path); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
      missing_.push_back(p);
      if (p == p.parent_path()) break;
    }
  }
  ~CreatedFolders() {
    if (!kept_)
      for (const fs::path& p : missing_) {  // deepest first; remove() leaves a folder that is not empty
        std::error_code ec;
        fs::remove(p, ec);
      }
  }
  void keep() { kept_ = true; }

 private:
  std::vector<fs::path> missing_;
  bool kept_ = false;
};

// What an import holds at once: every parameter as fp32 plus the checkpoint's zero optimizer
// moments (4 + 4 bytes each), and the largest tensor while it is converted (its bytes as stored
// and as fp32: up to 8 bytes a value). Computed from one layer of each kind (dense, MoE) times
// their counts, so an absurd num_hidden_layers costs nothing to refuse.
// The parameters of one decoder layer of `spec` with `experts` routed experts (0: a dense layer),
// those outside the layers, and the largest tensor.
struct LayerCount {
  double layer = 0, outside = 0, largest = 0;
};
LayerCount count_one_layer(const ModelSpec& spec, int64_t experts) {
  ModelSpec one = spec;
  one.num_layers = 1;
  one.mtp_num_layers = 0;  // counted by check_import_memory as layers of the last layer's kind
  one.moe_layer_pattern.clear();
  one.moe_layer_freq = 1;
  one.window_attn_pattern.clear();  // per-layer lists of num_layers entries
  one.no_rope_pattern.clear();
  one.num_experts = experts;
  if (experts > 0) {
    one.moe_router_topk = std::min(one.moe_router_topk, experts);
    one.moe_router_num_groups = one.moe_router_group_topk = 0;
    one.moe_router_group_score = GroupScore::TopkSum;
  }
  LayerCount c;
  for (const ParamInfo& p : model_parameter_layout(one)) {
    (p.name.starts_with("decoder.layers.") ? c.layer : c.outside) += double(p.numel);
    c.largest = std::max(c.largest, double(p.numel));
  }
  return c;
}

void check_import_memory(const ModelSpec& spec, const std::string& where) {
  // One dense layer, and an MoE layer from one with 1 and with 2 experts (everything of an MoE layer
  // is linear in the experts): an absurd num_experts costs nothing either.
  const LayerCount dense = count_one_layer(spec, 0);
  double moe_layer = 0, moe_layers = 0, largest = dense.largest;
  if (spec.is_moe()) {
    const LayerCount e1 = count_one_layer(spec, 1), e2 = count_one_layer(spec, 2);
    moe_layer = e1.layer + double(spec.num_experts - 1) * (e2.layer - e1.layer);
    largest = std::max({largest, e2.largest, double(spec.num_experts) * double(spec.hidden_size)});  // the router
    moe_layers = !spec.moe_layer_pattern.empty()
                     ? double(std::count(spec.moe_layer_pattern.begin(), spec.moe_layer_pattern.end(), 1))
                     : std::ceil(double(spec.num_layers) / double(std::max<int64_t>(1, spec.moe_layer_freq)));
  }
  const double layer = dense.layer, outside = dense.outside;
  // Each multi-token-prediction depth: a layer of the last one's kind, eh_proj [C, 2C] and three norms.
  const double C = double(spec.hidden_size);
  const double mtp = double(spec.mtp_num_layers) *
                     ((spec.is_moe_layer(spec.num_layers) ? moe_layer : layer) + 2 * C * C + 3 * C);
  const double params = outside + layer * (double(spec.num_layers) - moe_layers) + moe_layer * moe_layers + mtp;
  const double need = 8 * params + 8 * largest;
  const uint64_t available = plan::host_available_bytes();
  if (available == 0 || need <= double(available)) return;
  auto size = [](double b) { return human_bytes(uint64_t(std::min(b, 1e19))); };
  std::string layers = spec.is_moe()
                           ? fmt::format("{} layers: {:.0f} MoE of {:.0f}, {:.0f} dense of {:.0f}", spec.num_layers,
                                         moe_layers, moe_layer, double(spec.num_layers) - moe_layers, layer)
                           : fmt::format("{} layers of {:.0f}", spec.num_layers, layer);
  if (spec.mtp_num_layers > 0)
    layers += fmt::format(", {} multi-token-prediction depth(s) of {:.0f} in all", spec.mtp_num_layers, mtp);
  fail("{} describes a model of {:.0f} parameters ({}, {:.0f} outside the layers); importing it needs about {} of "
       "memory ({} of fp32 values, {} of zero optimizer moments for the checkpoint, {} to convert the largest "
       "tensor), and this host has {} free (MemAvailable). Check num_hidden_layers, hidden_size, intermediate_size{} "
       "and vocab_size there",
       where, params, layers, outside, size(need), size(4 * params), size(4 * params), size(8 * largest),
       human_bytes(available), spec.is_moe() ? ", the experts' count and size" : "");
}

// NaN and Inf values of one tensor: refused, or a warning with allow_nonfinite.
void check_finite(const std::vector<float>& v, const std::string& name, const ImportOptions& o) {
  int64_t nan = 0, inf = 0;
  for (float x : v) nan += std::isnan(x), inf += std::isinf(x);
  if (nan + inf == 0) return;
  const std::string what =
      fmt::format("{}: tensor '{}' has {} NaN and {} infinite values (of {})", o.hf_dir, name, nan, inf, v.size());
  if (!o.allow_nonfinite)
    fail("{}; a model with them computes NaN. --allow-nonfinite imports it anyway", what);
  log::warn("{}; imported anyway (--allow-nonfinite)", what);
}

// A Hugging Face tensor as fp32: F32 / BF16 / F16 widened, F8_E4M3 times its 128 x 128 block
// factors `<name>_scale_inv` (DeepSeek-V3's, dequant.h), which is marked used.
std::vector<float> tensor_values(const SafetensorsReader& st, const std::string& h, std::map<std::string, bool>& used) {
  const TensorEntry& e = st.entry(h);
  if (e.dtype != "F8_E4M3") return st.as_f32(h);
  const std::string scale = h + "_scale_inv";
  if (!st.has(scale)) fail("'{}' is F8_E4M3 without its block factors '{}'", h, scale);
  if (e.shape.size() != 2)
    fail("'{}' is F8_E4M3 of shape [{}]; block-quantized weights are matrices", h, fmt::join(e.shape, ", "));
  used[scale] = true;
  return dequant_fp8_blocks(st.raw(h), e.shape[0], e.shape[1], st.as_f32(scale), st.entry(scale).shape, 128, h);
}

// Our row i = row perm[i] of the concatenation (hf_families.h), `row` values a row.
void permute_rows(float* v, const std::vector<int64_t>& perm, int64_t row, bool inverse) {
  const std::vector<float> src(v, v + int64_t(perm.size()) * row);
  for (size_t i = 0; i < perm.size(); ++i) {
    const int64_t from = inverse ? int64_t(i) : perm[i], to = inverse ? perm[i] : int64_t(i);
    std::copy(src.begin() + from * row, src.begin() + (from + 1) * row, v + to * row);
  }
}

// The multi-token-prediction depths' copies of the embedding and output head (hf_families.h
// mtp_copies): each one the folder holds must equal its original, which this model shares.
void check_mtp_copies(const SafetensorsReader& st, const ModelSpec& spec, std::map<std::string, bool>& used,
                      const ImportOptions& o) {
  for (const auto& [copy, original] : mtp_copies(spec)) {
    if (!st.has(copy)) continue;
    if (st.entry(copy).shape != st.entry(original).shape ||
        tensor_values(st, copy, used) != tensor_values(st, original, used))
      fail("{}: tensor '{}' differs from '{}': this model's multi-token prediction shares the main model's embedding "
           "and output layer, so the copy must equal it",
           o.hf_dir, copy, original);
    used[copy] = true;
  }
}

// The folder's tensors that no mapping read: RoPE buffers (derived) and a tied model's stored
// lm_head (a copy of the embedding, checked) pass; a multimodal folder's other towers are left out,
// said once with their size; any other is refused by name.
void check_unread(const SafetensorsReader& st, const ModelSpec& spec, const Architecture& arch,
                  const std::map<std::string, bool>& used, const ImportOptions& o) {
  const std::string prefix = text_prefix(arch);
  auto other_tower = [&](const std::string& name) {
    if (!arch.multimodal) return false;
    const auto& others = arch.multimodal->other_prefixes;
    return std::any_of(others.begin(), others.end(), [&](const std::string& p) { return name.starts_with(p); });
  };
  int64_t left_tensors = 0, left_params = 0;
  for (const auto& [name, u] : used) {
    if (u || name.ends_with("rotary_emb.inv_freq")) continue;
    if (name == prefix + "lm_head.weight" && !spec.untie_embeddings_and_output_weights) {
      if (st.as_f32(name) != st.as_f32(prefix + "model.embed_tokens.weight"))
        fail("{}: tie_word_embeddings is true but {} differs from {}model.embed_tokens.weight", o.hf_dir, name, prefix);
      continue;
    }
    if (other_tower(name)) {
      ++left_tensors, left_params += st.entry(name).numel();
      continue;
    }
    fail("{}: tensor '{}' has no place in a {} model of this config (unsupported feature?)", o.hf_dir, name, arch.name);
  }
  if (left_tensors > 0)
    log::warn("{}: {} left out ({} tensors, {} parameters under {}): this engine imports {}'s text model, {}", o.hf_dir,
              arch.multimodal->others, left_tensors, left_params, fmt::join(arch.multimodal->other_prefixes, ", "),
              arch.name, arch.multimodal->text_architecture);
}

// Fills `store` (our tensors) from the Hugging Face tensors; every tensor of the folder must find
// its place.
void fill_store(const SafetensorsReader& st, const ModelSpec& spec, const Architecture& arch, ParamStore& store,
                const ImportOptions& o) {
  std::map<std::string, bool> used;
  for (const auto& [name, t] : st.tensors()) used[name] = false;
  for (const Mapping& m : name_map(spec, arch.family, text_prefix(arch))) {
    const int id = store.find(m.ours);
    if (id < 0) fail("internal: the model has no tensor '{}'", m.ours);
    const StoredParam& p = store.infos()[id];
    float* dst = store.value<float>(id);
    int64_t filled = 0, rows = 0;
    for (const std::string& h : m.theirs) {
      const TensorEntry& e = st.entry(h);
      // Each part has our tensor's trailing shape; parts stack along dim 0.
      if (e.shape.size() != p.shape.size() ||
          !std::equal(e.shape.begin() + 1, e.shape.end(), p.shape.begin() + 1))
        fail("{}: tensor '{}' has shape [{}], expected [*, {}] for {}", o.hf_dir, h, fmt::join(e.shape, ", "),
             fmt::join(std::vector<int64_t>(p.shape.begin() + 1, p.shape.end()), ", "), m.ours);
      rows += e.shape.empty() ? 1 : e.shape[0];
      if (rows > (p.shape.empty() ? 1 : p.shape[0]))
        fail("{}: tensor '{}' does not fit {} of shape [{}]", o.hf_dir, h, m.ours, fmt::join(p.shape, ", "));
      const std::vector<float> v = tensor_values(st, h, used);
      check_finite(v, h, o);
      std::copy(v.begin(), v.end(), dst + filled);
      filled += int64_t(v.size());
      used[h] = true;
    }
    if (filled != p.numel)
      fail("{}: {} gives {} values for {} of shape [{}] ({} values)", o.hf_dir, fmt::join(m.theirs, " + "), filled,
           m.ours, fmt::join(p.shape, ", "), p.numel);
    if (!m.perm.empty()) permute_rows(dst, m.perm, p.numel / p.shape[0], false);
  }
  if (arch.family == Family::GptOss || arch.family == Family::Llama4)
    import_packed_experts(arch.family == Family::GptOss ? kGptOssExperts : kLlama4Experts, st, text_prefix(arch), spec,
                          store, used,
                          [&](const std::vector<float>& v, const std::string& name) { check_finite(v, name, o); });
  check_mtp_copies(st, spec, used, o);
  check_unread(st, spec, arch, used, o);
}

// A folder whose config.json says num_nextn_predict_layers but that holds none of those layers'
// tensors (transformers' DeepseekV3ForCausalLM drops them on load, so its save_pretrained writes
// such folders) is imported without multi-token prediction, with a warning; a folder holding some
// of them must hold all (fill_store names the first missing).
void drop_absent_mtp(const SafetensorsReader& st, ModelSpec& spec, const ImportOptions& o) {
  if (spec.mtp_num_layers == 0) return;
  const std::string first = fmt::format("model.layers.{}.", spec.num_layers);
  for (const auto& [name, e] : st.tensors())
    if (name.starts_with(first)) return;
  log::warn("{}: config.json has num_nextn_predict_layers {}, but the folder holds no tensor model.layers.{}.*: "
            "imported without multi-token prediction (mtp_num_layers 0)",
            o.hf_dir, spec.mtp_num_layers, spec.num_layers);
  spec.mtp_num_layers = 0;
}

// The tokenizer the checkpoint will name ("": none), read now: a tokenizer that does not load, or
// whose ids exceed the model's vocabulary, is an import error rather than a surprise in `generate`
// or training.
std::string import_tokenizer(const ModelSpec& spec, const ImportOptions& o) {
  std::string tok = o.tokenizer;
  std::error_code ec;
  if (tok.empty() && fs::exists(fs::path(o.hf_dir) / "tokenizer.json", ec)) tok = o.hf_dir;
  if (tok.empty()) return tok;
  data::TokenizerOptions to;
  to.type = "HuggingFaceTokenizer";
  to.model = tok;
  const auto t = data::build_tokenizer(to);
  if (t->vocab_size() > spec.vocab_size)
    fail("tokenizer '{}' has {} ids, more than the model's vocab_size {}", tok, t->vocab_size(), spec.vocab_size);
  return tok;
}

// The checkpoint's config: the model, and the tokenizer `tok` when there is one.
std::string import_config(const ModelSpec& spec, const ImportOptions& o, const std::string& tok) {
  YAML::Node cfg;
  cfg["exp_name"] = "hf_import";
  YAML::Node pt = cfg["modules"]["pre_trainer"];
  pt["model"] = fs::absolute(o.hf_dir).string();
  pt["model_spec"] = model_spec_to_yaml(spec);
  if (!tok.empty()) {
    pt["overrides"]["tokenizer_type"] = "HuggingFaceTokenizer";
    pt["overrides"]["tokenizer_model"] = fs::absolute(tok).string();
  }
  YAML::Emitter e;
  e << cfg;
  return std::string(e.c_str()) + "\n";
}

}  // namespace

std::string import_hf(const ImportOptions& o) {
  const fs::path dir(o.hf_dir);
  const std::string where = (dir / "config.json").string();
  std::string arch;
  const json hf_config = read_json(dir / "config.json", "Hugging Face config");
  ModelSpec spec = spec_from_hf_config(hf_config, where, &arch);
  check_import_memory(spec, where);  // before anything of the model's size is allocated
  const std::string tok = import_tokenizer(spec, o);
  SafetensorsReader st(o.hf_dir);
  drop_absent_mtp(st, spec, o);
  const std::string config = import_config(spec, o, tok);
  auto store = whole_model_store(spec);
  fill_store(st, spec, architecture_named(arch, where), *store, o);

  CreatedFolders created(o.save_dir);
  checkpoint::TrainState state;
  state.run_id = checkpoint::new_run_id(nullptr);
  checkpoint::SaveOptions so;
  so.overwrite = o.overwrite;
  std::vector<float> zeros(size_t(store->numel()), 0.0f);
  const std::string written =
      checkpoint::save_checkpoint(o.save_dir, *store, zeros.data(), zeros.data(), state, config, so);
  created.keep();
  return written;
}

namespace {

// The files of a Hugging Face model folder that an export writes or that would describe another
// model beside the exported one: config, weights (safetensors or PyTorch, single or sharded, with
// their index) and tokenizer files. Anything else in the folder (a README, a licence) is kept.
bool is_model_file(const std::string& name) {
  static const std::vector<std::string> exact = {"config.json",          "generation_config.json",
                                                 "adapter_config.json",
                                                 "tokenizer.json",       "tokenizer_config.json",
                                                 "special_tokens_map.json", "tokenizer.model",
                                                 "model.safetensors.index.json", "pytorch_model.bin.index.json"};
  if (std::find(exact.begin(), exact.end(), name) != exact.end()) return true;
  return name.ends_with(".safetensors") || (name.starts_with("pytorch_model") && name.ends_with(".bin"));
}

// The output folder of an export. The files are written into a temporary folder beside it, then
// moved into place: a new folder by one rename; an existing one (empty, or with --overwrite) first
// loses the previous model's files, so that no stale shard or index outlives the export. A failed
// export removes the temporary folder and leaves the output as it was.
class ExportFolder {
 public:
  ExportFolder(const fs::path& out, bool overwrite)
      : out_(out), abs_(without_trailing_slash(fs::absolute(out))), created_(abs_.parent_path()) {
    std::error_code ec;
    if (fs::exists(out_, ec) && !fs::is_directory(out_, ec)) fail("--output {} is a file, not a folder", out_.string());
    if (fs::is_directory(out_, ec) && !fs::is_empty(out_, ec) && !overwrite) {
      std::vector<std::string> names;
      for (const auto& e : fs::directory_iterator(out_)) names.push_back(e.path().filename().string());
      std::sort(names.begin(), names.end());
      if (names.size() > 6) names.resize(6), names.back() = "...";
      fail("--output {} is not empty ({}); export writes into a new or empty folder. Choose another --output, or add "
           "--overwrite to replace the Hugging Face model files in it (config, weights, index, tokenizer files; "
           "other files stay)", out_.string(), fmt::join(names, ", "));
    }
    const fs::path parent = abs_.parent_path();
    fs::create_directories(parent, ec);
    if (ec) fail("cannot create {}: {}", parent.string(), ec.message());
    tmp_ = parent / fmt::format(".{}.export-{}", abs_.filename().string(), ::getpid());
    fs::remove_all(tmp_, ec);
    fs::create_directory(tmp_, ec);
    if (ec) fail("cannot create {}: {}", tmp_.string(), ec.message());
  }
  ~ExportFolder() {
    std::error_code ec;
    if (!tmp_.empty()) fs::remove_all(tmp_, ec);
  }
  const fs::path& tmp() const { return tmp_; }

  // Moves the files written into tmp() into the output folder; returns their final paths.
  std::vector<std::string> commit(const std::vector<std::string>& written) {
    std::error_code ec;
    if (!fs::exists(abs_, ec)) {
      fs::rename(tmp_, abs_);
      tmp_.clear();
    } else {
      for (const auto& e : fs::directory_iterator(abs_))
        if (e.is_regular_file() && is_model_file(e.path().filename().string())) fs::remove(e.path());
      for (const auto& f : written) fs::rename(f, abs_ / fs::path(f).filename());
    }
    created_.keep();
    std::vector<std::string> out;
    for (const auto& f : written) out.push_back((out_ / fs::path(f).filename()).string());
    return out;
  }

 private:
  static fs::path without_trailing_slash(fs::path p) {
    p = p.lexically_normal();  // "out/", "out/.", "./out" all name out
    return p.filename().empty() ? p.parent_path() : p;
  }
  fs::path out_, abs_, tmp_;  // as given (for messages), absolute, the temporary folder
  CreatedFolders created_;
};

// Our tensors split into Hugging Face's, as `dtype`.
std::vector<TensorOut> hf_tensors(const ModelSpec& spec, Family family, const ParamStore& store,
                                  const std::vector<float>& values, const std::string& dtype) {
  std::vector<TensorOut> out;
  for (const Mapping& m : name_map(spec, family)) {
    const int id = store.find(m.ours);
    const StoredParam& p = store.infos()[id];
    const int64_t row = p.shape.size() > 1 ? p.numel / p.shape[0] : 1;
    const std::vector<int64_t> parts = m.rows.empty() ? std::vector<int64_t>{p.shape[0]} : m.rows;
    std::vector<float> all(values.begin() + p.offset, values.begin() + p.offset + p.numel);
    if (!m.perm.empty()) permute_rows(all.data(), m.perm, row, true);
    int64_t at = 0;
    for (size_t i = 0; i < m.theirs.size(); ++i) {
      std::vector<float> v(all.begin() + at, all.begin() + at + parts[i] * row);
      at += parts[i] * row;
      std::vector<int64_t> shape = p.shape;
      shape[0] = parts[i];
      out.push_back({m.theirs[i], dtype, shape, f32_to_bytes(v, dtype)});
    }
  }
  if (family == Family::GptOss || family == Family::Llama4)
    for (TensorOut& t :
         export_packed_experts(family == Family::GptOss ? kGptOssExperts : kLlama4Experts, spec, store, values, dtype))
      out.push_back(std::move(t));
  for (const auto& [copy, original] : mtp_copies(spec)) {  // as DeepSeek's release stores them
    const auto it = std::find_if(out.begin(), out.end(), [&](const TensorOut& t) { return t.name == original; });
    PRIMUS_CHECK(it != out.end(), "the exported tensors have no '{}' to copy as '{}'", original, copy);
    out.push_back({copy, it->dtype, it->shape, it->bytes});
  }
  return out;
}

// The tokenizer files beside the tokenizer.json the checkpoint names, copied into `dir`: a Hugging
// Face folder is whole with them.
std::vector<std::string> copy_tokenizer(const YAML::Node& pt, const fs::path& dir) {
  std::vector<std::string> files;
  const YAML::Node ov = pt["overrides"];
  if (!ov || !ov["tokenizer_type"] || ov["tokenizer_type"].as<std::string>() != "HuggingFaceTokenizer" ||
      !ov["tokenizer_model"])
    return files;
  fs::path tok = ov["tokenizer_model"].as<std::string>();
  std::error_code ec;
  if (fs::is_directory(tok, ec)) tok /= "tokenizer.json";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    const fs::path src = tok.parent_path() / f;
    if (fs::exists(src, ec)) {
      fs::copy_file(src, dir / f, fs::copy_options::overwrite_existing);
      files.push_back((dir / f).string());
    }
  }
  return files;
}

// The adapter names of a fused base weight: "<base>.adapter.linear_in.weight" / "linear_out".
std::pair<std::string, std::string> adapter_of(const std::string& base) {
  const std::string pre = base.substr(0, base.size() - std::string(".weight").size()) + ".adapter.";
  return {pre + "linear_in.weight", pre + "linear_out.weight"};
}

// W += scale B A for every adapted weight of `values` (the store's flat layout), in double.
void merge_adapters(const ParamStore& store, std::vector<float>& values, double scale) {
  for (const StoredParam& w : store.infos()) {
    const auto [a_name, b_name] = adapter_of(w.name);
    const int a = store.find(a_name), b = store.find(b_name);
    if (a < 0 || b < 0 || w.shape.size() != 2) continue;
    const int64_t out = w.shape[0], in = w.shape[1], r = store.infos()[size_t(a)].shape[0];
    const float* A = values.data() + store.infos()[size_t(a)].offset;
    const float* B = values.data() + store.infos()[size_t(b)].offset;
    float* W = values.data() + w.offset;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < out; ++i)
      for (int64_t j = 0; j < in; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < r; ++k) acc += double(B[i * r + k]) * double(A[k * in + j]);
        W[i * in + j] = float(double(W[i * in + j]) + scale * acc);
      }
  }
}

// The adapters as PEFT names them: per Hugging Face weight, lora_A (the adapter's A, shared by
// the parts of a fused weight) and lora_B (its rows of B).
std::vector<TensorOut> peft_tensors(const ModelSpec& spec, const ParamStore& store, const std::vector<float>& values,
                                    const std::string& dtype, std::vector<std::string>& modules) {
  std::vector<TensorOut> out;
  for (const Mapping& m : name_map(spec)) {
    const auto [a_name, b_name] = adapter_of(m.ours);
    const int a = store.find(a_name), b = store.find(b_name);
    if (a < 0 || b < 0) continue;
    const StoredParam& pa = store.infos()[size_t(a)];
    const StoredParam& pb = store.infos()[size_t(b)];
    const int64_t r = pa.shape[0];
    std::vector<int64_t> parts;  // rows of B per Hugging Face weight
    if (m.theirs.size() == 3) parts = {spec.q_size(), spec.kv_size(), spec.kv_size()};
    else if (m.theirs.size() == 2) parts = {spec.ffn_hidden_size, spec.ffn_hidden_size};
    else parts = {pb.shape[0]};
    const std::vector<float> A(values.begin() + pa.offset, values.begin() + pa.offset + pa.numel);
    int64_t at = pb.offset;
    for (size_t i = 0; i < m.theirs.size(); ++i) {
      const std::string& hf = m.theirs[i];  // model.layers.N.self_attn.q_proj.weight
      const std::string stem = "base_model.model." + hf.substr(0, hf.size() - std::string(".weight").size());
      std::vector<float> B(values.begin() + at, values.begin() + at + parts[i] * r);
      at += parts[i] * r;
      out.push_back({stem + ".lora_A.weight", dtype, pa.shape, f32_to_bytes(A, dtype)});
      out.push_back({stem + ".lora_B.weight", dtype, {parts[i], r}, f32_to_bytes(B, dtype)});
      const std::string module = hf.substr(0, hf.size() - std::string(".weight").size());
      const std::string leaf = module.substr(module.rfind('.') + 1);
      if (std::find(modules.begin(), modules.end(), leaf) == modules.end()) modules.push_back(leaf);
    }
  }
  return out;
}

json peft_config(const LoraOptions& l, const std::vector<std::string>& modules) {
  return json{{"peft_type", "LORA"},       {"task_type", "CAUSAL_LM"},     {"r", l.dim},
              {"lora_alpha", l.alpha},     {"lora_dropout", l.dropout},    {"target_modules", modules},
              {"bias", "none"},            {"fan_in_fan_out", false},      {"use_rslora", false},
              {"inference_mode", true},    {"modules_to_save", nullptr},   {"base_model_name_or_path", nullptr}};
}

void write_json(const fs::path& path, const json& j) {
  std::ofstream f(path);
  f << j.dump(2) << "\n";
  if (!f.flush()) fail("cannot write {}", path.string());
}

}  // namespace

// ---- a PEFT folder read back: the inverse of peft_tensors (A shared by a fused weight's parts, B
// their rows stacked) ----
std::map<std::string, std::vector<float>> read_peft_adapters(const std::string& dir, const ModelSpec& spec,
                                                             const LoraOptions& lora) {
  if (!lora.enabled) fail("PEFT adapter folder {}: the run has no LoRA adapters to start (set lora.enabled true)", dir);
  const fs::path cfg_path = fs::path(dir) / "adapter_config.json";
  const json c = read_json_file(cfg_path, "PEFT adapter config " + cfg_path.string());
  const std::string where = cfg_path.string();
  if (!c.is_object() || c.value("peft_type", std::string()) != "LORA")
    fail("{}: not a LoRA adapter config (peft_type must be \"LORA\")", where);
  const int64_t r = c.contains("r") && c["r"].is_number_integer() ? c["r"].get<int64_t>() : -1;
  if (r != lora.dim) fail("{}: the adapters' rank r is {}, this run's lora.dim is {}", where, r, lora.dim);
  const double alpha = c.contains("lora_alpha") && c["lora_alpha"].is_number() ? c["lora_alpha"].get<double>() : -1;
  if (alpha != lora.alpha)
    fail("{}: lora_alpha is {}, this run's lora.alpha is {} (the scale alpha / dim would change)", where, alpha,
         lora.alpha);
  for (const char* flag : {"use_rslora", "use_dora", "fan_in_fan_out"})
    if (c.contains(flag) && c[flag].is_boolean() && c[flag].get<bool>())
      fail("{}: {} true is not built (plain LoRA adapters only)", where, flag);
  const SafetensorsReader st((fs::path(dir) / "adapter_model.safetensors").string());
  const auto layout = lora_adapter_layout(model_parameter_layout(spec), lora);
  std::map<std::string, Shape> want(layout.begin(), layout.end());
  std::map<std::string, std::vector<float>> out;
  std::vector<std::string> used;
  auto tensor = [&](const std::string& name, const Shape& shape) {
    const TensorEntry& e = st.entry(name);
    if (e.shape != shape)
      fail("{}: {} is [{}], this model's adapter is [{}]: the adapters of another base model", dir, name,
           fmt::join(e.shape, ", "), fmt::join(shape, ", "));
    used.push_back(name);
    return st.as_f32(name);
  };
  for (const Mapping& m : name_map(spec)) {
    const auto [a_name, b_name] = adapter_of(m.ours);
    if (!want.count(a_name)) continue;
    const Shape& a_shape = want[a_name];
    std::vector<int64_t> parts;  // rows of B per Hugging Face weight (as peft_tensors splits them)
    if (m.theirs.size() == 3) parts = {spec.q_size(), spec.kv_size(), spec.kv_size()};
    else if (m.theirs.size() == 2) parts = {spec.ffn_hidden_size, spec.ffn_hidden_size};
    else parts = {want[b_name][0]};
    std::vector<float> A, B;
    for (size_t i = 0; i < m.theirs.size(); ++i) {
      const std::string& hf = m.theirs[i];
      const std::string stem = "base_model.model." + hf.substr(0, hf.size() - std::string(".weight").size());
      const std::vector<float> a = tensor(stem + ".lora_A.weight", a_shape);
      if (i == 0) A = a;
      else if (a != A)
        fail("{}: {}.lora_A differs from {}'s: the fused {} has one A for its parts", dir, stem, m.theirs[0], m.ours);
      const std::vector<float> b = tensor(stem + ".lora_B.weight", {parts[i], r});
      B.insert(B.end(), b.begin(), b.end());
    }
    out[a_name] = std::move(A);
    out[b_name] = std::move(B);
  }
  for (const auto& [name, shape] : want)
    if (!out.count(name)) fail("PEFT adapter folder {}: no adapter for {} (this model's {})", dir, name, spec.name);
  for (const auto& [name, e] : st.tensors())
    if (std::find(used.begin(), used.end(), name) == used.end())
      fail("{}: {} is not an adapter of this run (lora.target_modules, or another base model)", dir, name);
  return out;
}

std::vector<std::string> export_hf(const ExportOptions& o) {
  if (o.dtype != "F32" && o.dtype != "BF16") fail("export dtype must be F32 or BF16, not '{}'", o.dtype);
  const std::string dir = checkpoint::resolve_checkpoint(o.checkpoint);
  const ModelSpec spec = checkpoint::read_checkpoint_model(dir);
  const YAML::Node pt = checkpoint::trainer_module(YAML::Load(checkpoint::read_checkpoint_config(dir)));
  LoraOptions lora;
  if (pt["overrides"] && pt["overrides"]["lora"]) config::read_lora(pt["overrides"]["lora"], dir + "/config.yaml", lora);
  if (o.adapters && !lora.enabled)
    fail("checkpoint {} has no LoRA adapters (its config's lora.enabled is false): export it without --adapters", dir);
  const auto adapters = lora_adapter_layout(model_parameter_layout(spec), lora);
  checkpoint::check_model_fit(dir, spec, {checkpoint::LoadPurpose::Read, true, adapters});
  const std::string arch = !o.architecture.empty() ? o.architecture : default_architecture(spec).name;
  const json config = hf_config_from_spec(spec, arch, o.dtype == "F32" ? "float32" : "bfloat16");

  auto store = whole_model_store(spec, adapters);
  checkpoint::LoadOptions lo;
  lo.optimizer = false;
  checkpoint::CheckpointData ck = checkpoint::load_checkpoint(dir, *store, lo);
  if (o.adapters) {  // the PEFT folder
    if (spec.is_moe() || spec.multi_latent_attention)
      fail("--adapters: PEFT folders of mixture-of-experts or latent-attention models are not written yet (their "
           "adapters' names and row layouts); export {} without --adapters writes the merged weights", dir);
    std::vector<std::string> modules;
    const std::vector<TensorOut> tensors = peft_tensors(spec, *store, ck.params, o.dtype, modules);
    ExportFolder out(o.out_dir, o.overwrite);
    std::vector<std::string> files =
        write_safetensors(out.tmp().string(), tensors, std::numeric_limits<uint64_t>::max(), {{"format", "pt"}});
    PRIMUS_CHECK(files.size() == 1, "one adapter file, got {}", files.size());
    const fs::path adapter_file = out.tmp() / "adapter_model.safetensors";
    fs::rename(files[0], adapter_file);
    files = {adapter_file.string(), (out.tmp() / "adapter_config.json").string()};
    write_json(files[1], peft_config(lora, modules));
    return out.commit(files);
  }
  if (lora.enabled) merge_adapters(*store, ck.params, lora.scale());  // W + (alpha / dim) B A
  const std::vector<TensorOut> tensors = hf_tensors(spec, architecture_named(arch, "").family, *store, ck.params,
                                                    o.dtype);

  ExportFolder out(o.out_dir, o.overwrite);
  uint64_t bytes = 0;
  for (const TensorOut& t : tensors) bytes += t.bytes.size();
  safe::require_free(out.tmp().string(), bytes, "the exported weights in");
  std::vector<std::string> files = write_safetensors(out.tmp().string(), tensors, o.max_shard_bytes, {{"format", "pt"}});
  const fs::path cfg_path = out.tmp() / "config.json";
  write_json(cfg_path, config);
  files.push_back(cfg_path.string());
  for (const auto& f : copy_tokenizer(pt, out.tmp())) files.push_back(f);
  return out.commit(files);
}

}  // namespace primus::hf
