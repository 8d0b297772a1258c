// `analyze run <workspace>/<exp_name>... [--json] [--plot FILE.svg | --no-plot]`: the post-mortem
// of each run folder (src/safe/analyze.h): whether it finished, why each attempt stopped, which
// ranks and nodes, restarts, stragglers, loss spikes, throughput drops, and a suggestion for each
// cause; then the runs' loss, learning-rate, grad-norm and throughput curves in one picture
// (src/safe/run_plot.h), SVG and PNG.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/registry.h"
#include "core/error.h"
#include "safe/analyze.h"
#include "safe/run_plot.h"

namespace fs = std::filesystem;

namespace primus::cli {
namespace analyze_run_task {  // named for the unity build (PRIMUS_UNITY_BUILD): the plugins share one namespace

// Draws the curves of the runs that have metrics; returns the files written.
std::vector<std::string> draw(const std::vector<std::string>& dirs, std::string out, bool asked) {
  std::vector<safe::RunCurves> runs;
  std::vector<fs::path> with_data;
  for (const auto& d : dirs) {
    try {
      runs.push_back(safe::read_run_curves(d));
      with_data.push_back(d);
    } catch (const Error& e) {
      if (asked) throw;
      std::cerr << "no curves for " << d << ": " << e.what() << "\n";
    }
  }
  if (runs.empty()) return {};
  safe::label_runs(runs, with_data);
  if (out.empty()) out = dirs.size() == 1 ? (fs::path(dirs[0]) / "curves.svg").string() : "runs.svg";
  if (!out.ends_with(".svg"))
    fail("--plot {}: the picture is an SVG file; name it *.svg (a PNG is written beside it)", out);
  {
    std::ofstream f(out);
    f << safe::render_run_svg(runs);
    if (!f) fail("cannot write {}", out);
  }
  std::vector<std::string> written{out};
  const std::string png = out.substr(0, out.size() - 4) + ".png";
  if (safe::svg_to_png(out, png)) written.push_back(png);
  return written;
}

TaskRegistrar reg{
    {"analyze", "run",
     "explain what happened in run folders (why they stopped, which ranks, restarts) and draw their "
     "loss, learning rate, grad norm and throughput curves",
     [](CLI::App& app) -> TaskAction {
       auto dirs = std::make_shared<std::vector<std::string>>();
       auto as_json = std::make_shared<bool>(false);
       auto plot = std::make_shared<std::string>();
       auto no_plot = std::make_shared<bool>(false);
       app.add_option("run_dirs", *dirs, "run folders, <workspace>/<exp_name>; several are overlaid")->required();
       app.add_flag("--json", *as_json, "print the analysis as JSON (an array for several runs)");
       app.add_option("--plot", *plot,
                      "the curves' SVG file (default: <run>/curves.svg for one run, runs.svg here for "
                      "several); a PNG is written beside it when rsvg-convert is installed");
       app.add_flag("--no-plot", *no_plot, "do not draw the curves (--json draws them only with --plot)");
       return [dirs, as_json, plot, no_plot]() {
         nlohmann::json all = nlohmann::json::array();
         for (const auto& d : *dirs) {
           const auto a = safe::analyze_run(d);
           if (*as_json)
             all.push_back(safe::to_json(a));
           else
             std::cout << safe::render_text(a) << (dirs->size() > 1 ? "\n" : "");
         }
         if (*as_json) std::cout << (dirs->size() == 1 ? all[0] : all).dump(2) << "\n";
         // With --json the output is for programs: pictures only when asked for with --plot.
         if (!*no_plot && (!*as_json || !plot->empty()))
           for (const auto& f : draw(*dirs, *plot, !plot->empty()))
             (*as_json ? std::cerr : std::cout) << "curves: " << f << "\n";
         return 0;
       };
     }}};

}  // namespace
}  // namespace primus::cli
