#include "safe/detect.h"

#include <algorithm>
#include <cmath>

namespace primus::safe {

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  const size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double hi = v[mid];
  if (n % 2) return hi;
  const double lo = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lo + hi);
}

double mad(const std::vector<double>& v) {
  const double m = median(v);
  std::vector<double> d;
  d.reserve(v.size());
  for (double x : v) d.push_back(std::fabs(x - m));
  return median(d);
}

double robust_z(double x, const std::vector<double>& window) {
  const double m = median(window);
  // Floor: 1% of the median's magnitude, so a window of identical values still has a scale.
  const double spread = std::max(1.4826 * mad(window), 0.01 * std::fabs(m) + 1e-12);
  return (x - m) / spread;
}

std::optional<SpikeDetector::Spike> SpikeDetector::observe(double loss) {
  if (!std::isfinite(loss)) return std::nullopt;  // NaN/Inf are the NaN policy's business
  std::optional<Spike> out;
  if (losses_.size() >= min_samples_) {
    const std::vector<double> w(losses_.begin(), losses_.end());
    const double m = median(w), z = robust_z(loss, w);
    if (z > z_ && loss > m * (1 + rise_)) out = Spike{loss, m, z};
  }
  if (!out) {
    losses_.push_back(loss);
    if (losses_.size() > window_) losses_.pop_front();
  }
  return out;
}

void StragglerDetector::add(int rank, int64_t iteration, double compute_time) {
  auto& t = times_[rank];
  t[iteration] = compute_time;
  while (t.size() > window_) t.erase(t.begin());
}

std::vector<StragglerDetector::Straggler> StragglerDetector::check() {
  std::vector<Straggler> out;
  if (times_.size() < 2) return out;
  std::map<int, double> med;
  for (const auto& [r, t] : times_) {
    if (t.size() < window_) return out;  // not every rank has a full window yet
    std::vector<double> v;
    for (const auto& [it, s] : t) v.push_back(s);
    med[r] = median(v);
  }
  for (const auto& [r, t] : times_) {
    const int64_t newest = t.rbegin()->first;
    if (last_checked_.count(r) && last_checked_[r] == newest) continue;  // no new step: no new evidence
    last_checked_[r] = newest;
    std::vector<double> peers;
    for (const auto& [q, m] : med)
      if (q != r) peers.push_back(m);
    const double ref = median(peers);
    const bool slow = med[r] > factor_ * ref && med[r] - ref >= min_excess_;
    streak_[r] = slow ? streak_[r] + 1 : 0;
    if (streak_[r] >= consecutive_ && !reported_.count(r)) {
      reported_.insert(r);
      out.push_back({r, med[r], ref});
    }
  }
  return out;
}

void HangDetector::observe(const std::map<int, Heartbeat>& beats, double now, int world_size) {
  world_size_ = world_size;
  for (const auto& [r, hb] : beats) {
    if (first_seen_ < 0) first_seen_ = now;
    Seen& s = seen_[r];
    if (hb.beat != s.beat) {
      s.beat = hb.beat;
      s.since = now;
    }
    s.iteration = hb.iteration;
    s.phase = hb.phase;
  }
}

std::vector<HangDetector::Hung> HangDetector::hung(double now) const {
  std::vector<Hung> out;
  if (first_seen_ < 0 || timeout_ <= 0) return out;  // before any heartbeat, startup time is unbounded
  for (int r = 0; r < world_size_; ++r) {
    auto it = seen_.find(r);
    if (it == seen_.end()) {
      if (now - first_seen_ > timeout_) out.push_back({r, now - first_seen_, 0, "none"});
      continue;
    }
    const Seen& s = it->second;
    if (s.phase == "done" || s.phase == "failed") continue;
    if (now - s.since > timeout_) out.push_back({r, now - s.since, s.iteration, s.phase});
  }
  return out;
}

}  // namespace primus::safe
