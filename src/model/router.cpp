#include "model/router.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "kernels/softcap.h"

namespace primus {
namespace {

void softmax_row(const double* x, double* y, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (y[i] = std::exp(x[i] - m));
  for (int64_t i = 0; i < n; ++i) y[i] /= s;
}

double logsumexp_row(const double* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  return m + std::log(s);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::atomic<int64_t> routing_ns{0};

// Adds the wall time of its scope to routing_seconds().
class RoutingClock {
 public:
  RoutingClock() : t0_(std::chrono::steady_clock::now()) {}
  ~RoutingClock() {
    routing_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  std::chrono::steady_clock::time_point t0_;
};

// Indices of the k largest of x (ties: the lower index), in descending order of value.
std::vector<int32_t> top_k(const std::vector<double>& x, int64_t k) {
  std::vector<int32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
  idx.resize(size_t(k));
  return idx;
}

// A deterministic stand-in for random logits (moe_router_force_load_balancing): uniform in
// (-1, 1) from a hash of (token, expert).
double noise(int64_t t, int64_t e) {
  uint64_t z = uint64_t(t) * 0x9E3779B97F4A7C15ull + uint64_t(e) * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) / double(uint64_t(1) << 53) * 2.0 - 1.0;
}

// The probabilities the aux losses weigh: softmax of the logits, or the sigmoid scores
// normalised per token.
std::vector<double> aux_probs(const ModelSpec& spec, const Routing& r) {
  const int64_t N = r.tokens, E = r.experts;
  std::vector<double> p(size_t(N * E));
  for (int64_t t = 0; t < N; ++t) {
    if (spec.moe_router_score_function == "softmax") {
      softmax_row(&r.logits[size_t(t * E)], &p[size_t(t * E)], E);
    } else {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += r.scores[size_t(t * E + e)];
      for (int64_t e = 0; e < E; ++e) p[size_t(t * E + e)] = r.scores[size_t(t * E + e)] / (s + 1e-20);
    }
  }
  return p;
}

// d(aux loss)/d(aux probability) for each token and expert (the counts are constants).
std::vector<double> aux_grad(const ModelSpec& spec, const Routing& r) {
  const int64_t N = r.tokens, E = r.experts, k = r.topk;
  std::vector<double> g(size_t(N * E), 0.0);
  const double c = spec.moe_aux_loss_coeff;
  if (c == 0 || spec.moe_router_load_balancing_type == "none") return g;
  if (spec.moe_router_load_balancing_type == "aux_loss") {
    const double Nt = double(r.total_tokens);
    const double f = c * double(E) / (Nt * Nt * double(k));
    for (int64_t t = 0; t < N; ++t)
      for (int64_t e = 0; e < E; ++e) g[size_t(t * E + e)] = f * double(r.routed_per_expert[size_t(e)]);
    return g;
  }
  // seq_aux_loss: the same per sequence, averaged over the sequences.
  const int64_t S = r.seq, B = r.batch;
  const double f = c * double(E) / (double(S) * double(S) * double(k) * double(B));
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> count(size_t(E), 0);
    for (int64_t t = b * S; t < (b + 1) * S; ++t)
      for (int64_t j = 0; j < k; ++j) ++count[size_t(r.expert[size_t(t * k + j)])];
    for (int64_t t = b * S; t < (b + 1) * S; ++t)
      for (int64_t e = 0; e < E; ++e) g[size_t(t * E + e)] = f * double(count[size_t(e)]);
  }
  return g;
}

}  // namespace

double routing_seconds() { return double(routing_ns.load()) * 1e-9; }

int64_t expert_capacity(int64_t tokens, int64_t topk, int64_t experts, double capacity_factor) {
  return int64_t(std::ceil(double(tokens) * double(topk) / double(experts) * capacity_factor));
}

int64_t sequence_capacity(int64_t seq, int64_t topk, int64_t experts, double capacity_factor) {
  const double per = std::ceil(double(seq * topk) / double(experts));
  return int64_t(std::max(per * capacity_factor, capacity_factor));
}

namespace {
// A routing's sizes: this rank's share of batch x seq tokens over the spec's experts.
Routing routing_of(const ModelSpec& spec, int64_t batch, int64_t seq, const TokenShare& share) {
  Routing r;
  r.batch = batch;
  r.seq = seq;
  r.tokens = batch * seq / share.ranks;
  r.total_tokens = batch * seq;
  r.experts = spec.num_experts;
  r.topk = spec.moe_router_topk;
  return r;
}
}  // namespace

// Whether the chosen scores (sigmoid, or softmax over all experts) are divided by their sum.
bool renormalised(const ModelSpec& spec) {
  return spec.moe_router_score_function == "sigmoid" ? spec.moe_router_topk > 1 : spec.moe_router_norm_topk_prob;
}

Routing route(const ModelSpec& spec, std::vector<double> logits, const std::vector<double>& expert_bias,
              int64_t batch, int64_t seq, const TokenShare& share) {
  const RoutingClock clock;
  Routing r = routing_of(spec, batch, seq, share);
  const int64_t N = r.tokens, E = r.experts, k = r.topk;
  PRIMUS_CHECK(int64_t(logits.size()) == N * E, "route: {} logits for {} x {}", logits.size(), N, E);
  PRIMUS_CHECK(expert_bias.empty() || int64_t(expert_bias.size()) == E, "route: expert bias size");
  if (spec.moe_router_force_load_balancing)
    for (int64_t t = 0; t < N; ++t)
      for (int64_t e = 0; e < E; ++e) logits[size_t(t * E + e)] = noise(share.rank * N + t, e);
  // Grok 2's router_logit_softcapping: the capped logits are the router's logits from here on (the
  // scores, the z-loss); route_backward multiplies by the cap's slope.
  if (spec.router_logit_softcapping > 0)
    for (double& x : logits) x = ops::softcap(x, spec.router_logit_softcapping);
  r.logits = std::move(logits);
  const bool sigmoid_scores = spec.moe_router_score_function == "sigmoid";
  const bool pre = spec.moe_router_pre_softmax;
  r.scores.resize(size_t(N * E));
  for (int64_t t = 0; t < N; ++t) {
    const double* l = &r.logits[size_t(t * E)];
    double* s = &r.scores[size_t(t * E)];
    if (sigmoid_scores)
      for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(l[e]);
    else
      softmax_row(l, s, E);
  }
  r.expert.resize(size_t(N * k));
  r.raw.resize(size_t(N * k));
  const int64_t G = spec.moe_router_num_groups, per_group = G ? E / G : E;
  std::vector<double> x(static_cast<size_t>(E));
  for (int64_t t = 0; t < N; ++t) {
    // What the choice ranks: the scores (sigmoid, or softmax before top-k) plus the expert bias,
    // or the raw logits (softmax after top-k).
    for (int64_t e = 0; e < E; ++e) {
      x[size_t(e)] = sigmoid_scores || pre ? r.scores[size_t(t * E + e)] : r.logits[size_t(t * E + e)];
      if (!expert_bias.empty()) x[size_t(e)] += expert_bias[size_t(e)];
    }
    if (G > 0) {  // keep the group_topk groups whose top `take` sum the largest (take 1: their largest)
      std::vector<double> group_score(static_cast<size_t>(G));
      const int64_t take = spec.group_score_terms();
      for (int64_t g = 0; g < G; ++g) {
        std::vector<double> in(x.begin() + g * per_group, x.begin() + (g + 1) * per_group);
        std::sort(in.begin(), in.end(), std::greater<>());
        group_score[size_t(g)] = std::accumulate(in.begin(), in.begin() + std::min<int64_t>(take, per_group), 0.0);
      }
      std::vector<int32_t> groups = top_k(group_score, spec.moe_router_group_topk);
      std::vector<bool> on(size_t(G), false);
      for (int32_t g : groups) on[size_t(g)] = true;
      for (int64_t e = 0; e < E; ++e)
        if (!on[size_t(e / per_group)]) x[size_t(e)] = -std::numeric_limits<double>::infinity();
    }
    std::vector<int32_t> sel = top_k(x, k);
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = sel[size_t(j)];
      r.expert[size_t(t * k + j)] = e;
      r.raw[size_t(t * k + j)] = sigmoid_scores || pre ? r.scores[size_t(t * E + e)] : r.logits[size_t(t * E + e)];
    }
    if (!sigmoid_scores && !pre) {  // softmax over the chosen logits
      softmax_row(&r.raw[size_t(t * k)], &r.raw[size_t(t * k)], k);
    } else if (renormalised(spec)) {
      for (int64_t j = 0; j < k; ++j) sum += r.raw[size_t(t * k + j)];
      for (int64_t j = 0; j < k; ++j) r.raw[size_t(t * k + j)] /= sum + 1e-20;
    }
  }
  const double scale = spec.moe_router_topk_scaling_factor > 0 ? spec.moe_router_topk_scaling_factor : 1.0;
  r.weight.resize(size_t(N * k));
  for (size_t i = 0; i < r.raw.size(); ++i) r.weight[i] = r.raw[i] * scale;

  r.routed_per_expert.assign(size_t(E), 0);
  for (int32_t e : r.expert) ++r.routed_per_expert[size_t(e)];
  if (share.ranks > 1) share.sum(r.routed_per_expert);
  r.kept.assign(size_t(N * k), 1);
  if (spec.moe_expert_capacity_factor > 0) {
    // Per expert, keep the `capacity` assignments with the largest weights (probs) or the
    // earliest tokens (position); ties go to the earlier token.
    // Over the rank's tokens, or (MaxText's) over each sequence's.
    const bool per_sequence = spec.moe_expert_capacity_per_sequence;
    const int64_t rows = per_sequence ? r.seq : N;
    const int64_t cap = per_sequence ? sequence_capacity(r.seq, k, E, spec.moe_expert_capacity_factor)
                                     : expert_capacity(N, k, E, spec.moe_expert_capacity_factor);
    for (int64_t first = 0; first < N; first += rows) {
      std::vector<std::vector<int64_t>> of(static_cast<size_t>(E));
      for (int64_t i = first * k; i < (first + rows) * k; ++i) of[size_t(r.expert[size_t(i)])].push_back(i);
      for (auto& list : of) {
        if (int64_t(list.size()) <= cap) continue;
        if (spec.moe_token_drop_policy == "probs")
          std::stable_sort(list.begin(), list.end(),
                           [&](int64_t a, int64_t b) { return r.weight[size_t(a)] > r.weight[size_t(b)]; });
        for (size_t i = size_t(cap); i < list.size(); ++i) {
          r.kept[size_t(list[i])] = 0;
          r.weight[size_t(list[i])] = 0;
          ++r.dropped;
        }
      }
    }
  }
  r.kept_per_expert.assign(size_t(E), 0);
  for (int64_t i = 0; i < N * k; ++i)
    if (r.kept[size_t(i)]) ++r.kept_per_expert[size_t(r.expert[size_t(i)])];

  // Losses (values only; route_backward differentiates them).
  if (spec.moe_aux_loss_coeff > 0 && spec.moe_router_load_balancing_type != "none") {
    const std::vector<double> p = aux_probs(spec, r), g = aux_grad(spec, r);
    // aux is linear in p given the counts: sum g * p.
    for (size_t i = 0; i < p.size(); ++i) r.aux_loss += g[i] * p[i];
  }
  if (spec.moe_z_loss_coeff > 0) {
    double z = 0;
    for (int64_t t = 0; t < N; ++t) {
      const double lse = logsumexp_row(&r.logits[size_t(t * E)], E);
      z += lse * lse;
    }
    r.z_loss = spec.moe_z_loss_coeff * z / double(r.total_tokens);
  }
  return r;
}

Routing route_by_load(const ModelSpec& spec, const std::vector<int64_t>& load, int64_t batch, int64_t seq,
                      const TokenShare& share) {
  Routing r = routing_of(spec, batch, seq, share);
  const int64_t N = r.tokens, E = r.experts, k = r.topk;
  PRIMUS_CHECK(int64_t(load.size()) == E, "route_by_load: {} counts for {} experts", load.size(), E);
  const double scale = spec.moe_router_topk_scaling_factor > 0 ? spec.moe_router_topk_scaling_factor : 1.0;
  r.expert.reserve(size_t(N * k));
  for (int64_t e = 0; e < E; ++e) r.expert.insert(r.expert.end(), size_t(load[size_t(e)]), int32_t(e));
  PRIMUS_CHECK(int64_t(r.expert.size()) == N * k, "route_by_load: {} rows for {} tokens x top-{}", r.expert.size(), N,
               k);
  r.raw.assign(size_t(N * k), 1.0 / double(k));
  r.weight.assign(size_t(N * k), scale / double(k));
  r.kept.assign(size_t(N * k), 1);
  r.routed_per_expert = load;
  if (share.ranks > 1) share.sum(r.routed_per_expert);
  r.kept_per_expert = load;
  if (spec.moe_expert_capacity_factor > 0) {  // the earliest rows of an expert stay
    // Per sequence (MaxText's): each of the batch's sequences holds as many (an upper bound).
    const int64_t cap = spec.moe_expert_capacity_per_sequence
                            ? sequence_capacity(r.seq, k, E, spec.moe_expert_capacity_factor) * (N / r.seq)
                            : expert_capacity(N, k, E, spec.moe_expert_capacity_factor);
    std::vector<int64_t> seen(size_t(E), 0);
    for (int64_t i = 0; i < N * k; ++i) {
      const int32_t e = r.expert[size_t(i)];
      if (++seen[size_t(e)] <= cap) continue;
      r.kept[size_t(i)] = 0;
      r.weight[size_t(i)] = 0;
      --r.kept_per_expert[size_t(e)];
      ++r.dropped;
    }
  }
  return r;
}

std::vector<double> route_backward(const ModelSpec& spec, const Routing& r, const std::vector<double>& dweight,
                                   double loss_scale) {
  const RoutingClock clock;
  const int64_t N = r.tokens, E = r.experts, k = r.topk;
  PRIMUS_CHECK(int64_t(dweight.size()) == N * k, "route_backward: {} weight gradients", dweight.size());
  std::vector<double> dl(size_t(N * E), 0.0);
  if (spec.moe_router_force_load_balancing) return dl;  // the logits were replaced by noise
  if (r.logits.empty()) return dl;                      // routed by load (route_by_load): no logits
  const bool sigmoid_scores = spec.moe_router_score_function == "sigmoid";
  const bool pre = spec.moe_router_pre_softmax;
  const double scale = spec.moe_router_topk_scaling_factor > 0 ? spec.moe_router_topk_scaling_factor : 1.0;
  std::vector<double> ds(size_t(N * E), 0.0);  // gradient w.r.t. the scores (sigmoid / pre-softmax paths)
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> dw(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j)
      dw[size_t(j)] = r.kept[size_t(t * k + j)] ? dweight[size_t(t * k + j)] * scale : 0.0;
    const double* w = &r.raw[size_t(t * k)];
    if (!sigmoid_scores && !pre) {  // w = softmax(chosen logits)
      double dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += w[j] * dw[size_t(j)];
      for (int64_t j = 0; j < k; ++j)
        dl[size_t(t * E + r.expert[size_t(t * k + j)])] += w[j] * (dw[size_t(j)] - dot);
    } else if (renormalised(spec)) {  // w = s_chosen / sum(s_chosen)
      double sum = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) sum += r.scores[size_t(t * E + r.expert[size_t(t * k + j)])];
      for (int64_t j = 0; j < k; ++j) dot += w[j] * dw[size_t(j)];
      for (int64_t j = 0; j < k; ++j)
        ds[size_t(t * E + r.expert[size_t(t * k + j)])] += (dw[size_t(j)] - dot) / (sum + 1e-20);
    } else {  // w = the chosen score itself
      for (int64_t j = 0; j < k; ++j) ds[size_t(t * E + r.expert[size_t(t * k + j)])] += dw[size_t(j)];
    }
  }
  // Scores to logits: sigmoid' elementwise, or softmax's Jacobian per token.
  auto scores_to_logits = [&](const std::vector<double>& g) {
    for (int64_t t = 0; t < N; ++t) {
      const double* s = &r.scores[size_t(t * E)];
      const double* gt = &g[size_t(t * E)];
      if (sigmoid_scores) {
        for (int64_t e = 0; e < E; ++e) dl[size_t(t * E + e)] += gt[e] * s[e] * (1 - s[e]);
      } else {
        double dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += s[e] * gt[e];
        for (int64_t e = 0; e < E; ++e) dl[size_t(t * E + e)] += s[e] * (gt[e] - dot);
      }
    }
  };
  if (sigmoid_scores || pre) scores_to_logits(ds);

  if (spec.moe_aux_loss_coeff > 0 && spec.moe_router_load_balancing_type != "none" && loss_scale != 0) {
    const std::vector<double> p = aux_probs(spec, r);
    std::vector<double> g = aux_grad(spec, r);
    for (double& v : g) v *= loss_scale;
    for (int64_t t = 0; t < N; ++t) {
      const double* gt = &g[size_t(t * E)];
      const double* pt = &p[size_t(t * E)];
      if (!sigmoid_scores) {  // p = softmax(logits)
        double dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += pt[e] * gt[e];
        for (int64_t e = 0; e < E; ++e) dl[size_t(t * E + e)] += pt[e] * (gt[e] - dot);
      } else {  // p = s / sum(s), s = sigmoid(logits)
        double sum = 0, dot = 0;
        for (int64_t e = 0; e < E; ++e) sum += r.scores[size_t(t * E + e)];
        for (int64_t e = 0; e < E; ++e) dot += pt[e] * gt[e];
        for (int64_t e = 0; e < E; ++e) {
          const double s = r.scores[size_t(t * E + e)];
          dl[size_t(t * E + e)] += (gt[e] - dot) / (sum + 1e-20) * s * (1 - s);
        }
      }
    }
  }
  if (spec.moe_z_loss_coeff > 0 && loss_scale != 0) {
    std::vector<double> sm(static_cast<size_t>(E));
    for (int64_t t = 0; t < N; ++t) {
      const double* l = &r.logits[size_t(t * E)];
      const double lse = logsumexp_row(l, E);
      softmax_row(l, sm.data(), E);
      const double f = loss_scale * spec.moe_z_loss_coeff * 2.0 * lse / double(r.total_tokens);
      for (int64_t e = 0; e < E; ++e) dl[size_t(t * E + e)] += f * sm[size_t(e)];
    }
  }
  if (spec.router_logit_softcapping > 0)  // through the cap: w.r.t. the logits the router's GEMM gave
    for (size_t i = 0; i < dl.size(); ++i) dl[i] *= ops::softcap_slope(r.logits[i], spec.router_logit_softcapping);
  return dl;
}

void update_expert_bias(std::vector<double>& bias, const std::vector<int64_t>& tokens_per_expert, double rate,
                        bool centered) {
  PRIMUS_CHECK(bias.size() == tokens_per_expert.size(), "expert bias and counts differ in size");
  if (bias.empty()) return;
  const double mean =
      double(std::accumulate(tokens_per_expert.begin(), tokens_per_expert.end(), int64_t(0))) / double(bias.size());
  std::vector<double> delta(bias.size());
  for (size_t e = 0; e < bias.size(); ++e) {
    const double off = mean - double(tokens_per_expert[e]);
    delta[e] = rate * double((off > 0) - (off < 0));
  }
  const double shift = centered ? std::accumulate(delta.begin(), delta.end(), 0.0) / double(delta.size()) : 0.0;
  for (size_t e = 0; e < bias.size(); ++e) bias[e] += delta[e] - shift;
}

}  // namespace primus
