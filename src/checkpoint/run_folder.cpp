#include "checkpoint/run_folder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/format.h"
#include "core/error.h"
#include "parallel/process_group.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::checkpoint {
namespace {

// The identity in a checkpoint folder's meta.json, or nullopt when it cannot be read or verified.
std::optional<CheckpointIdentity> identity_of(const fs::path& dir) {
  try {
    const json meta = read_meta(dir);
    return CheckpointIdentity{meta.value("run_id", std::string()), meta.at("iteration").get<int64_t>(),
                              meta.value("save_seq", int64_t(0))};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::vector<fs::path> checkpoint_folders(const fs::path& root) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && e.path().filename().string().starts_with("iter_")) out.push_back(e.path());
  return out;
}

std::string latest_name(const fs::path& root) {
  std::ifstream in(root / "latest");
  std::string name;
  in >> name;
  return name;
}

// One more than the highest save_seq in the folder: the order of saves, whatever the iterations.
int64_t next_save_seq(const fs::path& root) {
  int64_t seq = 0;
  for (const fs::path& d : checkpoint_folders(root))
    if (auto id = identity_of(d)) seq = std::max(seq, id->save_seq);
  return seq + 1;
}

// A save may replace a checkpoint folder of its own run (a restart redoing iterations); another
// run's only with `overwrite`. A folder whose meta.json cannot be read is moved aside, not deleted.
void replace_check(const fs::path& final_dir, const std::string& run_id, bool overwrite) {
  if (!fs::exists(final_dir) || overwrite) return;
  const auto id = identity_of(final_dir);
  if (!id) {
    const fs::path aside = final_dir.parent_path() /
                           fmt::format("damaged_{}_{}", final_dir.filename().string(), std::time(nullptr));
    fs::rename(final_dir, aside);
    fsync_path(final_dir.parent_path(), true);
    return;
  }
  if (id->run_id != run_id)
    fail("{} holds a checkpoint of another run ('{}'{}), which this run ('{}') would overwrite; pass --overwrite "
         "to replace it, or choose another save path",
         final_dir.string(), id->run_id.empty() ? "(before run ids)" : id->run_id,
         id->run_id.empty() ? "" : fmt::format(", saved as save {}", id->save_seq), run_id);
}

}  // namespace

std::string checkpoint_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

std::string resolve_checkpoint(const std::string& path) {
  const fs::path p(path);
  if (fs::is_regular_file(p / "meta.json")) return p.string();
  if (fs::is_regular_file(p / "latest")) {
    std::ifstream in(p / "latest");
    std::string name;
    in >> name;
    if (name.empty()) fail("{}/latest is empty", p.string());
    return (p / name).string();
  }
  if (!fs::exists(p)) fail("checkpoint path {} does not exist", p.string());
  fail("{} is neither a checkpoint folder (no meta.json) nor a save folder (no latest file)", p.string());
}

std::vector<std::string> list_checkpoints(const std::string& save_dir) {
  std::vector<std::string> out;
  const fs::path root(save_dir);
  if (!fs::is_directory(root)) return out;
  struct Item {
    fs::path dir;
    int64_t seq = 0;
    std::string name;
  };
  std::vector<Item> items;
  for (const fs::path& d : checkpoint_folders(root)) {
    const auto id = identity_of(d);
    items.push_back({d, id ? id->save_seq : 0, d.filename().string()});
  }
  const std::string latest = latest_name(root);
  // `latest` first, then by save order, then (no save order: format 2 or unreadable) by iteration;
  // zero-padded names make lexical order numeric order.
  std::sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    if ((a.name == latest) != (b.name == latest)) return a.name == latest;
    if (a.seq != b.seq) return a.seq > b.seq;
    return a.name > b.name;
  });
  for (const Item& i : items) out.push_back(i.dir.string());
  return out;
}

std::vector<std::string> prune_checkpoints(const std::string& save_dir, int64_t keep, const std::string& run_id,
                                           const std::string& just_written) {
  std::vector<std::string> deleted;
  if (keep <= 0) return deleted;
  const fs::path root(save_dir);
  const std::string latest = latest_name(root);
  const std::string written = just_written.empty() ? "" : fs::path(just_written).filename().string();
  std::vector<std::pair<int64_t, fs::path>> mine;  // (save_seq, folder) of this run's checkpoints
  for (const fs::path& d : checkpoint_folders(root)) {
    const auto id = identity_of(d);
    if (id && !run_id.empty() && id->run_id == run_id) mine.push_back({id->save_seq, d});
  }
  std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // The one just written and the one `latest` names count towards `keep` but are never deleted.
  for (size_t i = size_t(keep); i < mine.size(); ++i) {
    const std::string name = mine[i].second.filename().string();
    if (name == written || name == latest) continue;
    fs::remove_all(mine[i].second);
    deleted.push_back(mine[i].second.string());
  }
  return deleted;
}

std::string new_run_id(parallel::ProcessGroup* world) {
  std::random_device rd;
  int64_t mine = int64_t((uint64_t(rd()) << 32) ^ uint64_t(rd()) ^
                         uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  if (world && world->size() > 1) {
    std::vector<int64_t> all(size_t(world->size()));
    world->all_gather(&mine, all.data(), 1, parallel::CommType::I64);
    mine = all[0];  // rank 0's
  }
  return fmt::format("{:016x}", uint64_t(mine));
}

std::vector<int64_t> planned_saves(int64_t start, int64_t train_iters, int64_t save_interval) {
  std::vector<int64_t> out;
  if (save_interval > 0)
    for (int64_t it = (start / save_interval + 1) * save_interval; it <= train_iters; it += save_interval)
      out.push_back(it);
  if (train_iters > start && (out.empty() || out.back() != train_iters)) out.push_back(train_iters);
  return out;
}

void check_save_folder(const std::string& save_dir, const std::string& run_id, const std::vector<int64_t>& iterations,
                       bool overwrite) {
  const fs::path root(save_dir);
  if (fs::exists(root) && !fs::is_directory(root))
    fail("the save path {} is a file, not a folder: checkpoints cannot be written there (set `save` to a folder)",
         save_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) fail("cannot create the save folder {}: {}", save_dir, ec.message());
  if (::access(root.c_str(), W_OK) != 0) fail("the save folder {} is not writable: {}", save_dir, std::strerror(errno));
  if (overwrite) return;
  std::vector<std::string> theirs;
  std::string other;
  for (int64_t it : iterations) {
    const fs::path d = root / checkpoint_name(it);
    if (!fs::exists(d)) continue;
    const auto id = identity_of(d);
    if (id && id->run_id == run_id) continue;
    theirs.push_back(d.filename().string());
    if (other.empty()) other = id ? (id->run_id.empty() ? "(before run ids)" : id->run_id) : "(unreadable)";
  }
  if (!theirs.empty())
    fail("the save folder {} holds checkpoints of another run (run '{}': {}) that this run would overwrite; pass "
         "--overwrite to replace them, or choose another save path (`save`)",
         save_dir, other, fmt::join(theirs, ", "));
}

CheckpointIdentity read_checkpoint_identity(const std::string& dir) {
  const json meta = read_meta(dir);
  return CheckpointIdentity{meta.value("run_id", std::string()), meta.at("iteration").get<int64_t>(),
                            meta.value("save_seq", int64_t(0))};
}

SaveSlot save_slot(const std::string& save_dir, int64_t iteration) {
  const std::string name = checkpoint_name(iteration);
  const fs::path root(save_dir);
  return {root, root / name, root / fmt::format(".{}.tmp", name)};
}

int64_t open_save_slot(const SaveSlot& slot, const std::string& run_id, bool overwrite) {
  const fs::path& root = slot.root;
  if (fs::exists(root) && !fs::is_directory(root))
    fail("the save path {} is a file, not a folder: checkpoints cannot be written there", root.string());
  fs::create_directories(root);
  replace_check(slot.final_dir, run_id, overwrite);
  const int64_t save_seq = next_save_seq(root);
  // Temporary folders left by writers that died are garbage: no `latest` ever named them.
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename().string().starts_with(".iter_")) fs::remove_all(e.path());
  fs::create_directories(slot.tmp);
  return save_seq;
}

void publish_save_slot(const SaveSlot& slot) {
  // Re-saving an iteration of this run after a restart (or one --overwrite allows).
  if (fs::exists(slot.final_dir)) fs::remove_all(slot.final_dir);
  fs::rename(slot.tmp, slot.final_dir);
  fsync_path(slot.root, true);
  maybe_kill_after("renamed");  // complete, but `latest` still names the previous one

  const std::string latest = slot.final_dir.filename().string() + "\n";
  write_whole_file(slot.root / ".latest.tmp", latest.data(), latest.size());
  fs::rename(slot.root / ".latest.tmp", slot.root / "latest");
  fsync_path(slot.root, true);
}

void discard_save_slot(const SaveSlot& slot) {
  std::error_code ec;
  fs::remove_all(slot.tmp, ec);
}

}  // namespace primus::checkpoint
