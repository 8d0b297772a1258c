// Pictures of runs: the loss (with evaluation loss), learning rate, grad norm and throughput
// curves from metrics.jsonl, one panel each, several runs overlaid in one SVG. `analyze run`
// draws them; PNG comes from the SVG through rsvg-convert (librsvg2-bin) when it is installed.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace primus::safe {

struct RunCurves {
  std::string label;  // the run folder's name (with its parent when two runs share a name)
  struct Series {
    std::vector<double> x, y;  // iteration, value; sorted by iteration, one value per iteration
  };
  Series loss, eval_loss, lr, grad_norm, tokens_per_sec;
};

// Reads <run_dir>/metrics.jsonl. A resumed run logs some iterations twice: the last row wins.
// Throws primus::Error when the file is missing or holds no training rows.
RunCurves read_run_curves(const std::filesystem::path& run_dir);
// Labels that tell runs apart: folder names, or parent/name when names repeat.
void label_runs(std::vector<RunCurves>& runs, const std::vector<std::filesystem::path>& dirs);

// The four panels as a standalone SVG document.
std::string render_run_svg(const std::vector<RunCurves>& runs);

// Converts with rsvg-convert when it is on PATH; false (and no file) when it is not.
// Throws primus::Error when the converter is there but fails.
bool svg_to_png(const std::filesystem::path& svg, const std::filesystem::path& png);

}  // namespace primus::safe
