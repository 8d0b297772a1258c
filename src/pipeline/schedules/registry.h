// Schedule generators by name. Each generator lives in its own file in this folder and is
// listed once in registry.cpp (a function table: static registrars inside a static library can be
// dropped by the linker).
#pragma once

#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline {

using GeneratorFn = Schedule (*)(const ScheduleRequest&);

struct GeneratorInfo {
  std::string name;
  std::string summary;
  int default_vpp;
  GeneratorFn make;
};

const std::vector<GeneratorInfo>& generators();
std::vector<std::string> algorithm_names();

// Builds the named schedule; unknown names, impossible sizes and limits throw primus::Error.
// The result has its transfers attached and has passed validate().
Schedule generate(const std::string& algorithm, const ScheduleRequest& req);

// Shared argument checks for generators.
void require_vpp(const std::string& algorithm, int vpp, int allowed);
int resolve_vpp(const ScheduleRequest& req, int default_vpp);

}  // namespace primus::pipeline
