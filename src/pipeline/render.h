// Pictures of a simulated schedule: a terminal timeline and an SVG drawn like the papers'
// figures (one row per rank, F blue, B teal, W green, darker for chunk 1, idle time grey).
#pragma once

#include <string>

#include "pipeline/schedule.h"
#include "pipeline/simulator.h"

namespace primus::pipeline {

// One line per rank; ops are labelled F3, B3, W3, BW3 (microbatch 3, chunk 0) and f3, b3, w3, bw3
// for chunk 1; '.' is idle time.
std::string render_text(const Schedule& s, const SimResult& r);
std::string render_svg(const Schedule& s, const SimResult& r, const Costs& costs);

}  // namespace primus::pipeline
