// analyze model: a model's parameter count, training FLOPs per token and activation memory,
// from a preset name or a spec file. Conventions: docs/model_math.md.
//
//   primus-cli direct -- analyze model --model llama3.1_8B --seq-length 8192 --format json
#include <algorithm>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/registry.h"
#include "core/error.h"
#include "model/model_spec.h"

namespace primus::cli {
namespace analyze_model_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

// 6738415616 -> "6,738,415,616"
std::string grouped(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

// 4.2865e10 -> "42.87 G"
std::string si(double v, const char* unit) {
  if (v == 0) return "0";
  const char* prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (v >= 1000.0 && i < 6) v /= 1000.0, ++i;
  return fmt::format("{:.2f} {}{}", v, prefixes[i], unit);
}

nlohmann::ordered_json spec_json(const ModelSpec& s) {
  nlohmann::ordered_json j = {
      {"num_layers", s.num_layers},
      {"hidden_size", s.hidden_size},
      {"ffn_hidden_size", s.ffn_hidden_size},
      {"num_attention_heads", s.num_attention_heads},
      {"num_query_groups", s.query_groups()},
      {"kv_channels", s.head_dim()},
      {"vocab_size", s.vocab_size},
      {"max_position_embeddings", s.max_position_embeddings},
      {"norm_epsilon", s.norm_epsilon},
      {"rotary_base", s.rotary_base},
      {"untie_embeddings_and_output_weights", s.untie_embeddings_and_output_weights},
      {"add_qkv_bias", s.add_qkv_bias},
      {"use_rope_scaling", s.use_rope_scaling},
  };
  if (s.qk_layernorm) j["qk_layernorm"] = true;
  if (s.multi_latent_attention) {
    j["multi_latent_attention"] = true;
    j["q_lora_rank"] = s.q_lora_rank ? nlohmann::ordered_json(s.q_lora_rank) : nlohmann::ordered_json();
    j["kv_lora_rank"] = s.kv_lora_rank;
    j["qk_head_dim"] = s.qk_head_dim;
    j["qk_pos_emb_head_dim"] = s.qk_pos_emb_head_dim;
    j["v_head_dim"] = s.v_head_dim;
  }
  if (s.is_moe()) {
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (int64_t l = 0; l < s.num_layers; ++l) layers.push_back(s.is_moe_layer(l) ? 1 : 0);
    j["num_experts"] = s.num_experts;
    j["moe_ffn_hidden_size"] = s.expert_ffn();
    j["moe_router_topk"] = s.moe_router_topk;
    j["moe_shared_expert_intermediate_size"] = s.moe_shared_expert_intermediate_size;
    j["moe_router_score_function"] = s.moe_router_score_function;
    j["moe_layers"] = layers;
  }
  if (s.use_rope_scaling) {
    j["rope_scaling_factor"] = s.rope_scaling_factor;
    j["rope_low_freq_factor"] = s.rope_low_freq_factor;
    j["rope_high_freq_factor"] = s.rope_high_freq_factor;
    j["rope_original_max_position_embeddings"] = s.rope_original_max_position_embeddings;
  }
  return j;
}

int run(const std::string& model, bool seq_given, int64_t seq_length_opt, const std::string& format) {
  if (seq_given && seq_length_opt <= 0) fail("--seq-length must be positive, got {}", seq_length_opt);
  ModelSpec spec = load_model_spec(model);
  spec.validate();
  // Without --seq-length: the model's context, capped at 4096 so that a 128K-context preset
  // does not report an attention cost nobody trains at by default.
  const int64_t seq = seq_given ? seq_length_opt : std::min<int64_t>(spec.max_position_embeddings, 4096);
  ModelStats st = model_stats(spec, seq);
  // The attention core's share (QK^T and PV): see model_stats.
  const double attention_flops =
      spec.multi_latent_attention
          ? 3.0 * double(spec.num_layers + spec.mtp_num_layers) * double(seq) * double(spec.num_attention_heads) *
                double(spec.qk_head_dim + spec.qk_pos_emb_head_dim + spec.v_head_dim)
          : 6.0 * double(spec.num_layers + spec.mtp_num_layers) * double(seq) * double(spec.q_size());
  // Active parameters with and without the input embedding: Mixtral and Qwen publish theirs with
  // it, DeepSeek's "37B activated" likewise; some tables leave the input embedding out.
  const int64_t input_embedding = st.layers.front().parameters;

  if (format == "json") {
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const auto& l : st.layers)
      layers.push_back({{"name", l.name},
                        {"parameters", l.parameters},
                        {"active_parameters", l.active_parameters},
                        {"flops_per_token", l.flops_per_token},
                        {"activation_bytes_per_token", l.activation_bytes_per_token}});
    nlohmann::ordered_json out = {
        {"model", spec.name},
        {"seq_length", seq},
        {"parameters", st.parameters},
        {"active_parameters", st.active_parameters},
        {"active_parameters_without_input_embedding", st.active_parameters - input_embedding},
        {"active_parameters_counts_input_embedding", true},
        {"embedding_parameters", st.embedding_parameters},
        {"non_embedding_parameters", st.non_embedding_parameters},
        {"mtp_num_layers", spec.mtp_num_layers},
        {"mtp_parameters", st.mtp_parameters},
        {"mtp_active_parameters", st.mtp_active_parameters},
        {"mtp_flops_per_token", st.mtp_flops_per_token},
        {"flops_per_token", st.flops_per_token},
        {"attention_flops_per_token", attention_flops},
        {"flops_per_sequence", st.flops_per_token * double(seq)},
        {"activation_bytes_per_token", st.activation_bytes_per_token},
        {"activation_bytes_per_sequence", st.activation_bytes_per_token * double(seq)},
        {"config", spec_json(spec)},
        {"layers", layers},
    };
    std::cout << out.dump(2) << "\n";
    return 0;
  }

  std::cout << fmt::format(
      "model {}: {} layers, hidden {}, ffn {}, {} heads / {} query groups (head dim {}), vocab {}, "
      "{} positions{}{}{}\n",
      spec.name, spec.num_layers, spec.hidden_size, spec.ffn_hidden_size, spec.num_attention_heads,
      spec.query_groups(), spec.head_dim(), spec.vocab_size, spec.max_position_embeddings,
      spec.untie_embeddings_and_output_weights ? ", untied output layer" : ", tied output layer",
      spec.add_qkv_bias ? ", qkv bias" : "",
      spec.use_rope_scaling ? fmt::format(", llama3 rope scaling x{}", spec.rope_scaling_factor) : "");
  std::cout << fmt::format("seq_length {}\n\n", seq);
  std::cout << fmt::format("  parameters                  {:>20}\n", grouped(st.parameters));
  if (spec.is_moe()) {
    std::cout << fmt::format("  active parameters           {:>20}   (top-{} of {} experts; input embedding counted)\n",
                             grouped(st.active_parameters), spec.moe_router_topk, spec.num_experts);
    std::cout << fmt::format("  active without input embed. {:>20}\n", grouped(st.active_parameters - input_embedding));
  }
  if (spec.mtp_num_layers > 0) {  // the multi-token prediction depths apart from the main model
    std::cout << fmt::format("  main model parameters       {:>20}\n", grouped(st.parameters - st.mtp_parameters));
    if (spec.is_moe())
      std::cout << fmt::format("  main model active           {:>20}\n",
                               grouped(st.active_parameters - st.mtp_active_parameters));
    std::cout << fmt::format("  MTP parameters              {:>20}   ({} multi-token prediction depth{}; embedding and "
                             "output layer shared)\n",
                             grouped(st.mtp_parameters), spec.mtp_num_layers, spec.mtp_num_layers == 1 ? "" : "s");
    std::cout << fmt::format("  MTP FLOPs per token         {:>20}\n", si(st.mtp_flops_per_token, "FLOP"));
  }
  std::cout << fmt::format("  embedding parameters        {:>20}\n", grouped(st.embedding_parameters));
  std::cout << fmt::format("  non-embedding parameters    {:>20}\n", grouped(st.non_embedding_parameters));
  std::cout << fmt::format("  training FLOPs per token    {:>20}   ({} of it attention{})\n",
                           si(st.flops_per_token, "FLOP"), si(attention_flops, "FLOP"),
                           spec.is_moe() ? "; active experts only" : "");
  std::cout << fmt::format("  activations per token       {:>20}   (fp32, no recompute, without logits)\n",
                           si(st.activation_bytes_per_token, "B"));
  std::cout << fmt::format("  activations per sequence    {:>20}\n\n",
                           si(st.activation_bytes_per_token * double(seq), "B"));

  std::cout << fmt::format("  {:<26} {:>18} {:>16} {:>16}\n", "layer", "parameters", "FLOPs/token",
                           "act bytes/token");
  for (const auto& l : st.layers)
    std::cout << fmt::format("  {:<26} {:>18} {:>16} {:>16}\n", l.name, grouped(l.parameters),
                             si(l.flops_per_token, ""), si(l.activation_bytes_per_token, ""));
  std::cout << fmt::format("  {:<26} {:>18} {:>16} {:>16}\n", "total", grouped(st.parameters),
                           si(st.flops_per_token, ""), si(st.activation_bytes_per_token, ""));
  return 0;
}

TaskRegistrar reg{{"analyze", "model", "parameters, FLOPs per token and activation memory of a model",
                   [](CLI::App& app) -> TaskAction {
                     auto model = std::make_shared<std::string>();
                     auto seq = std::make_shared<int64_t>(0);
                     auto format = std::make_shared<std::string>("text");
                     app.add_option("--model", *model, "preset name (configs/models/<name>.yaml) or a YAML file")
                         ->required();
                     CLI::Option* seq_opt = app.add_option("--seq-length", *seq,
                                    "sequence length for attention FLOPs (default: the model's context, at "
                                    "most 4096)");
                     app.add_option("--format", *format, "output format")
                         ->check(CLI::IsMember({"json", "text"}))
                         ->capture_default_str();
                     return [=] { return run(*model, seq_opt->count() > 0, *seq, *format); };
                   }}};

}  // namespace
}  // namespace primus::cli
