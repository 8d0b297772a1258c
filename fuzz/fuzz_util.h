// Helpers shared by the fuzz targets: a scratch folder per process (in /dev/shm when it exists,
// so that targets that must read files do not wear a disk) and writing bytes to a file there.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

namespace primus::fuzz {

// Removed when the process ends.
struct Scratch {
  std::filesystem::path dir;
  Scratch() {
    const std::filesystem::path base =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    dir = base / ("primus_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

inline std::filesystem::path scratch_dir() {
  static const Scratch s;
  return s.dir;
}

inline std::filesystem::path write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  const auto p = scratch_dir() / name;
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return p;
}

// An input refused with primus::Error is fine; PRIMUS_FUZZ_VERBOSE=1 prints why (to check seeds).
inline void refused(const std::exception& e) {
  static const bool verbose = std::getenv("PRIMUS_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
}

}  // namespace primus::fuzz
