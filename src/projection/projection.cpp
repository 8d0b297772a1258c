#include "projection/projection.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "parallel/data_parallel.h"
#include "pipeline/simulator.h"

namespace primus::projection {

Sharding parse_sharding(const std::string& s) {
  if (s == "no_shard") return Sharding::NoShard;
  if (s == "zero1" || s == "optim") return Sharding::Zero1;
  if (s == "zero2" || s == "optim_grads") return Sharding::Zero2;
  if (s == "fsdp" || s == "optim_grads_params") return Sharding::Fsdp;
  fail("--sharding '{}' is not one of: no_shard, zero1 (optim), zero2 (optim_grads), fsdp (optim_grads_params)", s);
}

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::NoShard: return "no_shard";
    case Sharding::Zero1: return "zero1";
    case Sharding::Zero2: return "zero2";
    case Sharding::Fsdp: return "fsdp";
  }
  return "?";
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

// The parts of one chunk of a rank, in model order.
struct Chunk {
  int stage = 0;
  int64_t layers = 0;
  bool embedding = false, head = false;
  int64_t first_layer = 0;  // the model's index of its first decoder layer
};

std::vector<Chunk> chunks_of(const Projection& p, int pp_rank) {
  const auto& L = p.layout;
  std::vector<Chunk> out;
  if (!L.schedule) {
    out.push_back({0, L.stages.front().num_layers, true, true, 0});
    return out;
  }
  const int stages = L.pp * L.vpp;
  for (int c = 0; c < L.vpp; ++c) {
    const int st = L.schedule->stage_of(pp_rank, c);
    int64_t first = 0;
    for (int i = 0; i < st; ++i) first += L.stages[size_t(i)].num_layers;
    out.push_back({st, L.stages[size_t(st)].num_layers, st == 0, st == stages - 1, first});
  }
  return out;
}

struct ChunkWork {
  std::vector<PartWork> parts;  // embedding, layers, head as present
  double kept_f = 0, kept_b = 0, peak_f = 0, peak_b = 0, peak_bw_fused = 0;
};

ChunkWork chunk_work(const ModelSpec& spec, const WorkloadShape& w, const Chunk& c) {
  ChunkWork cw;
  if (c.embedding) cw.parts.push_back(embedding_work(spec, w));
  if (c.layers > 0) {
    const PartWork dense = layer_work(spec, w, false);
    std::optional<PartWork> moe;
    for (int64_t i = 0; i < c.layers; ++i) {
      if (!spec.is_moe_layer(c.first_layer + i)) {
        cw.parts.push_back(dense);
        continue;
      }
      if (!moe) moe = layer_work(spec, w, true);
      cw.parts.push_back(*moe);
    }
  }
  if (c.head) cw.parts.push_back(head_work(spec, w));
  const size_t n = cw.parts.size();
  double before = 0;
  for (size_t k = 0; k < n; ++k) {  // F in model order
    cw.peak_f = std::max(cw.peak_f, before + cw.parts[k].peak_in_f);
    before += cw.parts[k].kept_after_f;
  }
  cw.kept_f = before;
  // B in reverse: the parts below still hold their F context, those above their B outputs (a
  // chunk's B runs whole before its W); in the fused backward each part's W frees it at once.
  double after = 0;
  for (size_t k = n; k-- > 0;) {
    before -= cw.parts[k].kept_after_f;
    cw.peak_b = std::max(cw.peak_b, before + cw.parts[k].peak_in_b + after);
    cw.peak_bw_fused = std::max(cw.peak_bw_fused, before + cw.parts[k].peak_in_b);
    after += cw.parts[k].kept_after_b;
  }
  cw.kept_b = after;
  return cw;
}

// Links of the groups inside a pass.
struct PassLinks {
  int tp = 1, cp = 1, ep = 1;
  Link tp_link, cp_link, ep_link;
};

double pass_seconds(const PassWork& pw, OpTimer& timer, const PassLinks& g, double* comm) {
  double t = 0;
  std::vector<double> op_s;
  for (const OpSpec& o : pw.ops) op_s.push_back(timer.seconds(o)), t += op_s.back();
  double c = 0;
  for (const CommSpec& x : pw.comms) {
    const double s = x.cp   ? comm_seconds(x.op, x.bytes, g.cp, g.cp_link)
                     : x.ep ? comm_seconds(x.op, x.bytes, g.ep, g.ep_link)
                            : comm_seconds(x.op, x.bytes, g.tp, g.tp_link);
    double hidden = 0;  // the ops that compute while it is in flight
    for (int i = x.hide_first; i < x.hide_end; ++i) hidden += op_s[size_t(i)];
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
  p.layout = train::plan_layout(a, cfg.model_spec, p.nodes * p.gpus_per_node);
  p.sharding = t.sharding ? *t.sharding : parse_sharding(config::choice_name(p.layout.sharding));  // the trainer's resolution
  p.shape.micro_batch_size = a.micro_batch_size;
  p.shape.seq_length = a.seq_length;
  p.shape.tp = p.layout.tp;
  p.shape.sequence_parallel = p.layout.sequence_parallel;
  p.shape.cp = p.layout.cp;
  p.shape.cp_a2a = p.layout.cp_all_to_all;
  p.shape.ep = int(a.expert_model_parallel_size);
  p.shape.ep_allgather = cfg.model_spec.moe_token_dispatcher_type == "allgather";
  p.shape.etp = p.layout.etp;
  if (p.spec.is_moe() && p.layout.dp % p.shape.ep != 0)
    fail("projection: expert_model_parallel_size {} must divide the data-parallel size {}", p.shape.ep, p.layout.dp);
  p.shape.recompute = a.recompute_granularity;
  p.shape.precision = a.bf16 ? Precision::Bf16 : Precision::Fp32;
  return p;
}

namespace {

struct RankParams {
  int64_t count = 0, tensors = 0;
  int64_t experts = 0;  // of count: the routed experts' (reduced over dp / ep)
};

RankParams params_of(const Projection& p, const ModelSpec& m, int pp_rank) {
  RankParams r;
  const int tp = p.layout.tp;
  for (const Chunk& c : chunks_of(p, pp_rank)) {
    const int ep = p.shape.ep;
    for (int64_t i = 0; i < c.layers; ++i) {
      const bool moe = m.is_moe_layer(c.first_layer + i);
      r.count += layer_parameters(m, tp, moe, ep, p.shape.etp);
      r.tensors += layer_tensors(m, moe, ep);
      if (moe) r.experts += m.num_experts / ep * 3 * (m.expert_ffn() / p.shape.etp) * m.hidden_size;
    }
    if (c.embedding) r.count += embedding_parameters(m, tp), r.tensors += 1;
    if (c.head) {
      r.count += head_parameters(m, tp);
      r.tensors += m.untie_embeddings_and_output_weights ? 2 : 1;
      // A tied output layer on a stage without the embedding keeps its own copy of it.
      bool has_embedding = false;
      for (const Chunk& o : chunks_of(p, pp_rank)) has_embedding = has_embedding || o.embedding;
      if (!m.untie_embeddings_and_output_weights && !has_embedding) r.count += embedding_parameters(m, tp), r.tensors += 1;
    }
  }
  return r;
}

// The activations a rank holds at each op of its schedule: F keeps the chunk's context, B keeps
// what W needs, W frees it; the peak adds the op's own peak to what the other microbatches hold.
double walk_activations(const Projection& p, const std::vector<ChunkWork>& cw, int pp_rank, double* in_flight) {
  std::map<std::pair<int, int>, double> held;
  double total = 0, peak = 0;
  int alive = 0, peak_alive = 0;
  auto set = [&](int mb, int c, double v) {
    double& h = held[{mb, c}];
    total += v - h;
    if (h == 0 && v > 0) ++alive;
    if (h > 0 && v == 0) --alive;
    h = v;
  };
  auto note = [&](double v, int a) {
    if (v > peak) peak = v, peak_alive = a;
  };
  const auto& L = p.layout;
  if (!L.schedule) {  // one microbatch at a time: F, then B and W layer by layer (LlamaModel::backward)
    note(cw[0].peak_f, 1);
    note(cw[0].peak_bw_fused, 1);
  } else {
    for (const pipeline::Op& op : L.schedule->ranks[size_t(pp_rank)]) {
      const ChunkWork& c = cw[size_t(op.chunk)];
      const double mine = held.count({op.microbatch, op.chunk}) ? held[{op.microbatch, op.chunk}] : 0;
      if (op.type == pipeline::OpType::F) {
        note(total + c.peak_f, alive + 1);
        set(op.microbatch, op.chunk, c.kept_f);
      } else if (op.type == pipeline::OpType::B || op.type == pipeline::OpType::BW) {
        note(total - mine + c.peak_b, alive);
        set(op.microbatch, op.chunk, c.kept_b);
        if (op.type == pipeline::OpType::BW) set(op.microbatch, op.chunk, 0);
      } else {
        note(total, alive);
        set(op.microbatch, op.chunk, 0);
      }
    }
  }
  if (in_flight) *in_flight = peak_alive;
  return peak;
}

}  // namespace

void project_memory(Projection& p) {
  const ModelSpec& m = p.spec;
  const auto& L = p.layout;
  MemoryReport r;
  const bool bf16 = p.shape.precision == Precision::Bf16;
  const DType act = activation_dtype(p.shape.precision);
  const double a = double(dtype_size(act)), st = double(dtype_size(ops::stat_dtype(act)));
  const int dp = L.dp * L.cp;  // gradients are reduced and ZeRO shards over dp x cp
  for (int pr = 0; pr < L.pp; ++pr) {
    RankMemory rm;
    rm.pp_rank = pr;
    const RankParams rp = params_of(p, m, pr);
    rm.parameter_count = rp.count;
    // ParamStore aligns each tensor to 16 floats.
    const double P = double(rp.count) + 16.0 * double(rp.tensors);
    switch (p.sharding) {
      case Sharding::NoShard:
        rm.parameters = 4 * P;
        rm.gradients = 4 * P;
        rm.optimizer = 8 * P;
        break;
      case Sharding::Zero1:
        rm.parameters = 4 * P;
        rm.gradients = 4 * P;
        rm.optimizer = 8 * P / dp + (dp > 1 ? 4 * P / dp : 0);  // moments and the reduce-scatter's shard
        break;
      case Sharding::Zero2:
      case Sharding::Fsdp: {
        rm.parameters = 4 * P / dp;
        rm.gradients = 4 * P / dp;
        rm.optimizer = 8 * P / dp;
        // A unit's whole gradient before its reduce-scatter, with its wire buffers; under fsdp one
        // layer gathered for compute and the next prefetched (train/sharded_weights.h).
        const double layer = double(layer_parameters(m, L.tp));
        rm.buffers += 2 * layer * 4;
        if (p.sharding == Sharding::Fsdp) rm.buffers += 2 * layer * a;
        break;
      }
    }
    // The working copy: whole (bf16, or fp32 beside a sharded master under zero2), or a shard.
    if (p.sharding == Sharding::Fsdp)
      rm.working_weights = bf16 ? 2 * P / dp : 0;
    else if (p.sharding == Sharding::Zero2)
      rm.working_weights = (bf16 ? 2 * P : 4 * P) + (bf16 ? 2 * P / dp : 0);
    else
      rm.working_weights = bf16 ? 2 * P : 0;
    // RoPE tables: cos and sin for every position.
    rm.buffers += 2.0 * double(m.max_position_embeddings) * double(m.head_dim() / 2) * st;
    if (L.schedule) {  // the executor's posted receives (4) and a send in flight, one message each
      const double msg = double(L.sequence_parallel ? p.shape.micro_batch_size * p.shape.seq_length / L.cp / L.tp
                                                    : p.shape.micro_batch_size * p.shape.seq_length / L.cp) *
                         double(m.hidden_size) * a;
      rm.buffers += 5 * msg;
    }
    std::vector<ChunkWork> cw;
    for (const Chunk& c : chunks_of(p, pr)) cw.push_back(chunk_work(m, p.shape, c));
    rm.activations = walk_activations(p, cw, pr, &rm.peak_in_flight);
    rm.peak = rm.parameters + rm.working_weights + rm.gradients + rm.optimizer + rm.activations + rm.buffers;
    r.per_rank.push_back(rm);
  }
  if (!p.hardware.measured && p.hardware.memory_gb > 0) {
    r.capacity = p.hardware.memory_gb * double(1u << 30);
    for (const auto& rm : r.per_rank) r.fits = r.fits && rm.peak <= r.capacity;
  }
  if (p.sharding == Sharding::Fsdp || p.sharding == Sharding::Zero2)
    r.notes.push_back("zero2 / fsdp: the transient unit buffers are modelled as two layers; not checked against a run");
  r.notes.push_back("no allocator fragmentation or framework overhead is added: leave headroom");
  p.memory = r;
}

void project_performance(Projection& p, OpTimer& timer) {
  const ModelSpec& m = p.spec;
  const auto& L = p.layout;
  const config::TrainingArgs& args = p.args;
  PerformanceReport r;
  r.timing = timer.describe();
  const DType act = activation_dtype(p.shape.precision);
  const double a = double(dtype_size(act));
  // Links: tp ranks are neighbours, cp ranks tp apart, dp ranks tp x cp apart, pp ranks tp x cp x
  // dp apart. Gradients are reduced over dp x cp (the dp_cp group, ranks tp apart).
  const Link tp_link = link_for(p, L.tp, 1, 0.7);
  const Link cp_link = link_for(p, L.cp, L.tp, 0.7);
  const int dpc = L.dp * L.cp;
  const Link dp_link = link_for(p, dpc, L.tp, 0.7);
  const Link pp_link = link_for(p, 2, L.tp * L.cp * L.dp, 0.8);
  const int ep = p.shape.ep;  // consecutive dp ranks: tp x cp apart
  const PassLinks links{L.tp, L.cp, ep, tp_link, cp_link, link_for(p, ep, L.tp * L.cp, 0.7)};
  const int64_t local = p.shape.micro_batch_size * p.shape.seq_length / L.cp;
  const int64_t rows = L.sequence_parallel ? local / L.tp : local;
  r.p2p_s = L.pp > 1 ? comm_seconds("p2p", double(rows) * double(m.hidden_size) * a, 2, pp_link) : 0;
  // F, B, W of every stage (a chunk of a rank).
  const int stages = L.pp * L.vpp;
  std::map<int, ChunkWork> by_stage;
  for (int pr = 0; pr < L.pp; ++pr)
    for (const Chunk& c : chunks_of(p, pr)) {
      ChunkWork cw = chunk_work(m, p.shape, c);
      StageTimes t;
      t.stage = c.stage;
      for (const PartWork& part : cw.parts) {
        t.f += pass_seconds(part.f, timer, links, &t.tp_comm);
        t.b += pass_seconds(part.b, timer, links, &t.tp_comm);
        t.w += pass_seconds(part.w, timer, links, &t.tp_comm);
      }
      r.stages.push_back(t);
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
  (void)stages;
  // After the pipeline: each pp rank reduces its gradients over dp and steps its optimizer.
  double tail = 0;
  for (int pr = 0; pr < L.pp; ++pr) {
    const RankParams rp = params_of(p, m, pr);
    const double P = double(rp.count) + 16.0 * double(rp.tensors);
    double dp_total = 0, dp_exposed = 0;
    if (dpc > 1) {
      const double grads = 4 * P;
      const bool sharded = p.sharding != Sharding::NoShard;
      double reduce = comm_seconds(sharded ? "reduce_scatter" : "all_reduce", grads, dpc, dp_link);
      if (ep > 1)  // the experts' gradients are summed over the expert-data-parallel group only
        reduce = comm_seconds(sharded ? "reduce_scatter" : "all_reduce", 4 * (P - double(rp.experts)), dpc, dp_link) +
                 comm_seconds("all_reduce", 4 * double(rp.experts), dpc / ep, dp_link);
      double gather = sharded ? comm_seconds("all_gather", 4 * P, dpc, dp_link) : 0;
      const double work_bytes = p.shape.precision == Precision::Bf16 ? 2.0 : 4.0;
      const double micro = double(L.microbatches_per_rank);
      // zero2 / fsdp reduce-scatter each unit after each microbatch's W passes; fsdp gathers the
      // working weights for every forward and every backward, zero2 once after the step.
      if (p.sharding == Sharding::Zero2 || p.sharding == Sharding::Fsdp) {
        reduce *= micro;
        gather = comm_seconds("all_gather", work_bytes * P, dpc, dp_link) * (p.sharding == Sharding::Fsdp ? 2 * micro : 1);
      }
      const int64_t bucket = args.ddp_bucket_size > 0 ? args.ddp_bucket_size : parallel::default_bucket_size(dpc);
      const int64_t nb = std::max<int64_t>(1, (rp.count + bucket - 1) / bucket);
      double exposed = reduce;
      if (args.overlap_grad_reduce && nb > 1 && (p.sharding == Sharding::NoShard || p.sharding == Sharding::Zero1)) {
        // Buckets start as the last microbatch's W passes finish: they overlap that backward.
        double window = 0;
        for (const Chunk& c : chunks_of(p, pr))
          for (const StageTimes& t : r.stages)
            if (t.stage == c.stage) window += t.b + t.w;
        window *= double(nb - 1) / double(nb);
        exposed = std::max(reduce / double(nb), reduce - window);
      }
      dp_total = reduce + gather;
      dp_exposed = exposed + gather;
      if (p.sharding == Sharding::Zero2 || p.sharding == Sharding::Fsdp) {
        // Per unit and microbatch, beside the passes: hidden behind the rank's F, B and W of the
        // step (prefetch and reductions in flight), except what exceeds them and, under fsdp, the
        // gather of the first unit of each pass, which nothing precedes.
        double window = 0;
        int64_t layers = 0;
        for (const Chunk& c : chunks_of(p, pr)) {
          layers += c.layers;
          for (const StageTimes& t : r.stages)
            if (t.stage == c.stage) window += micro * (t.f + t.b + t.w);
        }
        const double per_step_gather = p.sharding == Sharding::Zero2 ? gather : 0;  // after the step: exposed
        const double overlappable = dp_total - per_step_gather;
        const double first = p.sharding == Sharding::Fsdp ? gather / double(std::max<int64_t>(1, layers + 2)) : 0;
        dp_exposed = per_step_gather + std::max(first, overlappable - window);
      }
    }
    const bool bf16 = p.shape.precision == Precision::Bf16;
    const double local = p.sharding == Sharding::NoShard ? P : P / dpc;
    const double opt = timer.optimizer_seconds(int64_t(local), bf16) + timer.grad_norm_seconds(int64_t(local)) +
                       timer.zero_grad_seconds(int64_t(P));
    // Small collectives: the loss over pp and dp, the norm over mp (and dp), the tied embedding
    // over its two stages, sequence parallel's norm weights over tp (one per tensor).
    double other = comm_seconds("all_reduce", 8, L.pp, pp_link) + comm_seconds("all_reduce", 8, dpc, dp_link) +
                   comm_seconds("all_reduce", 8, L.tp * L.pp, pp_link);
    if (!m.untie_embeddings_and_output_weights && L.pp > 1)
      other += comm_seconds("all_reduce", 4.0 * double(embedding_parameters(m, L.tp)), 2, pp_link);
    if (L.sequence_parallel) {
      int64_t layers = 0;
      for (const Chunk& c : chunks_of(p, pr)) layers += c.layers;
      other += double(2 * layers + 1) * comm_seconds("all_reduce", 4.0 * double(m.hidden_size), L.tp, tp_link);
    }
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
  if (p.sharding == Sharding::Fsdp || p.sharding == Sharding::Zero2)
    r.notes.push_back("zero2 / fsdp: a reduce-scatter per unit and microbatch and (fsdp) a gather per forward and "
                      "backward, hidden behind the step's compute up to its length (GPU streams; on 2 CPU cores only "
                      "9-20% was hidden, docs/context_parallel.md); not checked against a GPU run");
  p.performance = r;
}

}  // namespace primus::projection
