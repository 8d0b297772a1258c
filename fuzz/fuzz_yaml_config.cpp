// An experiment config file (YAML: extends, ${VAR}, unknown keys, wrong types, duplicate keys):
// loading either succeeds or throws primus::Error; nothing else may escape, nothing may crash.
#include <cstdint>

#include "config/experiment.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = primus::fuzz::write_scratch("exp.yaml", data, size);
  try {
    (void)primus::config::load_experiment(path.string());
  } catch (const primus::Error& e) {
    primus::fuzz::refused(e);
  }
  return 0;
}
