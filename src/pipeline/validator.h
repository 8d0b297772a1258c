// Checks that a schedule can be run as written: every (microbatch, stage) gets F once and either
// B and W once each or BW once; every send has exactly one matching receive and both agree with
// the stage map; an overlapped pair is a forward then a backward of another (microbatch, chunk);
// and running the lists with eager sends and blocking receives finishes (no deadlock). Throws primus::Error naming the first problems found.
#pragma once

#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline {

// All problems found, empty when the schedule is valid.
std::vector<std::string> find_problems(const Schedule& s);
// Throws primus::Error listing the problems (the first few) when there are any.
void validate(const Schedule& s);

}  // namespace primus::pipeline
