#include "pipeline/balance.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "pipeline/simulator.h"

namespace primus::pipeline {

namespace {

StageCost zero() { return {0.0, 0.0, 0.0}; }

void add(StageCost& a, const StageCost& b) {
  a.forward += b.forward, a.backward += b.backward, a.weight += b.weight;
}

double total(const StageCost& c) { return c.forward + c.backward + c.weight; }

// Per-stage layer counts to ranges, in stage order.
std::vector<LayerRange> ranges_of(const std::vector<int64_t>& counts) {
  std::vector<LayerRange> out;
  int64_t next = 0;
  for (int64_t n : counts) out.push_back({next, n}), next += n;
  return out;
}

// Gives `layers` items of cost `unit` one at a time to whichever bin ends up lightest, starting
// from `floor` items each on top of the bins' fixed costs. For identical items this minimises the
// heaviest bin.
std::vector<int64_t> fill_lightest(const std::vector<double>& fixed, int64_t floor, int64_t layers, double unit) {
  std::vector<int64_t> n(fixed.size(), floor);
  for (int64_t left = layers - floor * int64_t(fixed.size()); left > 0; --left) {
    size_t best = 0;
    for (size_t i = 1; i < fixed.size(); ++i)
      if (fixed[i] + n[i] * unit < fixed[best] + n[best] * unit - 1e-12) best = i;
    ++n[best];
  }
  return n;
}

}  // namespace

std::vector<StageCost> stage_costs(const std::vector<LayerRange>& split, const ModelCosts& costs) {
  std::vector<StageCost> out;
  for (size_t s = 0; s < split.size(); ++s) {
    StageCost c = zero();
    for (int64_t l = split[s].first_layer; l < split[s].first_layer + split[s].num_layers; ++l)
      add(c, costs.layers.at(size_t(l)));
    if (s == 0) add(c, costs.embedding);
    if (s + 1 == split.size()) add(c, costs.head);
    out.push_back(c);
  }
  return out;
}

std::string layer_counts(const std::vector<LayerRange>& split) {
  std::string out;
  for (const LayerRange& r : split) out += fmt::format("{}{}", out.empty() ? "" : ",", r.num_layers);
  return out;
}

BalanceResult balance_layers(const Schedule& schedule, const ModelCosts& costs, const Costs& base) {
  const int pp = schedule.pp, vpp = schedule.vpp, S = schedule.num_stages();
  const int64_t L = int64_t(costs.layers.size());
  if (L < S)
    fail("pipeline balancing needs at least one layer per stage: {} layers for {} stages (pp {} x vpp {})", L, S,
         pp, vpp);

  BalanceResult best;
  bool have = false;
  auto consider = [&](std::vector<LayerRange> split, int64_t first, int64_t last) {
    Costs c = base;
    c.stages = stage_costs(split, costs);
    const double step = simulate(schedule, c).makespan;
    if (first == 0 && last == 0) {
      best.even_valid = true;
      best.even_split = split;
      best.even_stage_costs = c.stages;
      best.even_step = step;
    }
    if (have && step >= best.step * (1 - 1e-9)) return;
    have = true;
    best.split = std::move(split);
    best.first_rank_layers = first, best.last_rank_layers = last;
    best.stage_costs = std::move(c.stages);
    best.step = step;
  };

  // Megatron's splits: decoder_first/last_pipeline_num_layers per rank, 0 = unset. A rank never
  // needs more than about twice the average to balance, which bounds the search.
  const int64_t cap = std::min(L, 2 * ((L + pp - 1) / pp) + 2 * vpp);
  std::vector<int64_t> options = {0};
  for (int64_t v = vpp; v <= cap; v += vpp) options.push_back(v);
  for (int64_t first : options)
    for (int64_t last : options) {
      if (pp < 2 && (first || last)) continue;
      std::vector<LayerRange> split;
      try {
        split = split_layers(L, pp, vpp, first, last, schedule.placement);
      } catch (const Error&) {
        continue;  // not one of Megatron's splits for these numbers
      }
      consider(std::move(split), first, last);
    }

  // Any per-stage counts: the least largest rank time, then the least largest stage time.
  double unit = 0;
  for (const StageCost& c : costs.layers) unit += total(c);
  unit /= double(L);
  std::vector<double> stage_fixed(S, 0.0);
  stage_fixed[0] += total(costs.embedding);
  stage_fixed[S - 1] += total(costs.head);
  {
    std::vector<double> rank_fixed(pp, 0.0);
    for (int s = 0; s < S; ++s) rank_fixed[schedule.rank_of_stage(s)] += stage_fixed[s];
    const std::vector<int64_t> per_rank = fill_lightest(rank_fixed, vpp, L, unit);
    std::vector<int64_t> counts(S, 0);
    for (int r = 0; r < pp; ++r) {
      std::vector<double> chunk_fixed;
      for (int c = 0; c < vpp; ++c) chunk_fixed.push_back(stage_fixed[schedule.stage_of(r, c)]);
      const std::vector<int64_t> per_chunk = fill_lightest(chunk_fixed, 1, per_rank[r], unit);
      for (int c = 0; c < vpp; ++c) counts[schedule.stage_of(r, c)] = per_chunk[c];
    }
    consider(ranges_of(counts), -1, -1);
  }
  if (vpp > 1) consider(ranges_of(fill_lightest(stage_fixed, 1, L, unit)), -1, -1);
  PRIMUS_CHECK(have, "no layer split for {} layers over {} stages", L, S);
  return best;
}

}  // namespace primus::pipeline
