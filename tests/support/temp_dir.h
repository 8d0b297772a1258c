// A fresh folder per test case (named after the process and the case), removed afterwards, with
// helpers that give a path in it (t / "name") and write a text file into it, returning its path.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace primus::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "primus_test_") {
    path = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

}  // namespace primus::test
