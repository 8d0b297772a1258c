// Direct preference optimization (stage: dpo, docs/posttraining.md): the sigmoid loss of the DPO
// paper (Rafailov et al. 2023) as TRL and torchtune define it, on the one model (model/llama.h):
//
//   pi_x   = sum of log p(token) over side x's response tokens under the policy (the model trained)
//   ref_x  = the same under the reference: the model as the run starts, computed once before the
//            first step (prepare_reference), so that only one model is held while training
//   z      = beta * ((pi_c - ref_c) - (pi_r - ref_r))          c: chosen, r: rejected
//   loss   = -(1 - eps) log sigmoid(z) - eps log sigmoid(-z)    eps: label smoothing (conservative DPO)
//   rewards/chosen = beta (pi_c - ref_c), rewards/rejected = beta (pi_r - ref_r),
//   rewards/margins = their difference, rewards/accuracies = the share of pairs with margin > 0
//
// A side is a sequence of its own (a microbatch of one sequence); the model's forward gives the
// mean of -log p over the side's trained targets and their count, so pi_x = -mean * count, and
// its backward with dloss = dL/dpi_x * -count * (the pair's weight in the step) accumulates the
// pair's gradient. A pair's two forwards come first, then its two backwards (two contexts held).
// The reference being a forward of the starting weights, it is also what LoRA's base without
// adapters gives (adapters start at zero), without a second copy of anything.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/dpo_dataset.h"
#include "data/microbatch.h"
#include "model/llama.h"
#include "parallel/process_group.h"

namespace primus::train {

struct DpoLossOptions {
  double beta = 0.1;
  double label_smoothing = 0.0;
};

// One pair's loss, its derivatives with respect to the policy's summed log-probabilities, and
// its rewards.
struct DpoPairLoss {
  double loss = 0, dpi_chosen = 0, dpi_rejected = 0, reward_chosen = 0, reward_rejected = 0;
};
DpoPairLoss dpo_pair_loss(const DpoLossOptions& o, double pi_chosen, double pi_rejected, double ref_chosen,
                          double ref_rejected);

// Sums over pairs, reduced over ranks with reduce().
struct DpoStats {
  double loss = 0, reward_chosen = 0, reward_rejected = 0, correct = 0, pairs = 0;
  void add(const DpoPairLoss& p);
  DpoStats& operator+=(const DpoStats& o);
  void reduce(parallel::ProcessGroup& group);
  double mean_loss() const { return pairs > 0 ? loss / pairs : 0.0; }
  // " | rewards/chosen: ... | rewards/accuracies: ..." for the log, and the metrics fields
  // (prefix + "rewards_chosen", ...).
  std::string describe() const;
  void to_metrics(nlohmann::json& row, const std::string& prefix) const;
};

// The policy's summed log-probability of the trained targets of mb (one sequence; under context
// parallelism this rank's chunks, summed over the whole sequence). ctx keeps what a backward needs.
double sequence_logp(LlamaModel& model, LlamaContext& ctx, const data::Microbatch& mb, int64_t seq_local);

// Both sides' forwards, the loss against the reference, then both backwards, the gradients
// weighted by `weight` (the pair's share of the step's objective: 1 / pairs in the global batch).
DpoPairLoss dpo_pair_step(LlamaModel& model, const data::Microbatch& chosen, const data::Microbatch& rejected,
                          int64_t seq_local, double ref_chosen, double ref_rejected, const DpoLossOptions& o,
                          double weight, std::optional<uint64_t> dropout_key = std::nullopt);

// The trainer's DPO objective: the pairs of the training (and validation) set, the reference
// log-probabilities of each, and the step's passes over this rank's share of a global batch.
class DpoObjective {
 public:
  struct Setup {
    LlamaModel& model;
    parallel::ProcessGroup& dp;  // the data-parallel group (pairs are split over it)
    int64_t dp_rank = 0;
    int64_t seq = 0, seq_local = 0;  // the whole sequence, and this rank's share (under cp)
    int cp = 1, cp_rank = 0;
    DpoLossOptions loss;
    uint64_t seed = 0;  // the run's: LoRA dropout's keys (model/linears.h lora_dropout_key)
  };
  DpoObjective(const Setup& setup, std::shared_ptr<data::DpoDataset> train, std::shared_ptr<data::DpoDataset> valid);

  // Before the first step: every pair's reference log-probabilities, computed by forwards of the
  // model as it is now (the pairs split over dp ranks, then shared), and written to `file` by the
  // rank with `write`; on a resumed run (`resumed`), read back from `file` instead, as the weights
  // have moved on since.
  void prepare_reference(const std::string& file, bool resumed, bool write);

  // This rank's pairs of the global batch of `global_pairs` pairs that starts at draw `first`:
  // forward and backward (train), or forward only (evaluate, on the validation pairs). Returns
  // the sums over every rank's pairs.
  DpoStats train(int64_t first, int64_t global_pairs);
  DpoStats evaluate(int64_t first, int64_t global_pairs);
  bool has_validation() const { return valid_ != nullptr; }

 private:
  struct Set {
    std::shared_ptr<data::DpoDataset> draws;
    data::SampleSource source, in_order;  // the shuffled draws, and each pair once (reference)
    std::vector<double> ref;              // 2 per pair: chosen, rejected
  };
  Set make_set(std::shared_ptr<data::DpoDataset> d) const;
  void compute_reference(Set& set);
  DpoStats run(Set& set, int64_t first, int64_t global_pairs, bool backward);

  Setup s_;
  std::unique_ptr<Set> train_, valid_;
};

}  // namespace primus::train
