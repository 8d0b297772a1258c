// The watch's detectors as plain functions and small state machines, so they are unit-tested
// without processes: loss spikes (a robust z-score over a window), stragglers (a rank
// consistently slower than its peers) and hangs (no heartbeat progress for a timeout).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "safe/heartbeat.h"

namespace primus::safe {

double median(std::vector<double> v);  // NaN for an empty vector
// Median absolute deviation from the median.
double mad(const std::vector<double>& v);

// Robust z-score of x against `window`: (x - median) / (1.4826 * MAD). 1.4826 makes the MAD
// estimate a standard deviation for normal data; a floor on the spread keeps a flat window from
// turning tiny wiggles into huge scores.
double robust_z(double x, const std::vector<double>& window);

// A loss spike: z above `z_threshold` and at least `min_rise` (relative) above the median, once
// `min_samples` losses are in the window. Spikes are not added to the window, so one spike does
// not hide the next.
class SpikeDetector {
 public:
  SpikeDetector(size_t window = 50, size_t min_samples = 10, double z_threshold = 6.0, double min_rise = 0.1)
      : window_(window), min_samples_(min_samples), z_(z_threshold), rise_(min_rise) {}
  struct Spike {
    double loss, median, z;
  };
  std::optional<Spike> observe(double loss);

 private:
  size_t window_, min_samples_;
  double z_, rise_;
  std::deque<double> losses_;
};

// Stragglers from per-step compute times of each rank. A rank is slow at a check when the
// median of its last `window` steps exceeds `factor` times the median of the other ranks'
// medians and is at least `min_excess_s` above it; it is reported as a straggler after
// `consecutive` such checks in a row (each check needs a new step from every rank involved).
class StragglerDetector {
 public:
  StragglerDetector(double factor = 1.5, size_t window = 5, int consecutive = 3, double min_excess_s = 0.02)
      : factor_(factor), window_(window), consecutive_(consecutive), min_excess_(min_excess_s) {}
  void add(int rank, int64_t iteration, double compute_time);
  struct Straggler {
    int rank;
    double median_s, peers_median_s;
  };
  // New stragglers found by this check (each rank is reported once).
  std::vector<Straggler> check();

 private:
  double factor_;
  size_t window_;
  int consecutive_;
  double min_excess_;
  std::map<int, std::map<int64_t, double>> times_;  // rank -> iteration -> seconds
  std::map<int, int> streak_;
  std::map<int, int64_t> last_checked_;
  std::set<int> reported_;
};

// Hangs: tracks when each rank's heartbeat last changed (its `beat`). A rank is hung when it has
// made no progress for `timeout_s`, counted from its last change, or (for a rank with no
// heartbeat yet) from the first heartbeat of any rank. Ranks in phase done/failed are not hung.
class HangDetector {
 public:
  explicit HangDetector(double timeout_s) : timeout_(timeout_s) {}
  void observe(const std::map<int, Heartbeat>& beats, double now, int world_size);
  struct Hung {
    int rank;
    double idle_s;
    int64_t iteration;
    std::string phase;
  };
  std::vector<Hung> hung(double now) const;
  bool any_heartbeat() const { return first_seen_ >= 0; }

 private:
  double timeout_;
  double first_seen_ = -1;
  int world_size_ = 1;
  struct Seen {
    int64_t beat = -1;
    double since = 0;
    int64_t iteration = 0;
    std::string phase;
  };
  std::map<int, Seen> seen_;
};

}  // namespace primus::safe
