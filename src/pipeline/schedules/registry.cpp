#include "pipeline/schedules/registry.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "core/error.h"
#include "core/suggest.h"
#include "pipeline/validator.h"

namespace primus::pipeline {

// One line per algorithm; the function is defined in schedules/<name>.cpp.
Schedule make_gpipe(const ScheduleRequest&);
Schedule make_1f1b(const ScheduleRequest&);
Schedule make_interleaved_1f1b(const ScheduleRequest&);
Schedule make_zb_h1(const ScheduleRequest&);
Schedule make_zb_h2(const ScheduleRequest&);
Schedule make_zb_auto(const ScheduleRequest&);
Schedule make_zbv(const ScheduleRequest&);
Schedule make_v_half(const ScheduleRequest&);
Schedule make_v_min(const ScheduleRequest&);
Schedule make_dualpipev(const ScheduleRequest&);

const std::vector<GeneratorInfo>& generators() {
  static const std::vector<GeneratorInfo> table = {
      {"gpipe", "all forwards, then all backwards; keeps all m activations", 1, make_gpipe},
      {"1f1b", "one forward, one backward (PipeDream-Flush / Megatron default)", 1, make_1f1b},
      {"interleaved-1f1b", "Megatron's virtual pipeline: vpp looped chunks per rank", 2, make_interleaved_1f1b},
      {"zb-h1", "zero bubble H1: 1F1B memory, W delayed into the bubbles", 1, make_zb_h1},
      {"zb-h2", "zero bubble H2: extra warm-up forwards, zero bubble at 2p-1 activations", 1, make_zb_h2},
      {"zb-auto", "zero bubble search: least makespan under --memory-limit", 1, make_zb_auto},
      {"zbv", "zero bubble V: V-shape chunks, zero bubble at 1F1B memory", 2, make_zbv},
      {"v-half", "V-shape at about half of 1F1B's activation memory", 2, make_v_half},
      {"v-min", "V-shape at about a third of 1F1B's activation memory", 2, make_v_min},
      {"dualpipev", "DeepSeek's DualPipeV (cut-in-half DualPipe), needs m >= 2p", 2, make_dualpipev},
  };
  return table;
}

std::vector<std::string> algorithm_names() {
  std::vector<std::string> names;
  for (auto& g : generators()) names.push_back(g.name);
  return names;
}

Schedule generate(const std::string& algorithm, const ScheduleRequest& req) {
  const GeneratorInfo* info = nullptr;
  for (auto& g : generators())
    if (g.name == algorithm) info = &g;
  if (!info) {
    fail("unknown pipeline schedule '{}'{}; schedules: {}", algorithm, did_you_mean(algorithm, algorithm_names()),
         fmt::join(algorithm_names(), ", "));
  }
  if (req.pp < 1) fail("pipeline size must be at least 1 (got --pp {})", req.pp);
  if (req.microbatches < 1) fail("number of microbatches must be at least 1 (got {})", req.microbatches);
  if (req.memory_limit < 0) fail("memory limit must not be negative (got {})", req.memory_limit);
  Schedule s = info->make(req);
  validate(s);
  return s;
}

void require_vpp(const std::string& algorithm, int vpp, int allowed) {
  if (vpp != allowed)
    fail("schedule '{}' needs --vpp {} (got --vpp {})", algorithm, allowed, vpp);
}

int resolve_vpp(const ScheduleRequest& req, int default_vpp) {
  if (req.vpp < 0) fail("chunks per rank must be at least 1 (got --vpp {})", req.vpp);
  return req.vpp == 0 ? default_vpp : req.vpp;
}

}  // namespace primus::pipeline
