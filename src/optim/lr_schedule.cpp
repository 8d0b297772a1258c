#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/suggest.h"

namespace primus {
namespace {

template <typename E>
E parse_choice(const char* field, const std::string& value, const std::vector<std::pair<const char*, E>>& choices) {
  std::vector<std::string> names;
  for (const auto& [name, e] : choices) {
    if (value == name) return e;
    names.emplace_back(name);
  }
  fail("{}: unknown style '{}'{}; choose one of: {}", field, value, did_you_mean(value, names),
       fmt::join(names, ", "));
}

}  // namespace

LRSchedule::LRSchedule(LRScheduleOptions options) : o_(std::move(options)) {
  style_ = parse_choice<Style>("lr_decay_style", o_.lr_decay_style,
                               {{"constant", Style::Constant},
                                {"linear", Style::Linear},
                                {"cosine", Style::Cosine},
                                {"inverse-square-root", Style::InverseSqrt},
                                {"WSD", Style::WSD}});
  wsd_style_ = parse_choice<WsdStyle>("lr_wsd_decay_style", o_.lr_wsd_decay_style,
                                      {{"linear", WsdStyle::Linear},
                                       {"cosine", WsdStyle::Cosine},
                                       {"exponential", WsdStyle::Exponential},
                                       {"minus_sqrt", WsdStyle::MinusSqrt}});
  auto finite = [](double x) { return std::isfinite(x); };
  if (!finite(o_.lr) || o_.lr < 0) fail("lr must be a non-negative number, got {}", o_.lr);
  if (!finite(o_.min_lr) || o_.min_lr < 0) fail("min_lr must be a non-negative number, got {}", o_.min_lr);
  if (o_.min_lr > o_.lr) fail("min_lr ({}) must not exceed lr ({})", o_.min_lr, o_.lr);
  if (!finite(o_.lr_warmup_init) || o_.lr_warmup_init < 0 || o_.lr_warmup_init > o_.lr)
    fail("lr_warmup_init ({}) must lie in [0, lr = {}]", o_.lr_warmup_init, o_.lr);
  if (o_.lr_warmup_iters < 0) fail("lr_warmup_iters must be non-negative, got {}", o_.lr_warmup_iters);
  // A constant schedule never reads lr_decay_iters; every other style decays towards it.
  if (style_ != Style::Constant) {
    if (o_.lr_decay_iters <= 0)
      fail("lr_decay_iters must be positive for lr_decay_style {}, got {}", o_.lr_decay_style, o_.lr_decay_iters);
    if (o_.lr_warmup_iters >= o_.lr_decay_iters)
      fail("lr_warmup_iters ({}) must be smaller than lr_decay_iters ({})", o_.lr_warmup_iters, o_.lr_decay_iters);
  }
  if (style_ == Style::WSD) {
    if (o_.lr_wsd_decay_iters <= 0)
      fail("lr_wsd_decay_iters must be positive for lr_decay_style WSD, got {}", o_.lr_wsd_decay_iters);
    if (o_.lr_wsd_decay_iters > o_.lr_decay_iters - o_.lr_warmup_iters)
      fail("lr_wsd_decay_iters ({}) must fit between the warmup and lr_decay_iters ({} - {} iterations)",
           o_.lr_wsd_decay_iters, o_.lr_decay_iters, o_.lr_warmup_iters);
  }
}

double LRSchedule::lr_at(int64_t iteration) const {
  if (iteration < 0) fail("lr_at: iteration must be non-negative, got {}", iteration);
  const double it = double(iteration);
  const double max_lr = o_.lr, min_lr = o_.min_lr;

  if (o_.lr_warmup_iters > 0 && iteration <= o_.lr_warmup_iters)
    return o_.lr_warmup_init + (max_lr - o_.lr_warmup_init) * it / double(o_.lr_warmup_iters);
  if (style_ == Style::Constant) return max_lr;
  if (iteration > o_.lr_decay_iters) return min_lr;
  if (style_ == Style::InverseSqrt) {
    const double warm = double(std::max<int64_t>(o_.lr_warmup_iters, 1));
    return std::max(min_lr, max_lr * std::sqrt(warm) / std::sqrt(std::max(it, 1.0)));
  }

  const double ratio = (it - double(o_.lr_warmup_iters)) / double(o_.lr_decay_iters - o_.lr_warmup_iters);
  const double pi = std::numbers::pi;
  double coeff = 1.0;
  switch (style_) {
    case Style::Linear: coeff = 1.0 - ratio; break;
    case Style::Cosine: coeff = 0.5 * (std::cos(pi * ratio) + 1.0); break;
    case Style::WSD: {
      const int64_t anneal_start = o_.lr_decay_iters - o_.lr_wsd_decay_iters;
      if (iteration <= anneal_start) break;
      const double r = double(iteration - anneal_start) / double(o_.lr_wsd_decay_iters);
      switch (wsd_style_) {
        case WsdStyle::Linear: coeff = 1.0 - r; break;
        case WsdStyle::Cosine: coeff = 0.5 * (std::cos(pi * r) + 1.0); break;
        case WsdStyle::Exponential: coeff = 2.0 * std::pow(0.5, r) - 1.0; break;
        case WsdStyle::MinusSqrt: coeff = 1.0 - std::sqrt(r); break;
      }
      break;
    }
    default: break;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace primus
