#include "train/moe_step.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace primus::train {

MoeStepSummary finish_moe_step(LlamaModel& model, parallel::ProcessGroup& dp, int64_t microbatches,
                               bool update_bias, const std::vector<parallel::ProcessGroup*>& token_share) {
  MoeStepSummary s;
  const auto& stats = model.moe_stats();
  if (stats.empty()) return s;
  s.any = true;
  // One buffer: every block's counts, then dropped, then the losses.
  std::vector<double> buf;
  for (const auto& l : stats) buf.insert(buf.end(), l.tokens_per_expert.begin(), l.tokens_per_expert.end());
  double aux = 0, z = 0, dropped = 0;
  for (const auto& l : stats) {
    aux += l.aux_loss;
    z += l.z_loss;
    dropped += double(l.dropped);
  }
  buf.push_back(dropped);
  buf.push_back(aux);
  buf.push_back(z);
  for (parallel::ProcessGroup* g : token_share)
    if (g) g->all_reduce(buf);
  dp.all_reduce(buf);
  const double n = double(std::max<int64_t>(1, microbatches)) * double(dp.size());
  s.aux_loss = buf[buf.size() - 2] / n;
  s.z_loss = buf.back() / n;
  s.dropped = int64_t(buf[buf.size() - 3]);
  size_t at = 0;
  std::vector<std::vector<int64_t>> tokens;
  for (const auto& l : stats) {
    MoeStepSummary::Layer out;
    out.layer = l.layer;
    for (size_t e = 0; e < l.tokens_per_expert.size(); ++e) out.tokens.push_back(int64_t(buf[at++]));
    const int64_t total = std::accumulate(out.tokens.begin(), out.tokens.end(), int64_t(0));
    const double mean = double(total) / double(out.tokens.size());
    out.max_over_mean = mean > 0 ? double(*std::max_element(out.tokens.begin(), out.tokens.end())) / mean : 0;
    tokens.push_back(out.tokens);
    s.layers.push_back(std::move(out));
  }
  // Every dp rank sees the same sums, so the biases stay replicas.
  if (update_bias && model.spec().moe_router_enable_expert_bias) model.update_expert_biases(tokens);
  model.reset_moe_stats();
  return s;
}

std::string describe_moe_step(const MoeStepSummary& s) {
  if (!s.any) return "";
  double worst = 0;
  std::string per;
  for (const auto& l : s.layers) {
    worst = std::max(worst, l.max_over_mean);
    if (per.size() < 120) per += fmt::format("{}{}: {:.2f}", per.empty() ? "" : ", ", l.layer, l.max_over_mean);
  }
  return fmt::format("moe aux loss: {:.4E} | z loss: {:.4E} | expert load max/mean: {:.2f} (layers {}){}", s.aux_loss,
                     s.z_loss, worst, per, s.dropped ? fmt::format(" | dropped {}", s.dropped) : "");
}

void add_moe_metrics(const MoeStepSummary& s, nlohmann::json& row) {
  if (!s.any) return;
  row["moe_aux_loss"] = s.aux_loss;
  row["moe_z_loss"] = s.z_loss;
  row["moe_dropped_tokens"] = s.dropped;
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : s.layers)
    layers.push_back({{"layer", l.layer}, {"tokens_per_expert", l.tokens}, {"max_over_mean", l.max_over_mean}});
  row["moe_expert_load"] = layers;
}

}  // namespace primus::train
