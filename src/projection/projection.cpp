#include "projection/projection.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "model/moe.h"
#include "parallel/data_parallel.h"
#include "pipeline/simulator.h"

namespace primus::projection {

DpSharding parse_sharding(const std::string& s) {
  if (s == "zero1") return DpSharding::Optim;
  if (s == "zero2") return DpSharding::OptimGrads;
  if (s == "fsdp") return DpSharding::OptimGradsParams;
  const std::optional<DpSharding> v = config::find_choice<DpSharding>(s);
  if (!v || *v == DpSharding::Unset)
    fail("--sharding '{}' is not one of: no_shard, zero1 (optim), zero2 (optim_grads), fsdp (optim_grads_params)", s);
  return *v;
}

const char* sharding_name(DpSharding s) {
  switch (s) {
    case DpSharding::Optim: return "zero1";
    case DpSharding::OptimGrads: return "zero2";
    case DpSharding::OptimGradsParams: return "fsdp";
    default: return config::choice_name(s);
  }
}

double comm_seconds(const std::string& op, double bytes, int n, const Link& link) {
  if (n <= 1 || link.gbs <= 0) return 0.0;
  const double bw = link.gbs * 1e9, lat = link.latency_us * 1e-6, f = double(n - 1) / double(n);
  if (op == "all_reduce") return 2 * (n - 1) * lat + 2 * f * bytes / bw;
  if (op == "reduce_scatter" || op == "all_gather" || op == "all_to_all") return (n - 1) * lat + f * bytes / bw;
  return lat + bytes / bw;  // point-to-point, broadcast
}

Link measure_link(parallel::ProcessGroup& g) {
  const int n = g.size();
  auto mean_seconds = [&](std::vector<float>& buf, int reps) {
    g.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) g.all_reduce(buf);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  std::vector<float> small(2, 1.0f), big(size_t(1) << 20, 1.0f);
  // Long enough (half a second) to see the latency a shared machine's scheduler adds now and then;
  // the ranks agree on the count.
  const double first = mean_seconds(small, 200);
  const int reps = int(g.all_reduce_value(int64_t(std::clamp(0.5 / std::max(first, 1e-7), 200.0, 200000.0)),
                                          parallel::ReduceOp::Max));
  const double t_small = mean_seconds(small, reps);
  mean_seconds(big, 1);
  const double t_big = mean_seconds(big, 16);
  Link l;
  l.name = "measured";
  if (n < 2) return l;
  const double steps = 2.0 * (n - 1), f = double(n - 1) / double(n), bytes = 4.0 * double(big.size());
  l.latency_us = 1e6 * t_small / steps;
  // A scheduler stall in the small all-reduces can make their mean rival the big one's: the
  // transfer then takes at least half of t_big (else the bandwidth came out absurd, 2e6 GB/s).
  l.gbs = 2 * f * bytes / std::max(t_big - t_small, 0.5 * t_big) / 1e9;
  // Every rank takes rank 0's numbers.
  std::vector<double> v = {l.latency_us, l.gbs};
  if (g.rank() != 0) v = {0, 0};
  g.all_reduce(v);
  l.latency_us = v[0], l.gbs = v[1];
  return l;
}

namespace {

// Links of the groups the passes communicate on.
struct PassLinks {
  int tp = 1, cp = 1, ep = 1;
  Link tp_link, cp_link, ep_link;
};

// A pass's time: its ops, and its collectives at their group's link, each exposed by what it
// outlasts of the ops that ran while it was in flight. A transfer costs once, at its receive.
double pass_seconds(const plan::PassRecord& pw, OpTimer& timer, const PassLinks& g, double* comm) {
  double t = 0;
  std::vector<double> op_s;
  for (const ops::OpCall& o : pw.ops) op_s.push_back(timer.seconds(o)), t += op_s.back();
  double c = 0;
  for (const parallel::CommCall& x : pw.comms) {
    const std::string op = x.op;
    if (op == "send" || op == "barrier") continue;
    const std::string kind = op == "recv" ? "p2p" : op;
    const double s = x.group == "cp"   ? comm_seconds(kind, x.bytes, g.cp, g.cp_link)
                     : x.group == "ep" ? comm_seconds(kind, x.bytes, g.ep, g.ep_link)
                                       : comm_seconds(kind, x.bytes, g.tp, g.tp_link);
    double hidden = 0;  // the ops that computed while it was in flight
    for (size_t i = x.issued; i < x.waited && i < op_s.size(); ++i) hidden += op_s[i];
    c += std::max(0.0, s - hidden);
  }
  if (comm) *comm += c;
  return t + c;
}

// Which link a group of `n` ranks, `stride` apart in the global order, crosses.
Link link_for(const Projection& p, int n, int stride, double efficiency) {
  const trace::Hardware& h = p.hardware;
  const bool inside = int64_t(n) * stride <= p.gpus_per_node;
  Link l{inside ? h.link_gbs : h.nic_gbs, inside ? h.link_latency_us : h.nic_latency_us,
         inside ? "intra-node" : "inter-node"};
  if (!h.measured) l.gbs *= efficiency;
  return l;
}

// What the data-parallel reduction and the optimizer see of a rank: its flat buffer (alignment
// gaps included), the routed experts' part of it, its decoder layers.
struct RankParams {
  double numel = 0, experts = 0;
  int64_t count = 0, layers = 0;
};

RankParams params_of(const plan::RankRecord& w, int ep) {
  RankParams r;
  r.numel = double(w.param_numel);
  for (const StoredParam& p : w.params) {
    r.count += p.numel;
    if (ep > 1 && is_expert_param(p.name)) r.experts += double(p.numel);
  }
  for (const plan::ChunkRecord& c : w.chunks) r.layers += c.chunk.num_layers;
  return r;
}

}  // namespace

Projection plan(const config::ExperimentConfig& cfg, const Target& t) {
  Projection p;
  p.model = cfg.model;
  p.spec = cfg.model_spec;
  p.args = cfg.train;
  p.hardware = t.hardware;
  const config::TrainingArgs& a = cfg.train;
  const int mp = int(a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size);
  if (mp < 1) fail("the parallel sizes must be at least 1");
  p.gpus_per_node = t.gpus_per_node > 0 ? t.gpus_per_node : t.hardware.measured ? mp : t.hardware.gpus_per_node;
  p.nodes = t.nodes > 0 ? t.nodes : (mp + p.gpus_per_node - 1) / p.gpus_per_node;
  p.layout = plan::plan_layout(a, cfg.model_spec, p.nodes * p.gpus_per_node);
  p.sharding = t.sharding ? *t.sharding : p.layout.sharding;  // the trainer's resolution by default
  p.precision = a.bf16 ? Precision::Bf16 : Precision::Fp32;
  const auto t0 = std::chrono::steady_clock::now();
  p.walks = plan::walk_ranks(p.spec, p.layout, a, p.precision, t.load);
  p.walk_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

void project_memory(Projection& p) {
  MemoryReport r;
  for (int pr = 0; pr < p.layout.pp; ++pr) {
    const plan::MemoryEstimate e = plan::estimate_rank_memory(p.walks[size_t(pr)], p.layout, p.args, p.sharding, pr);
    RankMemory rm;
    rm.pp_rank = pr;
    rm.parameter_count = e.parameters;
    rm.parameters = e.parameter_bytes;
    rm.working_weights = e.working_bytes;
    rm.gradients = e.gradient_bytes;
    rm.optimizer = e.optimizer_bytes;
    rm.activations = e.activation_bytes;
    rm.buffers = e.buffer_bytes;
    rm.peak = e.total_bytes();
    rm.peak_in_flight = e.peak_in_flight;
    // a GPU's state is copied to the host to be saved; this machine's CPU runs save from its own
    rm.save = plan::estimate_save_memory(p.walks[size_t(pr)], p.layout, p.args, p.sharding, !p.hardware.measured);
    r.per_rank.push_back(rm);
  }
  if (!p.hardware.measured && p.hardware.memory_gb > 0) {
    r.capacity = p.hardware.memory_gb * double(1u << 30);
    for (const auto& rm : r.per_rank) r.fits = r.fits && rm.peak <= r.capacity;
  }
  if (p.sharding == DpSharding::OptimGradsParams || p.sharding == DpSharding::OptimGrads)
    r.notes.push_back("zero2 / fsdp: the units' whole gradients in flight (three of the largest unit) and, under "
                      "fsdp, two gathered units are counted at the activations' peak");
  r.notes.push_back("no allocator fragmentation or framework overhead is added: leave headroom");
  p.memory = r;
}

void project_performance(Projection& p, OpTimer& timer) {
  const ModelSpec& m = p.spec;
  const auto& L = p.layout;
  const config::TrainingArgs& args = p.args;
  PerformanceReport r;
  r.timing = timer.describe();
  const double a = double(dtype_size(activation_dtype(p.precision)));
  // Links: tp ranks are neighbours, cp ranks tp apart, dp ranks tp x cp apart, pp ranks tp x cp x
  // dp apart. Gradients are reduced over dp x cp (the dp_cp group, ranks tp apart).
  const Link tp_link = link_for(p, L.tp, 1, 0.7);
  const Link cp_link = link_for(p, L.cp, L.tp, 0.7);
  const int dpc = L.dp * L.cp;
  const Link dp_link = link_for(p, dpc, L.tp, 0.7);
  const Link pp_link = link_for(p, 2, L.tp * L.cp * L.dp, 0.8);
  const int ep = L.ep;  // consecutive dp ranks: tp x cp apart
  const PassLinks links{L.tp, L.cp, ep, tp_link, cp_link, link_for(p, ep, L.tp * L.cp, 0.7)};
  const std::vector<int64_t> message = p.walks.front().message;
  r.p2p_s = L.pp > 1 ? comm_seconds("p2p", double(message[0]) * double(message[1]) * a, 2, pp_link) : 0;
  // F, B, W of every stage (a chunk of a rank).
  for (int pr = 0; pr < L.pp; ++pr) {
    const plan::RankRecord& w = p.walks[size_t(pr)];
    for (size_t c = 0; c < w.chunks.size(); ++c) {
      const plan::ChunkRecord& ch = w.chunks[c];
      StageTimes t;
      t.stage = L.schedule ? L.schedule->stage_of(pr, int(c)) : 0;
      t.f = pass_seconds(ch.f, timer, links, &t.tp_comm);
      t.b = pass_seconds(ch.b, timer, links, &t.tp_comm);
      t.w = pass_seconds(ch.w, timer, links, &t.tp_comm);
      r.stages.push_back(t);
    }
  }
  std::sort(r.stages.begin(), r.stages.end(), [](const StageTimes& x, const StageTimes& y) { return x.stage < y.stage; });
  const double m_local = double(L.microbatches_per_rank);
  if (L.schedule) {
    pipeline::Costs c;
    c.pair_overlap = 0;  // the runner runs an overlapped pair's passes one after the other
    c.t_comm = r.p2p_s;
    for (const StageTimes& t : r.stages)
      c.stages.push_back({std::max(t.f, 1e-9), std::max(t.b, 1e-9), std::max(t.w, 1e-9)});
    const pipeline::SimResult sim = pipeline::simulate(*L.schedule, c);
    r.pipeline_s = sim.makespan;
    r.bubble = sim.bubble_rate;
  } else {
    r.pipeline_s = m_local * (r.stages[0].f + r.stages[0].b + r.stages[0].w);
  }
  // After the pipeline: each pp rank reduces its gradients over dp and steps its optimizer.
  double tail = 0;
  for (int pr = 0; pr < L.pp; ++pr) {
    const RankParams rp = params_of(p.walks[size_t(pr)], ep);
    const double P = rp.numel;
    double dp_total = 0, dp_exposed = 0;
    if (dpc > 1) {
      const double grads = 4 * P;
      const bool sharded = p.sharding != DpSharding::NoShard;
      double reduce = comm_seconds(sharded ? "reduce_scatter" : "all_reduce", grads, dpc, dp_link);
      if (ep > 1)  // the experts' gradients are summed over the expert-data-parallel group only
        reduce = comm_seconds(sharded ? "reduce_scatter" : "all_reduce", 4 * (P - rp.experts), dpc, dp_link) +
                 comm_seconds("all_reduce", 4 * rp.experts, dpc / ep, dp_link);
      double gather = sharded ? comm_seconds("all_gather", 4 * P, dpc, dp_link) : 0;
      const double work_bytes = p.precision == Precision::Bf16 ? 2.0 : 4.0;
      const double micro = double(L.microbatches_per_rank);
      // zero2 / fsdp reduce-scatter each unit after each microbatch's W passes (once per step with
      // reduce_sharded_grads_once_per_step); fsdp gathers the working weights for every forward and
      // every backward (once per microbatch with torch_fsdp2_reshard_after_forward false), zero2
      // once after the step (train/sharded_weights.h).
      if (p.sharding == DpSharding::OptimGrads || p.sharding == DpSharding::OptimGradsParams) {
        if (!args.reduce_sharded_grads_once_per_step) reduce *= micro;
        const double gathers = args.torch_fsdp2_reshard_after_forward ? 2 * micro : micro;
        gather = comm_seconds("all_gather", work_bytes * P, dpc, dp_link) *
                 (p.sharding == DpSharding::OptimGradsParams ? gathers : 1);
      }
      const int64_t bucket = args.ddp_bucket_size > 0 ? args.ddp_bucket_size : parallel::default_bucket_size(dpc);
      const int64_t nb = std::max<int64_t>(1, (rp.count + bucket - 1) / bucket);
      double exposed = reduce;
      if (args.overlap_grad_reduce && nb > 1 &&
          (p.sharding == DpSharding::NoShard || p.sharding == DpSharding::Optim)) {
        // Buckets start as the last microbatch's W passes finish: they overlap that backward.
        double window = 0;
        for (size_t c = 0; c < p.walks[size_t(pr)].chunks.size(); ++c)
          for (const StageTimes& t : r.stages)
            if (t.stage == (L.schedule ? L.schedule->stage_of(pr, int(c)) : 0)) window += t.b + t.w;
        window *= double(nb - 1) / double(nb);
        exposed = std::max(reduce / double(nb), reduce - window);
      }
      dp_total = reduce + gather;
      dp_exposed = exposed + gather;
      if (p.sharding == DpSharding::OptimGrads || p.sharding == DpSharding::OptimGradsParams) {
        // Per unit and microbatch, beside the passes: hidden behind the rank's F, B and W of the
        // step (prefetch and reductions in flight), except what exceeds them and, under fsdp, the
        // gather of the first unit of each pass, which nothing precedes.
        double window = 0;
        for (size_t c = 0; c < p.walks[size_t(pr)].chunks.size(); ++c)
          for (const StageTimes& t : r.stages)
            if (t.stage == (L.schedule ? L.schedule->stage_of(pr, int(c)) : 0)) window += micro * (t.f + t.b + t.w);
        const double per_step_gather = p.sharding == DpSharding::OptimGrads ? gather : 0;  // after the step: exposed
        const double overlappable = dp_total - per_step_gather;
        const double first = p.sharding == DpSharding::OptimGradsParams
                                 ? gather / double(std::max<int64_t>(1, rp.layers + 2))
                                 : 0;
        dp_exposed = per_step_gather + std::max(first, overlappable - window);
      }
    }
    const bool bf16 = p.precision == Precision::Bf16;
    const double local = p.sharding == DpSharding::NoShard ? P : P / dpc;
    const double opt = timer.optimizer_seconds(int64_t(local), bf16) + timer.grad_norm_seconds(int64_t(local)) +
                       timer.zero_grad_seconds(int64_t(P));
    // Small collectives: the loss over pp and dp, the norm over mp (and dp), the tied embedding
    // over its two stages, sequence parallel's norm weights over tp (one per tensor).
    double other = comm_seconds("all_reduce", 8, L.pp, pp_link) + comm_seconds("all_reduce", 8, dpc, dp_link) +
                   comm_seconds("all_reduce", 8, L.tp * L.pp, pp_link);
    if (!m.untie_embeddings_and_output_weights && L.pp > 1)
      other += comm_seconds("all_reduce", 4.0 * double(m.vocab_size / L.tp) * double(m.hidden_size), 2, pp_link);
    if (L.sequence_parallel)
      other += double(2 * rp.layers + 1) * comm_seconds("all_reduce", 4.0 * double(m.hidden_size), L.tp, tp_link);
    if (dp_exposed + opt + other > tail) {
      tail = dp_exposed + opt + other;
      r.dp_total_s = dp_total;
      r.dp_exposed_s = dp_exposed;
      r.optimizer_s = opt;
      r.other_s = other;
    }
  }
  r.step_s = r.pipeline_s + tail;
  const double tokens = double(args.global_batch_size) * double(args.seq_length);
  r.tokens_per_s = tokens / r.step_s;
  const double fpt = model_stats(m, args.seq_length).flops_per_token;
  r.tflops_per_gpu = fpt * r.tokens_per_s / double(L.world_size) / 1e12;
  r.mfu = p.hardware.peak_tflops > 0 ? r.tflops_per_gpu / p.hardware.peak_tflops : 0;
  if (p.sharding == DpSharding::OptimGradsParams || p.sharding == DpSharding::OptimGrads)
    r.notes.push_back("zero2 / fsdp: a reduce-scatter per unit and microbatch and (fsdp) a gather per forward and "
                      "backward, hidden behind the step's compute up to its length (GPU streams; on 2 CPU cores only "
                      "9-20% was hidden, docs/context_parallel.md); not checked against a GPU run");
  p.performance = r;
}

}  // namespace primus::projection
