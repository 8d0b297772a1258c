// Preflight checks that run in one process: host, GPU rules (from nvidia-smi text), storage,
// the report and its path. The network checks need ranks: tests/integration/safe.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "kernels/cpu/cpu_features.h"
#include "safe/preflight.h"

namespace fs = std::filesystem;
using namespace primus;
using namespace primus::safe;

namespace {
fs::path temp(const char* tag) {
  auto d = fs::temp_directory_path() / ("primus_preflight_" + std::to_string(::getpid()) + "_" + tag);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}
const CheckResult* find(const std::vector<CheckResult>& v, const std::string& name) {
  for (const auto& c : v)
    if (c.name == name) return &c;
  return nullptr;
}
}  // namespace

TEST(Preflight, HostChecksOnThisMachine) {
  auto r = host_checks();
  for (const char* n : {"cpu", "cpu sgemm", "cpu bf16", "memory", "open files limit", "locked memory limit",
                        "clock sync", "versions"})
    ASSERT_NE(find(r, n), nullptr) << n;
  EXPECT_EQ(find(r, "cpu")->status, "pass");  // we run, so AVX2 and FMA are there
  EXPECT_NE(find(r, "cpu sgemm")->value.find("GFLOP/s"), std::string::npos);
  // The bf16 instructions are reported whatever the CPU has; a bf16 GEMM is timed where they run.
  const CheckResult* bf = find(r, "cpu bf16");
  for (const char* part : {"AVX-512 ", "AVX512-BF16 ", "AMX "})
    EXPECT_NE(bf->detail.find(part), std::string::npos) << part << " in " << bf->detail;
  EXPECT_EQ(bf->value.find("GFLOP/s") != std::string::npos, cpu::cpu_features().avx512_bf16_usable()) << bf->value;
  EXPECT_NE(find(r, "versions")->detail.find("Open MPI"), std::string::npos) << find(r, "versions")->detail;
  for (const auto& c : r) EXPECT_NE(c.status, "fail") << c.name << ": " << c.detail;
}

TEST(Preflight, NvidiaSmiRules) {
  const std::string csv =
      "0, NVIDIA H100 80GB HBM3, 81559, 550.54.15, 0, No, 1980, 1980, 35\n"
      "1, NVIDIA H100 80GB HBM3, 81559, 550.54.15, 2, No, 1980, 1980, 36\n"
      "2, NVIDIA H100 80GB HBM3, 81559, 550.54.15, [N/A], Yes, 345, 1980, 40\n"
      "3, NVIDIA H100 80GB HBM3, 81559, 550.54.15, [Not Supported], [N/A], 1980, 1980, 88\n";
  auto r = gpu_checks_from_nvidia_smi(csv);
  ASSERT_NE(find(r, "gpus"), nullptr);
  EXPECT_EQ(find(r, "gpus")->value, "4 x NVIDIA H100 80GB HBM3");
  EXPECT_EQ(find(r, "gpu 0")->status, "pass");
  EXPECT_EQ(find(r, "gpu 1")->status, "fail");
  EXPECT_NE(find(r, "gpu 1")->detail.find("2 uncorrected ECC errors"), std::string::npos);
  EXPECT_EQ(find(r, "gpu 2")->status, "fail");
  EXPECT_NE(find(r, "gpu 2")->detail.find("retired pages pending"), std::string::npos);
  EXPECT_EQ(find(r, "gpu 3")->status, "warn");  // 88 C
  EXPECT_EQ(find(r, "gpu gemm and memory bandwidth")->status, "skip");
  EXPECT_THROW(gpu_checks_from_nvidia_smi("0, only, three\n"), Error);
  auto none = gpu_checks_from_nvidia_smi("");
  EXPECT_EQ(find(none, "gpus")->status, "fail");
}

TEST(Preflight, NoGpuIsASkip) {
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  ::setenv("PATH", "/nonexistent", 1);
  auto r = gpu_checks();
  ::setenv("PATH", saved.c_str(), 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, "skip");
}

TEST(Preflight, StorageWritesReadsAndVerifies) {
  auto d = temp("storage");
  auto r = storage_checks({d / "ws", d / "ckpt"}, 3 << 20);
  ASSERT_EQ(r.size(), 2u);
  for (const auto& c : r) {
    EXPECT_NE(c.status, "fail") << c.detail;
    EXPECT_NE(c.value.find("write"), std::string::npos);
    EXPECT_NE(c.detail.find("read back intact"), std::string::npos) << c.detail;
  }
  EXPECT_TRUE(fs::is_directory(d / "ckpt"));  // created
  EXPECT_TRUE(fs::is_empty(d / "ws"));       // the test file is gone
  std::ofstream(d / "file") << "x";
  auto bad = storage_checks({d / "file" / "sub"}, 1 << 20);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].status, "fail");
  fs::remove_all(d);
}

TEST(Preflight, ReportPathAndRendering) {
  auto d = temp("report");
  EXPECT_NO_THROW(check_report_path(d / "r.md"));
  try {
    check_report_path(d / "missing" / "r.md");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_report_path(d), Error);  // a folder in the report's place
  PreflightReport rep;
  rep.host = "h";
  rep.time = "t";
  rep.checks = {{"host", "cpu", "pass", "2 x X", "ok", "h", 0}, {"storage", "storage /a|b", "fail", "v", "bad", "h", 0}};
  const std::string md = render_markdown(rep);
  EXPECT_NE(md.find("**1 pass, 0 warn, 1 fail"), std::string::npos) << md;
  EXPECT_NE(md.find("| storage /a\\|b | h | **FAIL** |"), std::string::npos) << md;
  auto j = render_json(rep);
  EXPECT_EQ(j["summary"]["fail"], 1);
  EXPECT_EQ(check_from_json(j["checks"][1]).name, "storage /a|b");
  fs::remove_all(d);
}
