// Config overrides on a task's command line after --config: "--lr 3e-4", "--lr=3e-4",
// "--exp-name x" as (key, value) pairs in order, for config::load_experiment.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace primus::cli {

std::vector<std::pair<std::string, std::string>> key_values(const std::vector<std::string>& args);

}  // namespace primus::cli
