// analyze trace: TraceLens's tables over the traces of a profiled run (src/trace/analysis.h):
// the timeline, the op summary, GEMMs against the roofline, collectives with bus bandwidth and
// the straggler, the pipeline bubble beside the simulator; --diff against another run; an SVG
// timeline of one step across ranks.
//
//   primus-cli direct -- analyze trace output/run [--format text|markdown|csv|json] [--diff output/other]
//                        [--svg step.svg [--step N]] [--output report.md]
#include <fstream>
#include <iostream>

#include "cli/registry.h"
#include "core/error.h"
#include "trace/analysis.h"

namespace primus::cli {
namespace analyze_trace_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

struct Options {
  std::vector<std::string> paths, diff;
  std::string format = "text", svg, output;
  int64_t step = -1;
};

void emit(const std::string& text, const std::string& output) {
  if (output.empty()) {
    std::cout << text;
    return;
  }
  std::ofstream out(output);
  if (!out || !(out << text)) fail("cannot write {}", output);
}

int run(const Options& o) {
  const auto traces = trace::load_traces(o.paths);
  const trace::TraceReport report = trace::analyze(traces);
  if (!o.svg.empty()) {
    std::ofstream out(o.svg);
    if (!out || !(out << trace::timeline_svg(traces, o.step))) fail("cannot write {}", o.svg);
  }
  if (!o.diff.empty()) {
    const trace::TraceReport other = trace::analyze(trace::load_traces(o.diff));
    if (o.format == "json") emit(trace::diff_json(report, other).dump(2) + "\n", o.output);
    else emit(trace::render(trace::diff_tables(report, other), o.format), o.output);
    return 0;
  }
  if (o.format == "json") emit(trace::report_json(report).dump(2) + "\n", o.output);
  else emit(trace::render(trace::report_tables(report), o.format), o.output);
  return 0;
}

TaskRegistrar reg{{"analyze", "trace", "TraceLens's tables over a profiled run's traces (timeline, ops, GEMMs, collectives, pipeline)",
                   [](CLI::App& app) -> TaskAction {
                     auto o = std::make_shared<Options>();
                     app.add_option("paths", o->paths, "a run folder (its trace/), a folder of traces, or trace files")
                         ->required();
                     app.add_option("--format", o->format, "output format")
                         ->check(CLI::IsMember({"text", "markdown", "csv", "json"}))
                         ->capture_default_str();
                     app.add_option("--diff", o->diff, "another run (or its traces): A against B op by op");
                     app.add_option("--svg", o->svg, "write an SVG timeline of one step across ranks to this file");
                     app.add_option("--step", o->step, "the step the SVG draws (default: the first profiled)");
                     app.add_option("--output", o->output, "write the report to this file instead of stdout");
                     return [o] { return run(*o); };
                   }}};

}  // namespace
}  // namespace primus::cli
