// The MoE router on the host, in double: scores, (group-limited) top-k, combine weights,
// capacity dropping, the load-balancing losses (aux_loss, seq_aux_loss, z-loss) and the
// gradient of all of it w.r.t. the router logits. Megatron-Core's TopKRouter semantics under its
// config names (docs/moe.md). The router's GEMM runs on the backend; its [tokens, experts]
// logits are small enough to decide on the host, which keeps the routing code single and exact.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/model_spec.h"

namespace primus {

struct Routing {
  int64_t tokens = 0, experts = 0, topk = 0, batch = 0, seq = 0;
  int64_t total_tokens = 0;     // tokens of the microbatch over the ranks that share it (TokenShare)
  std::vector<double> logits;   // [tokens, experts], soft-capped by router_logit_softcapping
  std::vector<double> scores;   // softmax or sigmoid of the logits (what the weights come from)
  std::vector<int32_t> expert;  // [tokens, topk] chosen experts
  std::vector<double> weight;   // [tokens, topk] combine weights; 0 where capacity dropped it
  std::vector<double> raw;      // [tokens, topk] weights before the top-k scaling factor
  std::vector<uint8_t> kept;    // [tokens, topk] 1 unless capacity dropped it
  std::vector<int64_t> routed_per_expert;  // chosen, before dropping (the aux loss's counts; over TokenShare)
  std::vector<int64_t> kept_per_expert;    // what the experts compute
  int64_t dropped = 0;
  double aux_loss = 0, z_loss = 0;  // with their coefficients
};

// Sequence parallelism splits a microbatch's tokens over `ranks` ranks, each routing its own:
// `sum` adds a per-expert count vector over them, so that the aux loss's counts and the losses'
// token count are the whole microbatch's (each rank's aux and z loss values are then its
// tokens' parts of the whole, which add up over the ranks). seq_aux_loss and capacity dropping
// need whole sequences / all tokens of an expert, and are refused with ranks > 1 (moe.cpp).
struct TokenShare {
  int ranks = 1, rank = 0;  // this rank holds tokens [rank * tokens, (rank + 1) * tokens)
  std::function<void(std::vector<int64_t>&)> sum;
};

// Routes `tokens = batch * seq / share.ranks` rows (row = b * seq + s without sharing) given the
// router logits. expert_bias (num_experts entries, or empty) only shifts the choice of experts,
// never the weights.
Routing route(const ModelSpec& spec, std::vector<double> logits, const std::vector<double>& expert_bias,
              int64_t batch, int64_t seq, const TokenShare& share = {});

// The routing of a backend without values (the shape-only walk, kernels/meta): `load` rows per
// expert (summing to tokens x topk; backend.h router_load), the choices dealt out in token order,
// each with weight 1 / topk (times the top-k scaling factor), dropped beyond the expert capacity
// when moe_expert_capacity_factor is set. It has no logits (route_backward gives zeros) and no
// losses.
Routing route_by_load(const ModelSpec& spec, const std::vector<int64_t>& load, int64_t batch, int64_t seq,
                      const TokenShare& share = {});

// dlogits [tokens, experts]: the gradient of  sum(dweight * weight) + loss_scale * (aux + z).
std::vector<double> route_backward(const ModelSpec& spec, const Routing& r, const std::vector<double>& dweight,
                                   double loss_scale);

// Aux-loss-free balancing: bias_e += rate * sign(mean - tokens_e) (Megatron's), less the mean of
// those steps over the experts when `centered` (torchtitan's); tokens per expert summed over the
// whole step (and over the ranks that share the expert).
void update_expert_bias(std::vector<double>& bias, const std::vector<int64_t>& tokens_per_expert, double rate,
                        bool centered);

// Wall-clock seconds this process has spent in route() and route_backward(), all threads: the
// router's host work, which bench_engine --profile reports as its own entry.
double routing_seconds();

// Expert capacity (tokens an expert takes): ceil(tokens * topk / experts * capacity_factor).
int64_t expert_capacity(int64_t tokens, int64_t topk, int64_t experts, double capacity_factor);
// MaxText's, per sequence of `seq` tokens: int(max(ceil(seq * topk / experts) * factor, factor)).
int64_t sequence_capacity(int64_t seq, int64_t topk, int64_t experts, double capacity_factor);

}  // namespace primus
