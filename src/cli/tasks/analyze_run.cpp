// `analyze run <workspace>/<exp_name> [--json]`: the post-mortem of a run folder
// (src/safe/analyze.h): whether it finished, why each attempt stopped, which ranks and nodes,
// restarts, stragglers, loss spikes, throughput drops, and a suggestion for each cause.
#include <iostream>

#include "cli/registry.h"
#include "safe/analyze.h"

namespace primus::cli {
namespace {

TaskRegistrar reg{{"analyze", "run", "explain what happened in a run folder (why it stopped, which ranks, restarts)",
                   [](CLI::App& app) -> TaskAction {
                     auto dir = std::make_shared<std::string>();
                     auto as_json = std::make_shared<bool>(false);
                     app.add_option("run_dir", *dir, "the run folder, <workspace>/<exp_name>")->required();
                     app.add_flag("--json", *as_json, "print the analysis as JSON");
                     return [dir, as_json]() {
                       const auto a = safe::analyze_run(*dir);
                       if (*as_json) std::cout << safe::to_json(a).dump(2) << "\n";
                       else std::cout << safe::render_text(a);
                       return 0;
                     };
                   }}};

}  // namespace
}  // namespace primus::cli
