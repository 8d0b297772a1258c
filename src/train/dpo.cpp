#include "train/dpo.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/rng.h"
#include "core/log.h"

namespace primus::train {
namespace fs = std::filesystem;

namespace {

// log sigmoid(x), without overflow for large |x|.
double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double sigmoid(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }

}  // namespace

DpoPairLoss dpo_pair_loss(const DpoLossOptions& o, double pi_c, double pi_r, double ref_c, double ref_r) {
  DpoPairLoss p;
  p.reward_chosen = o.beta * (pi_c - ref_c);
  p.reward_rejected = o.beta * (pi_r - ref_r);
  const double z = p.reward_chosen - p.reward_rejected, eps = o.label_smoothing;
  p.loss = -(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z);
  const double dz = -(1 - eps) * sigmoid(-z) + eps * sigmoid(z);  // dloss / dz
  p.dpi_chosen = o.beta * dz;
  p.dpi_rejected = -o.beta * dz;
  return p;
}

void DpoStats::add(const DpoPairLoss& p) {
  loss += p.loss;
  reward_chosen += p.reward_chosen;
  reward_rejected += p.reward_rejected;
  correct += p.reward_chosen > p.reward_rejected ? 1 : 0;
  pairs += 1;
}

DpoStats& DpoStats::operator+=(const DpoStats& o) {
  loss += o.loss, reward_chosen += o.reward_chosen, reward_rejected += o.reward_rejected;
  correct += o.correct, pairs += o.pairs;
  return *this;
}

void DpoStats::reduce(parallel::ProcessGroup& group) {
  std::vector<double> v = {loss, reward_chosen, reward_rejected, correct, pairs};
  group.all_reduce(v);
  loss = v[0], reward_chosen = v[1], reward_rejected = v[2], correct = v[3], pairs = v[4];
}

std::string DpoStats::describe() const {
  const double n = std::max(pairs, 1.0);
  return fmt::format("rewards/chosen: {:.4f} | rewards/rejected: {:.4f} | rewards/margins: {:.4f} | "
                     "rewards/accuracies: {:.3f}",
                     reward_chosen / n, reward_rejected / n, (reward_chosen - reward_rejected) / n, correct / n);
}

void DpoStats::to_metrics(nlohmann::json& row, const std::string& prefix) const {
  const double n = std::max(pairs, 1.0);
  row[prefix + "rewards_chosen"] = reward_chosen / n;
  row[prefix + "rewards_rejected"] = reward_rejected / n;
  row[prefix + "rewards_margins"] = (reward_chosen - reward_rejected) / n;
  row[prefix + "rewards_accuracies"] = correct / n;
}

double sequence_logp(LlamaModel& model, LlamaContext& ctx, const data::Microbatch& mb, int64_t seq_local) {
  const double mean = model.forward(ctx, mb.tokens.data(), mb.targets.data(), 1, seq_local, &mb.docs);
  return -mean * double(ctx.valid);  // ctx.valid: the whole sequence's targets
}

DpoPairLoss dpo_pair_step(LlamaModel& model, const data::Microbatch& chosen, const data::Microbatch& rejected,
                          int64_t seq_local, double ref_c, double ref_r, const DpoLossOptions& o, double weight,
                          std::optional<uint64_t> dropout_key) {
  LlamaContext c, r;
  model.set_dropout_key(dropout_key);
  const double pi_c = sequence_logp(model, c, chosen, seq_local);
  if (dropout_key) model.set_dropout_key(splitmix64(*dropout_key));
  const double pi_r = sequence_logp(model, r, rejected, seq_local);
  model.set_dropout_key(std::nullopt);
  const DpoPairLoss p = dpo_pair_loss(o, pi_c, pi_r, ref_c, ref_r);
  // d pi / d mean = -valid: each side's backward of its mean loss, scaled.
  model.backward(c, -weight * p.dpi_chosen * double(c.valid));
  model.backward(r, -weight * p.dpi_rejected * double(r.valid));
  return p;
}

// ---------------------------------------------------------------------------------------------

DpoObjective::DpoObjective(const Setup& setup, std::shared_ptr<data::DpoDataset> train,
                           std::shared_ptr<data::DpoDataset> valid)
    : s_(setup) {
  train_ = std::make_unique<Set>(make_set(std::move(train)));
  if (valid) valid_ = std::make_unique<Set>(make_set(std::move(valid)));
}

DpoObjective::Set DpoObjective::make_set(std::shared_ptr<data::DpoDataset> d) const {
  Set set;
  set.source.dataset = d;
  set.source.seq = s_.seq;
  set.in_order.dataset = d->in_order();
  set.in_order.seq = s_.seq;
  set.draws = std::move(d);
  return set;
}

// Pair p is computed by dp rank p mod dp (with its tp and cp peers), then summed over dp.
void DpoObjective::compute_reference(Set& set) {
  const int64_t pairs = set.draws->pairs(), dp = s_.dp.size();
  set.ref.assign(size_t(2 * pairs), 0.0);
  const data::MicrobatchSlice one_pair{0, 2, 1, s_.seq, s_.cp, s_.cp_rank};
  data::Microbatch mb;
  for (int64_t p = s_.dp_rank; p < pairs; p += dp) {
    const data::MicrobatchFill fill = data::microbatches_from(set.in_order, 2 * p, one_pair);
    for (int side = 0; side < 2; ++side) {
      fill(side, mb);
      LlamaContext ctx;
      set.ref[size_t(2 * p + side)] = sequence_logp(s_.model, ctx, mb, s_.seq_local);
    }
  }
  s_.dp.all_reduce(set.ref);
}

void DpoObjective::prepare_reference(const std::string& file, bool resumed, bool write) {
  using json = nlohmann::json;
  const auto sets = {std::pair{train_.get(), "train"}, std::pair{valid_.get(), "validation"}};
  if (resumed) {
    std::ifstream in(file);
    if (!in)
      fail("dpo: this run resumes, and the reference log-probabilities of its start are not in {} (written before "
           "its first step): without them the reference would be the resumed weights",
           file);
    const json j = json::parse(in, nullptr, false);
    for (const auto& [set, name] : sets) {
      if (!set) continue;
      if (j.is_discarded() || !j.contains(name) || !j[name].is_array() ||
          j[name].size() != size_t(2 * set->draws->pairs()))
        fail("dpo: {} does not hold the {} reference log-probabilities of this data set's {} {} pairs", file, 2,
             set->draws->pairs(), name);
      set->ref = j[name].get<std::vector<double>>();
    }
    log::info("dpo: reference log-probabilities of the run's start read from {}", file);
    return;
  }
  json j;
  for (const auto& [set, name] : sets) {
    if (!set) continue;
    compute_reference(*set);
    j[name] = set->ref;
  }
  log::info("dpo: reference log-probabilities of {} training{} pairs computed by the starting weights",
            train_->draws->pairs(), valid_ ? fmt::format(" and {} validation", valid_->draws->pairs()) : "");
  if (!write) return;
  fs::create_directories(fs::path(file).parent_path());
  const std::string tmp = file + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump() << "\n";
    if (!out.flush()) fail("dpo: cannot write {}", tmp);
  }
  fs::rename(tmp, file);
}

DpoStats DpoObjective::train(int64_t first, int64_t global_pairs) { return run(*train_, first, global_pairs, true); }

DpoStats DpoObjective::evaluate(int64_t first, int64_t global_pairs) {
  PRIMUS_CHECK(valid_, "DPO evaluation without validation pairs");
  return run(*valid_, first, global_pairs, false);
}

// This rank's pairs: draws first + dp_rank * per_rank + k; sample 2 d is draw d's chosen side.
DpoStats DpoObjective::run(Set& set, int64_t first, int64_t global_pairs, bool backward) {
  const int64_t per_rank = global_pairs / s_.dp.size();
  const data::MicrobatchSlice sides{s_.dp_rank, 2 * per_rank, 1, s_.seq, s_.cp, s_.cp_rank};
  const data::MicrobatchFill fill = data::microbatches_from(set.source, 2 * first, sides);
  DpoStats stats;
  data::Microbatch chosen, rejected;
  for (int64_t k = 0; k < per_rank; ++k) {
    const int64_t draw = first + s_.dp_rank * per_rank + k;
    const size_t pair = size_t(set.draws->pair_of(draw));
    fill(int(2 * k), chosen);
    fill(int(2 * k + 1), rejected);
    const double ref_c = set.ref[2 * pair], ref_r = set.ref[2 * pair + 1];
    if (backward) {
      stats.add(dpo_pair_step(s_.model, chosen, rejected, s_.seq_local, ref_c, ref_r, s_.loss, 1.0 / double(global_pairs),
                              lora_dropout_key(s_.seed, 2 * draw)));
    } else {
      LlamaContext c, r;
      const double pi_c = sequence_logp(s_.model, c, chosen, s_.seq_local);
      const double pi_r = sequence_logp(s_.model, r, rejected, s_.seq_local);
      stats.add(dpo_pair_loss(s_.loss, pi_c, pi_r, ref_c, ref_r));
    }
  }
  stats.reduce(s_.dp);
  return stats;
}

}  // namespace primus::train
