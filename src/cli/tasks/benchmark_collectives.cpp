// `benchmark collectives` (alias `benchmark rccl`, Primus's name): all_reduce, all_gather,
// reduce_scatter, alltoall, broadcast and send/recv over a size sweep, with nccl-tests' algorithm
// and bus bandwidth (parallel/collective_bench.h), on the CPU through MPI or on GPUs through NCCL,
// over the world or any group of a parallel layout:
//
//   primus-cli direct --nproc 8 -- benchmark collectives --tp 2 --pp 2 --group dp --check
//
// Every group of the chosen kind runs at once (as in training); rank 0 reports its own group.
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/registry.h"
#include "cli/tasks/bench_common.h"
#include "core/error.h"
#include "parallel/collective_bench.h"
#include "parallel/mesh.h"
#include "parallel/mpi_process_group.h"
#ifdef PRIMUS_HAVE_CUDA
#include "parallel/nccl_process_group.h"
#endif

namespace primus::cli {
namespace benchmark_collectives_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

using parallel::CollOp;
using parallel::CollResult;

struct Options {
  std::vector<std::string> ops, dtypes{"float32"};
  std::string min_bytes = "1K", max_bytes = "4M", group = "world", format = "text", output, device = "auto";
  double step_factor = 2;
  int tp = 1, cp = 1, pp = 1, ep = 1;
  int warmup = 5, iters = 20;
  bool check = false;
};

parallel::MeshDim parse_group(const std::string& g) {
  std::vector<std::string> names{"world"};
  for (parallel::MeshDim d : parallel::kAllMeshDims) {
    names.push_back(parallel::mesh_dim_name(d));
    if (g == parallel::mesh_dim_name(d)) return d;
  }
  fail("--group '{}' is not one of: {}{}", g, fmt::join(names, ", "), did_you_mean(g, names));
}

std::string text_table(const std::vector<CollResult>& rs, bool markdown) {
  std::string s;
  if (markdown) {
    s += "| op | size (B) | count | type | time (us) | algbw (GB/s) | busbw (GB/s) | #wrong |\n";
    s += "|---|---:|---:|---|---:|---:|---:|---:|\n";
  } else {
    s += fmt::format("{:>15} {:>12} {:>11} {:>9} {:>11} {:>12} {:>12} {:>7}\n", "op", "size(B)", "count", "type",
                     "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  }
  for (const auto& r : rs) {
    const std::string wrong = r.checked ? std::to_string(r.wrong) : "N/A";
    const char* type = dtype_name(r.dtype);
    if (markdown)
      s += fmt::format("| {} | {} | {} | {} | {:.2f} | {:.3f} | {:.3f} | {} |\n", parallel::coll_op_name(r.op), r.bytes,
                       r.count, type, r.seconds * 1e6, r.algbw_gbs, r.busbw_gbs, wrong);
    else
      s += fmt::format("{:>15} {:>12} {:>11} {:>9} {:>11.2f} {:>12.3f} {:>12.3f} {:>7}\n", parallel::coll_op_name(r.op),
                       r.bytes, r.count, type, r.seconds * 1e6, r.algbw_gbs, r.busbw_gbs, wrong);
  }
  return s;
}

nlohmann::json to_json(const CollResult& r) {
  nlohmann::json j{{"op", parallel::coll_op_name(r.op)},
                   {"dtype", dtype_name(r.dtype)},
                   {"ranks", r.ranks},
                   {"bytes", r.bytes},
                   {"count", r.count},
                   {"time_us", r.seconds * 1e6},
                   {"algbw_gbs", r.algbw_gbs},
                   {"busbw_gbs", r.busbw_gbs}};
  if (r.checked) j["wrong"] = r.wrong;
  return j;
}

// The world's group (MPI, or NCCL on GPUs) and the one the benchmark runs on.
struct Groups {
  std::unique_ptr<parallel::ProcessGroup> nccl_world;
  parallel::MeshGroups mesh_groups;
  parallel::ProcessGroup* world = nullptr;
  parallel::ProcessGroup* bench = nullptr;
  std::string device;
};

Groups make_groups(const Options& o, const parallel::RankMesh& mesh) {
  Groups g;
  g.world = &parallel::mpi_world();
  g.device = "cpu (MPI)";
  if (bench::resolve_device(o.device) == bench::BenchDevice::CUDA) {
#ifdef PRIMUS_HAVE_CUDA
    g.device = bench::init_cuda() + " (NCCL)";
    g.nccl_world = parallel::NcclProcessGroup::create(*g.world, "world");
    g.world = g.nccl_world.get();
#endif
  }
  if (o.group == "world") {
    g.bench = g.world;
    return g;
  }
  const parallel::MeshDim dim = parse_group(o.group);
  g.mesh_groups = parallel::build_groups(mesh, *g.world);
  g.bench = &g.mesh_groups.get(dim);
  return g;
}

int run(const Options& o) {
  if (o.warmup < 0 || o.iters < 1) fail("--warmup must be >= 0 and --iters >= 1");
  if (o.format != "text" && o.format != "markdown" && o.format != "json")
    fail("--format must be text, markdown or json, got '{}'", o.format);
  if (o.group != "world") parse_group(o.group);  // a typo fails before any rank waits
  std::vector<CollOp> ops;
  for (const auto& name : o.ops) ops.push_back(parallel::parse_coll_op(name));
  if (ops.empty()) ops.assign(std::begin(parallel::kAllCollOps), std::end(parallel::kAllCollOps));
  std::vector<DType> dtypes;
  for (const auto& d : o.dtypes) dtypes.push_back(parallel::parse_coll_dtype(d));
  const std::vector<int64_t> sizes = parallel::size_sweep(parallel::parse_byte_size(o.min_bytes),
                                                          parallel::parse_byte_size(o.max_bytes), o.step_factor);
  auto& mpi = parallel::mpi_world();
  const parallel::RankMesh mesh(mpi.size(), {o.tp, o.cp, o.pp, o.ep});
  Groups g = make_groups(o, mesh);
  parallel::ProcessGroup& pg = *g.bench;

  std::vector<CollResult> results;
  for (DType t : dtypes)
    for (CollOp op : ops)
      for (int64_t bytes : sizes) {
        if (parallel::elements_per_rank(op, bytes, t, pg.size()) == 0) continue;  // below one element per rank
        results.push_back(parallel::run_collective(pg, op, t, bytes, {o.warmup, o.iters, o.check}));
      }
  int64_t wrong = 0;
  for (const auto& r : results) wrong += r.wrong;
  if (mpi.rank() != 0) return wrong ? 1 : 0;

  const std::string head = fmt::format(
      "benchmark collectives: group {} ({} of {} ranks; layout {}), {}; {} timed runs after {} warm-up; every {} "
      "group runs at once",
      o.group, pg.size(), mpi.size(), mesh.describe(), g.device, o.iters, o.warmup, o.group);
  std::string text;
  if (o.format == "json") {
    nlohmann::json j{{"group", o.group},         {"group_ranks", pg.world_ranks()},
                     {"world_size", mpi.size()}, {"layout", mesh.describe()},
                     {"device", g.device},       {"iters", o.iters},
                     {"warmup", o.warmup},       {"results", nlohmann::json::array()}};
    for (const auto& r : results) j["results"].push_back(to_json(r));
    if (o.check) j["check"] = wrong == 0 ? "pass" : "fail";
    text = j.dump(1) + "\n";
  } else {
    const bool md = o.format == "markdown";
    text = (md ? "" : "# ") + head + (md ? "\n\n" : "\n") + text_table(results, md);
    if (o.check)
      text += wrong == 0 ? fmt::format("{}check: every result is correct ({} runs)\n", md ? "\n" : "# ", results.size())
                         : fmt::format("{}check: FAILED, {} wrong elements\n", md ? "\n" : "# ", wrong);
  }
  std::cout << text << std::flush;
  if (!o.output.empty()) {
    std::ofstream f(o.output);
    f << text;
    if (!f.flush()) fail("cannot write {}", o.output);
  }
  return wrong ? 1 : 0;
}

TaskAction setup(CLI::App& app) {
  {
    auto o = std::make_shared<Options>();
    app.add_option("--ops", o->ops,
                   "collectives to time (default all): all_reduce all_gather reduce_scatter "
                   "alltoall broadcast sendrecv")
        ->delimiter(',');
    app.add_option("--dtype", o->dtypes, "float32, bfloat16, float64, int32 (several: a list)")
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("--min-bytes,-b", o->min_bytes, "smallest size (nccl-tests' -b; K, M, G suffixes)")
        ->capture_default_str();
    app.add_option("--max-bytes,-e", o->max_bytes, "largest size (nccl-tests' -e)")->capture_default_str();
    app.add_option("--step-factor,-f", o->step_factor, "each size times this (nccl-tests' -f)")->capture_default_str();
    app.add_option("--group", o->group, "world, or a group of the layout: tp cp dp pp ep edp dp_cp edp_cp mp")
        ->capture_default_str();
    app.add_option("--tp", o->tp, "the layout's tensor_model_parallel_size")->capture_default_str();
    app.add_option("--cp", o->cp, "the layout's context_parallel_size")->capture_default_str();
    app.add_option("--pp", o->pp, "the layout's pipeline_model_parallel_size")->capture_default_str();
    app.add_option("--ep", o->ep, "the layout's expert_model_parallel_size")->capture_default_str();
    app.add_flag("--check", o->check, "verify every op's result once before timing it (exit code 1 on a wrong one)");
    app.add_option("--warmup", o->warmup, "untimed runs first")->capture_default_str();
    app.add_option("--iters", o->iters, "timed runs (the mean of the slowest rank is reported)")->capture_default_str();
    app.add_option("--device", o->device, "auto (GPUs through NCCL when there are some), cpu (MPI) or cuda")
        ->capture_default_str();
    app.add_option("--format", o->format, "text, markdown or json")->capture_default_str();
    app.add_option("--output", o->output, "also write the report to this file");
    return [o] { return run(*o); };
  }
}

TaskRegistrar reg{{"benchmark", "collectives",
                   "collective bandwidth over a size sweep (nccl-tests' algbw and busbw), MPI or NCCL, any mesh group",
                   setup}};
TaskRegistrar alias{{"benchmark", "rccl", "Primus's name of benchmark collectives", setup}};

}  // namespace
}  // namespace primus::cli
