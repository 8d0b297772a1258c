#include "plan/gemm_list.h"

#include <map>
#include <regex>

#include <fmt/format.h>

#include "plan/model_walk.h"

namespace primus::plan {

namespace {

// "decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight" -> "mlp.experts.linear_fc1"; an MTP
// depth's "mtp.layers.0.transformer_layer.mlp.linear_fc1.weight" -> "mtp.mlp.linear_fc1" (apart).
std::string label(const std::string& name) {
  static const std::regex layer(R"(^decoder\.layers\.\d+\.)"), mtp(R"(^mtp\.layers\.\d+\.(transformer_layer\.)?)"),
      expert(R"(\.local_experts\.\d+)"), suffix(R"(\.(weight|bias)$)");
  if (name.empty()) return "gemm";
  std::string s = std::regex_replace(name, layer, "");
  s = std::regex_replace(s, mtp, "mtp.");
  s = std::regex_replace(s, expert, "");
  return std::regex_replace(s, suffix, "");
}

}  // namespace

std::string fp8_operands_name(const GemmEntry& g) {
  if (!g.fp8) return "";
  const auto& [a, b] = *g.fp8;
  return fmt::format("{} {} x {} {}", fp8::format_name(a.format), fp8::granularity_name(a.granularity),
                     fp8::format_name(b.format), fp8::granularity_name(b.granularity));
}

std::string op_name(bool trans_a, bool trans_b) {
  return fmt::format("{}{}", trans_a ? 'T' : 'N', trans_b ? 'T' : 'N');
}

std::string types_name(const GemmEntry& g) {
  return fmt::format("{}>{}", g.fp8 ? "fp8" : dtype_name(g.in), dtype_name(g.out));
}

std::string extras_name(const GemmEntry& g) { return std::string(g.bias ? "+bias" : "") + (g.accumulate ? "+C" : ""); }

std::string gemm_label(const GemmEntry& g) {
  const std::string extras = extras_name(g);
  return fmt::format("{} {}x{}x{} {}{}{}", op_name(g.trans_a, g.trans_b), g.m, g.n, g.k, types_name(g),
                     extras.empty() ? "" : " ", extras);
}

namespace {

const char* kind(const ops::OpCall& c) { return c.trans_a ? "weight grad" : c.trans_b ? "forward" : "input grad"; }

class Merger {
 public:
  explicit Merger(std::vector<GemmEntry>& out) : out_(out) {}
  void add(const GemmEntry& g) {
    // The FP8 operands by name (their coarsest scaling follows from them; "" without FP8).
    const std::string key = fmt::format("{}|{}{}|{}x{}x{}|{}{}|{}|{}{}{}|{}", g.what, g.trans_a, g.trans_b, g.m, g.n,
                                        g.k, int(g.in), int(g.out), fp8_operands_name(g), g.bias, g.accumulate,
                                        g.grouped, g.groups);
    auto [it, fresh] = index_.emplace(key, out_.size());
    if (fresh) {
      out_.push_back(g);
      out_.back().count = 0;
    }
    out_[it->second].count += g.count;
  }

 private:
  std::vector<GemmEntry>& out_;
  std::map<std::string, size_t> index_;
};

}  // namespace

GemmList model_gemms(const ModelSpec& spec, const ParallelLayout& L, const config::TrainingArgs& a,
                     const LlamaOptions* options) {
  GemmList list;
  list.model = spec.name;
  list.precision = a.bf16 ? Precision::Bf16 : Precision::Fp32;
  RankShape shape = rank_shape(spec, L, a, list.precision);
  if (options) shape.options = *options;
  // Every stage, in model order, on one rank: the GEMMs of one microbatch through the pipeline.
  const int stages = int(L.stages.size());
  for (int s = 0; s < stages; ++s)
    shape.chunks.push_back({L.stages[size_t(s)].first_layer, L.stages[size_t(s)].num_layers, s == 0, s == stages - 1});
  const RankRecord rec = walk_rank(spec, shape);
  list.micro_batch = shape.micro_batch_size;
  list.seq = shape.seq_length;
  list.rows = rec.message.empty() ? 0 : shape.micro_batch_size * shape.seq_length / shape.cp;
  list.microbatches = L.microbatches_per_rank;
  list.recompute = shape.options.recompute == Recompute::Full;
  Merger gemms(list.gemms), grouped(list.grouped);
  for (const ChunkRecord& ch : rec.chunks)
    for (const PassRecord* pass : {&ch.f, &ch.b, &ch.w})
      for (size_t i = 0; i < pass->ops.size(); ++i) {
        const ops::OpCall& c = pass->ops[i];
        const std::string op = c.op;
        if (op != "gemm" && op != "grouped_gemm") continue;
        GemmEntry g;
        g.what = label(rec.param_name(pass->params[i])) + " " + kind(c);
        g.trans_a = c.trans_a, g.trans_b = c.trans_b;
        g.in = c.dtype, g.out = c.out;
        g.fp8 = c.fp8;
        g.bias = c.bias, g.accumulate = c.accumulate;
        g.count = 1;
        if (op == "gemm") {
          g.m = c.a, g.n = c.b, g.k = c.c;
          gemms.add(g);
          continue;
        }
        g.what += " (grouped)";
        g.grouped = true;
        for (const auto& [m, n, k] : c.problems) {
          g.m = m, g.n = n, g.k = k;
          gemms.add(g);
        }
        g.m = c.a, g.n = c.b, g.k = c.c, g.groups = c.d;  // the call as the profiler records it
        grouped.add(g);
      }
  return list;
}

}  // namespace primus::plan
