// A Chrome trace as `analyze trace` reads it: loaded, analyzed and rendered as text and JSON, or
// refused with primus::Error.
#include <cstdint>

#include "core/error.h"
#include "fuzz_util.h"
#include "trace/analysis.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = primus::fuzz::write_scratch("rank_0.json", data, size);
  try {
    const auto traces = primus::trace::load_traces({path.string()});
    const auto report = primus::trace::analyze(traces);
    (void)primus::trace::render(primus::trace::report_tables(report), "text");
    (void)primus::trace::report_json(report).dump();
  } catch (const primus::Error& e) {
    primus::fuzz::refused(e);
  }
  return 0;
}
