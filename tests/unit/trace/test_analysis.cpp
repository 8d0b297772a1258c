// analyze trace's arithmetic on synthetic traces whose answers are known exactly.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "trace/analysis.h"

namespace primus::trace {
namespace {

nlohmann::json event(const std::string& name, const std::string& cat, double ts, double dur, nlohmann::json args = {}) {
  if (args.is_null()) args = nlohmann::json::object();
  return {{"name", name}, {"cat", cat}, {"ph", "X"}, {"pid", 0}, {"tid", 0}, {"ts", ts}, {"dur", dur}, {"args", args}};
}

nlohmann::json trace_of(int rank, std::vector<nlohmann::json> events, nlohmann::json layout = {}) {
  nlohmann::json other = {{"producer", "primus-cpp"}, {"rank", rank}, {"host", "h"}, {"sync_us", 0},
                          {"device", "test"},         {"peak_tflops", 100.0}, {"memory_bandwidth_gbs", 1000.0}};
  if (!layout.is_null()) other["layout"] = layout;
  return {{"traceEvents", events}, {"otherData", other}};
}

TEST(TraceAnalysis, IntervalsMergeAndSubtract) {
  const auto m = merge({{5, 7}, {0, 2}, {1, 3}, {7, 9}, {4, 4}});
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].begin, 0);
  EXPECT_EQ(m[0].end, 3);
  EXPECT_EQ(m[1].begin, 5);
  EXPECT_EQ(m[1].end, 9);
  const auto d = subtract(merge({{0, 10}, {20, 30}}), merge({{2, 4}, {8, 22}, {25, 26}}));
  // [0,2] [4,8] [22,25] [26,30]
  ASSERT_EQ(d.size(), 4u);
  EXPECT_EQ(length(d), 2 + 4 + 3 + 4);
}

// Compute [0,10] [20,30] [45,50]; communication [5,25] (half hidden); memcpy [28,40]; host work
// [40,45] is not the device's. Total 50, computation 25, exposed comm [10,20] = 10, exposed
// memcpy [30,40] = 10, idle [40,45] = 5.
TEST(TraceAnalysis, ExposedCommunicationOfAKnownOverlapIsExact) {
  const RankTrace t = parse_trace(trace_of(0, {event("gemm", "compute", 0, 10), event("gemm", "compute", 20, 10),
                                                event("all_reduce", "communication", 5, 20),
                                                event("copy", "memcpy", 28, 12), event("data_loading", "host", 40, 5),
                                                event("add", "compute", 45, 5), event("F", "annotation", 0, 50)}));
  const Timeline tl = timeline_of(t.events);
  EXPECT_DOUBLE_EQ(tl.total_ms, 50e-3);
  EXPECT_DOUBLE_EQ(tl.computation_ms, 25e-3);
  EXPECT_DOUBLE_EQ(tl.exposed_comm_ms, 10e-3);
  EXPECT_DOUBLE_EQ(tl.exposed_memcpy_ms, 10e-3);
  EXPECT_DOUBLE_EQ(tl.idle_ms, 5e-3);
  EXPECT_DOUBLE_EQ(tl.busy_ms, 45e-3);
  EXPECT_DOUBLE_EQ(tl.total_comm_ms, 20e-3);
  EXPECT_DOUBLE_EQ(tl.total_memcpy_ms, 12e-3);
  EXPECT_NEAR(tl.computation_ms + tl.exposed_comm_ms + tl.exposed_memcpy_ms + tl.idle_ms, tl.total_ms, 1e-12);
}

TEST(TraceAnalysis, OpSummaryPercentagesAddUpTo100) {
  const RankTrace t = parse_trace(trace_of(0, {event("gemm", "compute", 0, 30), event("gemm", "compute", 40, 10),
                                                event("attention_forward", "compute", 50, 20),
                                                event("all_reduce", "communication", 70, 40)}));
  const TraceReport r = analyze({t});
  ASSERT_EQ(r.ops.size(), 3u);
  EXPECT_EQ(r.ops[0].name, "all_reduce");  // the largest first
  EXPECT_DOUBLE_EQ(r.ops[0].percent, 40.0);
  EXPECT_EQ(r.ops[1].name, "gemm");
  EXPECT_EQ(r.ops[1].count, 2);
  EXPECT_DOUBLE_EQ(r.ops[1].percent, 40.0);
  double sum = 0;
  for (const auto& o : r.ops) sum += o.percent;
  EXPECT_NEAR(sum, 100.0, 1e-9);
  EXPECT_NEAR(r.ops.back().cumulative_percent, 100.0, 1e-9);
  double cats = 0;
  for (const auto& c : r.categories) cats += c.percent;
  EXPECT_NEAR(cats, 100.0, 1e-9);
  EXPECT_EQ(op_category("attention_forward", "compute"), "SDPA_fwd");
  EXPECT_EQ(op_category("gemm", "compute"), "GEMM");
}

// A 1024^3 GEMM in 20 us: 2^31 FLOP / 20e-6 s = 107.4 TFLOP/s, against a peak of 100 TFLOP/s
// and 1000 GB/s: FLOPs per byte 2^31 / (3 * 2^20 * 2) = 341.3, compute-bound, 107.4% of the
// roofline.
TEST(TraceAnalysis, GemmRooflineShare) {
  const double flops = 2.0 * 1024 * 1024 * 1024, bytes = 3.0 * 1024 * 1024 * 2;
  const RankTrace t = parse_trace(trace_of(
      0, {event("gemm", "compute", 0, 20,
                {{"op", "gemm"}, {"M", 1024}, {"N", 1024}, {"K", 1024}, {"flops", flops}, {"bytes", bytes},
                 {"dtype", "bf16"}, {"module", "linear_fc1"}, {"pass", "F"}})}));
  const TraceReport r = analyze({t});
  ASSERT_EQ(r.gemms.size(), 1u);
  EXPECT_NEAR(r.gemms[0].tflops, flops / 20e-6 / 1e12, 1e-9);
  EXPECT_NEAR(r.gemms[0].flops_per_byte, flops / bytes, 1e-9);
  EXPECT_EQ(r.gemms[0].bound, "compute");
  EXPECT_NEAR(r.gemms[0].roofline_percent, 100 * flops / 20e-6 / 1e12 / 100.0, 1e-9);
  EXPECT_EQ(r.gemms[0].modules, "linear_fc1");
}

// Rank 0 starts an all-reduce at 0 and ends at 10; rank 1 arrives at 4 and ends at 10. The
// latency is the shorter, 6 us; rank 0 waited 4 us for rank 1, the straggler.
TEST(TraceAnalysis, CollectivesLineUpAcrossRanksAndNameTheStraggler) {
  auto ar = [](double ts, double dur) {
    return event("all_reduce", "communication", ts, dur,
                 {{"op", "all_reduce"}, {"group", "dp"}, {"group_ranks", "0,1"}, {"group_size", 2}, {"seq", 7},
                  {"bytes", 6000.0}, {"dtype", "fp32"}});
  };
  const RankTrace r0 = parse_trace(trace_of(0, {ar(0, 10)})), r1 = parse_trace(trace_of(1, {ar(4, 6)}));
  const TraceReport r = analyze({r0, r1});
  ASSERT_EQ(r.collectives.size(), 1u);
  const CollectiveRow& c = r.collectives[0];
  EXPECT_EQ(c.count, 1);
  EXPECT_DOUBLE_EQ(c.mean_latency_us, 6.0);
  EXPECT_DOUBLE_EQ(c.algbw_gbs, 6000.0 / 6e-6 / 1e9);
  EXPECT_DOUBLE_EQ(c.busbw_gbs, c.algbw_gbs * bus_factor("all_reduce", 2));
  EXPECT_DOUBLE_EQ(c.mean_wait_us, 2.0);  // (4 + 0) / 2
  EXPECT_EQ(r.straggler, 1);
  ASSERT_EQ(r.waits.size(), 2u);
  EXPECT_EQ(r.waits[0].rank, 1);
  EXPECT_DOUBLE_EQ(r.waits[1].total_wait_ms, 4e-3);
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor("all_gather", 4), 0.75);
}

// Two pipeline ranks of 1F1B with 2 microbatches, every pass 10 us: the trace's bubble per rank
// and the simulator's prediction from those times.
TEST(TraceAnalysis, PipelineBubbleBesideTheSimulator) {
  const nlohmann::json layout = {{"pp", 2}, {"vpp", 1}, {"schedule", "1f1b"}};
  auto pass = [](const char* p, int mb, double ts) {
    return event(std::string(p) + " mb", "annotation", ts, 10,
                 {{"op", p}, {"pass", p}, {"microbatch", mb}, {"chunk", 0}, {"step", 1}});
  };
  // rank 0: F0 F1 B0 W0 B1 W1 with waits; rank 1: F0 B0 W0 F1 B1 W1.
  nlohmann::json t0 = trace_of(0, {pass("F", 0, 0), pass("F", 1, 10), pass("B", 0, 40), pass("W", 0, 50),
                                   pass("B", 1, 70), pass("W", 1, 80)},
                               layout);
  t0["otherData"]["microbatches_per_rank"] = 2;
  t0["otherData"]["coord"] = {{"pp", 0}};
  nlohmann::json t1 = trace_of(1, {pass("F", 0, 10), pass("B", 0, 20), pass("W", 0, 30), pass("F", 1, 40),
                                   pass("B", 1, 50), pass("W", 1, 60)},
                               layout);
  t1["otherData"]["microbatches_per_rank"] = 2;
  t1["otherData"]["coord"] = {{"pp", 1}};
  const TraceReport r = analyze({parse_trace(t0), parse_trace(t1)});
  ASSERT_TRUE(r.pipeline.has_value());
  ASSERT_EQ(r.pipeline->ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(r.pipeline->ranks[0].wall_ms, 90e-3);
  EXPECT_DOUBLE_EQ(r.pipeline->ranks[0].busy_ms, 60e-3);
  EXPECT_NEAR(r.pipeline->ranks[0].bubble, 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(r.pipeline->measured_bubble, (90.0 - 60.0) / 90.0, 1e-12);
  EXPECT_GT(r.pipeline->simulated_bubble, 0.0);
  EXPECT_LT(r.pipeline->simulated_bubble, 1.0);
}

TEST(TraceAnalysis, AForeignFileIsRefusedWithItsName) {
  try {
    parse_trace(nlohmann::json{{"traceEvents", nlohmann::json::array()}}, "other.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("other.json"), std::string::npos);
  }
}

TEST(TraceAnalysis, RenderingsHoldEveryTable) {
  const RankTrace t = parse_trace(trace_of(0, {event("gemm", "compute", 0, 30, {{"op", "gemm"}, {"M", 8}, {"N", 8}, {"K", 8}, {"flops", 1024.0}, {"bytes", 384.0}})}));
  const TraceReport r = analyze({t});
  const auto tables = report_tables(r);
  for (const char* f : {"text", "markdown", "csv"}) {
    const std::string s = render(tables, f);
    EXPECT_NE(s.find("computation_time"), std::string::npos) << f;
    EXPECT_NE(s.find("gemm"), std::string::npos) << f;
  }
  EXPECT_THROW(render(tables, "xml"), Error);
  const auto j = report_json(r);
  EXPECT_TRUE(j["timeline"].contains("exposed_comm_ms"));
  EXPECT_EQ(j["ops"][0]["name"], "gemm");
  EXPECT_DOUBLE_EQ(j["ops"][0]["percent"].get<double>(), 100.0);
}

}  // namespace
}  // namespace primus::trace
