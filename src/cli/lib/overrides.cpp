#include "cli/lib/overrides.h"

#include "core/error.h"

namespace primus::cli {

std::vector<std::pair<std::string, std::string>> key_values(const std::vector<std::string>& args) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!a.starts_with("--") || a.size() < 3) fail("unexpected argument '{}': overrides are --key value", a);
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      out.emplace_back(a.substr(2, eq - 2), a.substr(eq + 1));
    } else {
      // A flag without a value, as Megatron's store_true options: --use-distributed-optimizer.
      if (i + 1 >= args.size() || args[i + 1].starts_with("--")) out.emplace_back(a.substr(2), "true");
      else out.emplace_back(a.substr(2), args[++i]);
    }
  }
  return out;
}

}  // namespace primus::cli
