#include "safe/fault.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace fs = std::filesystem;

namespace primus::safe {

FaultSpec parse_fault(const std::string& kind, const std::string& text, const std::string& variable) {
  FaultSpec f;
  f.kind = kind;
  f.iteration = kind == "slow" ? 1 : -1;
  std::stringstream ss(text);
  std::string item;
  auto number = [&](const std::string& key, const std::string& v) -> int64_t {
    try {
      size_t used = 0;
      const long long n = std::stoll(v, &used);
      if (used != v.size() || n < 0) throw std::invalid_argument(v);
      return n;
    } catch (const std::exception&) {
      fail("{}: {}='{}' is not a non-negative integer (value '{}')", variable, key, v, text);
    }
  };
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) fail("{}: '{}' is not key=value (value '{}')", variable, item, text);
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    if (k == "rank") f.rank = int(number(k, v));
    else if (k == "iteration" || (k == "from" && kind == "slow")) f.iteration = number(k, v);
    else if (k == "ms" && kind == "slow") f.ms = number(k, v);
    else if (k == "during" && kind == "kill") {
      if (v != "checkpoint" && v != "step") fail("{}: during= must be step or checkpoint, got '{}'", variable, v);
      f.during = v == "step" ? "" : v;
    } else if (k == "at" && kind == "kill") {
      // Where inside the save (src/checkpoint's kill points): after this rank's shard file, halfway
      // through it, after meta.json (rank 0), after the rename before `latest` moves (rank 0).
      if (v != "shard" && v != "half" && v != "meta" && v != "renamed")
        fail("{}: at= must be shard, half, meta or renamed, got '{}'", variable, v);
      f.at = v;
    } else {
      fail("{}: unknown key '{}' (value '{}')", variable, k, text);
    }
  }
  if (kind != "slow" && f.iteration < 1) fail("{}: iteration=<n> (n >= 1) is required (value '{}')", variable, text);
  if (kind == "slow" && f.ms <= 0) fail("{}: ms=<milliseconds> is required (value '{}')", variable, text);
  return f;
}

Faults Faults::from_env(int rank) {
  Faults out;
  auto read = [&](const char* var, const char* kind, std::optional<FaultSpec>& slot) {
    const char* v = std::getenv(var);
    if (!v || !*v) return;
    FaultSpec f = parse_fault(kind, v, var);
    if (f.rank == rank) slot = f;
  };
  read("PRIMUS_FAULT_KILL", "kill", out.kill);
  read("PRIMUS_FAULT_STALL", "stall", out.stall);
  read("PRIMUS_FAULT_NAN", "nan", out.nan);
  read("PRIMUS_FAULT_SLOW", "slow", out.slow);
  return out;
}

bool claim_fault_once(const fs::path& run_dir, const std::string& name) {
  const fs::path dir = run_dir / "watch" / "faults";
  fs::create_directories(dir);
  // O_EXCL: exactly one process claims it, even if several ranks race.
  const int fd = ::open((dir / (name + ".fired")).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  if (fd < 0) return false;
  ::fsync(fd);  // the marker must outlive the SIGKILL that usually follows
  ::close(fd);
  return true;
}

}  // namespace primus::safe
