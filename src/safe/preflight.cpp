#include "safe/preflight.h"

#include <fcntl.h>
#include <gnu/libc-version.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/timex.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <cblas.h>
#include <fmt/format.h>
#include <mpi.h>

#include "core/error.h"
#include "core/launch_env.h"
#include "kernels/cpu/bf16/gemm.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm.h"
#include "parallel/process_group.h"
#include "safe/detect.h"
#include "safe/events.h"

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace primus::safe {
namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  return fmt::format("{:.1f} {}", b, units[u]);
}

CheckResult result(const std::string& section, const std::string& name, const std::string& status,
                   const std::string& value, const std::string& detail) {
  CheckResult c{section, name, status, value, detail, host_name(), discover_launch_env().rank};
  return c;
}

std::map<std::string, std::string> meminfo() {
  std::map<std::string, std::string> m;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t c = line.find(':');
    if (c == std::string::npos) continue;
    std::string v = line.substr(c + 1);
    v.erase(0, v.find_first_not_of(' '));
    m[line.substr(0, c)] = v;
  }
  return m;
}

int64_t meminfo_bytes(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) return -1;
  return std::stoll(it->second) * 1024;  // "/proc/meminfo" is in kB
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t\r\n"));
  s.erase(s.find_last_not_of(" \t\r\n") + 1);
  return s;
}

std::string run_output(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

bool on_path(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (::access((fs::path(dir) / prog).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace

json to_json(const CheckResult& c) {
  return json{{"section", c.section}, {"name", c.name}, {"status", c.status}, {"value", c.value},
              {"detail", c.detail},   {"node", c.node}, {"rank", c.rank}};
}

CheckResult check_from_json(const json& j) {
  return CheckResult{j.value("section", ""), j.value("name", ""), j.value("status", ""), j.value("value", ""),
                     j.value("detail", ""),  j.value("node", ""), j.value("rank", -1)};
}

// ---- host --------------------------------------------------------------------------------------

std::vector<CheckResult> host_checks() {
  std::vector<CheckResult> out;
  // CPU: model and the instruction set our binaries need (-march=x86-64-v3: AVX2 and FMA).
  std::string model, flags;
  {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (model.empty() && line.starts_with("model name")) model = trim(line.substr(line.find(':') + 1));
      if (flags.empty() && line.starts_with("flags")) flags = " " + line.substr(line.find(':') + 1) + " ";
    }
  }
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::vector<std::string> missing;
  for (const char* f : {"avx2", "fma"})
    if (flags.find(std::string(" ") + f + " ") == std::string::npos) missing.push_back(f);
  out.push_back(result("host", "cpu", missing.empty() ? "pass" : "fail",
                       fmt::format("{} x {}", cores, model.empty() ? "unknown CPU" : model),
                       missing.empty() ? "AVX2 and FMA present (the build targets x86-64-v3); " + cpu::cpu_features().summary()
                                       : fmt::format("missing {}: the CPU kernels are built for x86-64-v3",
                                                     fmt::join(missing, ", "))));
  // SGEMM: a short measurement; there is no expected speed for an arbitrary CPU, so it is
  // reported, and only a broken BLAS (no result) fails.
  {
    const double gf = cpu::measure_sgemm_peak_gflops(512, 3);
    out.push_back(result("host", "cpu sgemm", gf > 0 ? "info" : "fail", fmt::format("{:.1f} GFLOP/s", gf),
                         "best of 3 SGEMMs at 512^3 on all threads (OpenBLAS)"));
  }
  // bf16 on the CPU: which instructions the bf16 backend finds (kernels/cpu/cpu_features.h), and
  // a short bf16 GEMM where it runs. AMX that the kernel refuses is a warning: it is there and
  // would be several times faster.
  {
    const cpu::CpuFeatures& f = cpu::cpu_features();
    const bool amx_present = f.amx_tile && f.amx_bf16;
    std::string status = "info", value, detail;
    if (f.amx_usable())
      status = "pass", value = "AMX and AVX512-BF16";
    else if (f.avx512_bf16_usable())
      value = amx_present ? "AVX512-BF16; AMX refused" : "AVX512-BF16, no AMX";
    else
      value = f.avx512() ? "AVX-512 without AVX512-BF16" : "no AVX-512";
    if (amx_present && !f.amx_usable()) status = "warn";
    detail = f.summary() + ". ";
    if (f.avx512_bf16_usable()) {
      const double gf = cpu::bf16k::measure_bf16_gemm_peak_gflops(512, 3);
      value += fmt::format(", bf16 GEMM {:.1f} GFLOP/s", gf);
      detail += "bf16 training on the CPU runs on the bf16 backend; best of 3 bf16 GEMMs at 512^3 on all threads";
    } else {
      detail += "bf16 training on the CPU falls back to the slow reference backend (bf16: false trains fp32 at full speed)";
    }
    out.push_back(result("host", "cpu bf16", status, value, detail));
  }
  // Memory.
  {
    const auto m = meminfo();
    const int64_t total = meminfo_bytes(m, "MemTotal"), avail = meminfo_bytes(m, "MemAvailable");
    std::string status = "pass", detail = "at least 10% and 2 GiB available";
    if (avail >= 0 && avail < (1ll << 30)) status = "fail", detail = "less than 1 GiB available: training will be killed";
    else if (avail >= 0 && (avail < total / 10 || avail < (2ll << 30)))
      status = "warn", detail = "little memory available: other processes hold it";
    out.push_back(result("host", "memory", status,
                         fmt::format("{} available of {}", human_bytes(double(avail)), human_bytes(double(total))), detail));
  }
  // Limits.
  {
    rlimit r{};
    ::getrlimit(RLIMIT_NOFILE, &r);
    const bool ok = r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= 8192;
    out.push_back(result("host", "open files limit", ok ? "pass" : "warn",
                         r.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(r.rlim_cur),
                         ok ? "at least 8192" : "below 8192: many ranks, data files and sockets can exhaust it (ulimit -n 65536)"));
  }
  {
    rlimit r{};
    ::getrlimit(RLIMIT_MEMLOCK, &r);
    std::error_code ec;
    bool rdma = false;
    for (const auto& e : fs::directory_iterator("/sys/class/infiniband", ec)) rdma = true, (void)e;
    const bool unlimited = r.rlim_cur == RLIM_INFINITY;
    const std::string value = unlimited ? "unlimited" : human_bytes(double(r.rlim_cur));
    if (unlimited)
      out.push_back(result("host", "locked memory limit", "pass", value, "unlimited, as RDMA needs"));
    else if (rdma)
      out.push_back(result("host", "locked memory limit", "fail", value,
                           "RDMA devices are present but pinned memory is limited: set memlock unlimited "
                           "(/etc/security/limits.conf, or the container's --ulimit memlock=-1)"));
    else
      out.push_back(result("host", "locked memory limit", "pass", value, "limited, but no RDMA devices need it"));
  }
  // Clock: the kernel's NTP state (ntp_adjtime reads it, changes nothing).
  {
    timex tx{};
    const int state = ::ntp_adjtime(&tx);
    const bool synced = state != TIME_ERROR && !(tx.status & STA_UNSYNC);
    out.push_back(result("host", "clock sync", synced ? "pass" : "warn",
                         synced ? fmt::format("synchronised, max error {} us", tx.maxerror) : "not synchronised",
                         synced ? "kernel reports NTP synchronisation"
                                : "the kernel clock is not NTP-synchronised (chrony/ntpd/systemd-timesyncd): log "
                                  "times across nodes may disagree; the network check measures the offset between ranks"));
  }
  // Versions: for the report and for comparing nodes.
  {
    utsname u{};
    ::uname(&u);
    char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    MPI_Get_library_version(mpi, &len);  // allowed before MPI_Init
    std::string mpi_s = trim(std::string(mpi, size_t(len)));
    mpi_s = mpi_s.substr(0, mpi_s.find(','));
    out.push_back(result("host", "versions", "info",
                         fmt::format("kernel {}, glibc {}", u.release, gnu_get_libc_version()),
                         fmt::format("{}; OpenBLAS {}; compiler g++ {}", mpi_s, trim(openblas_get_config()), __VERSION__)));
  }
  return out;
}

// ---- gpu ---------------------------------------------------------------------------------------

const char* const kNvidiaSmiQuery =
    "index,name,memory.total,driver_version,ecc.errors.uncorrected.volatile.total,retired_pages.pending,clocks.sm,"
    "clocks.max.sm,temperature.gpu";

std::vector<CheckResult> gpu_checks_from_nvidia_smi(const std::string& csv) {
  std::vector<CheckResult> out;
  std::stringstream ss(csv);
  std::string line;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(ss, line)) {
    if (trim(line).empty()) continue;
    std::vector<std::string> f;
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) f.push_back(trim(cell));
    if (f.size() != 9) fail("nvidia-smi gave {} fields instead of 9 in line '{}'", f.size(), line);
    rows.push_back(f);
  }
  auto num = [](const std::string& s) -> double {  // "[N/A]", "[Not Supported]" -> NaN
    try {
      size_t used = 0;
      const double v = std::stod(s, &used);
      return used ? v : std::nan("");
    } catch (const std::exception&) {
      return std::nan("");
    }
  };
  std::map<std::string, int> models;
  for (const auto& f : rows) models[f[1]]++;
  std::string summary;
  for (auto& [m, n] : models) summary += fmt::format("{}{} x {}", summary.empty() ? "" : ", ", n, m);
  out.push_back(result("gpu", "gpus", rows.empty() ? "fail" : models.size() > 1 ? "warn" : "pass",
                       rows.empty() ? "none" : summary,
                       rows.empty() ? "nvidia-smi lists no GPU" : models.size() > 1 ? "mixed GPU models on one node"
                                                                                    : fmt::format("driver {}", rows[0][3])));
  for (const auto& f : rows) {
    const std::string gpu = "gpu " + f[0];
    const double ecc = num(f[4]), clock = num(f[6]), max_clock = num(f[7]), temp = num(f[8]);
    std::string status = "pass";
    std::vector<std::string> why;
    if (std::isfinite(ecc) && ecc > 0) status = "fail", why.push_back(fmt::format("{} uncorrected ECC errors", ecc));
    if (f[5] == "Yes") status = "fail", why.push_back("retired pages pending (the GPU needs a reset)");
    if (std::isfinite(temp) && temp >= 85 && status == "pass") status = "warn", why.push_back(fmt::format("{:.0f} C", temp));
    if (why.empty()) why.push_back("no uncorrected ECC errors, no pending page retirement");
    out.push_back(result("gpu", gpu, status,
                         fmt::format("{}, {} MiB, SM clock {}/{} MHz, {} C", f[1], f[2],
                                     std::isfinite(clock) ? fmt::format("{:.0f}", clock) : "?",
                                     std::isfinite(max_clock) ? fmt::format("{:.0f}", max_clock) : "?",
                                     std::isfinite(temp) ? fmt::format("{:.0f}", temp) : "?"),
                         fmt::format("{}", fmt::join(why, "; "))));
  }
  if (!rows.empty())
    out.push_back(result("gpu", "gpu gemm and memory bandwidth", "skip", "not measured",
                         "this build has no CUDA/HIP backend to run kernels on the device"));
  return out;
}

std::vector<CheckResult> gpu_checks() {
  if (on_path("nvidia-smi")) {
    const std::string csv =
        run_output(fmt::format("nvidia-smi --query-gpu={} --format=csv,noheader,nounits 2>&1", kNvidiaSmiQuery));
    try {
      return gpu_checks_from_nvidia_smi(csv);
    } catch (const Error& e) {
      return {result("gpu", "gpus", "fail", "nvidia-smi failed", fmt::format("{}: {}", e.what(), trim(csv).substr(0, 200)))};
    }
  }
  if (on_path("rocm-smi"))
    return {result("gpu", "gpus", "skip", "AMD GPU tools found",
                   "rocm-smi is present, but the AMD GPU checks are not implemented yet")};
  return {result("gpu", "gpus", "skip", "no GPU", "neither nvidia-smi nor rocm-smi is on PATH: a CPU-only node")};
}

// ---- storage -----------------------------------------------------------------------------------

std::vector<CheckResult> storage_checks(const std::vector<fs::path>& paths, int64_t bytes) {
  std::vector<CheckResult> out;
  const size_t block = 1 << 22;
  for (const auto& p : paths) {
    const std::string name = "storage " + p.string();
    std::error_code ec;
    fs::create_directories(p, ec);
    if (ec || !fs::is_directory(p)) {
      out.push_back(result("storage", name, "fail", "not a writable folder",
                           fmt::format("cannot create {}: {}", p.string(), ec ? ec.message() : "a file is in the way")));
      continue;
    }
    struct statvfs sv{};
    const bool have_free = ::statvfs(p.c_str(), &sv) == 0;
    const double free_b = have_free ? double(sv.f_bavail) * double(sv.f_frsize) : -1;
    const fs::path file = p / fmt::format(".primus_preflight_{}_{}", host_name(), ::getpid());
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      out.push_back(result("storage", name, "fail", "not writable", fmt::format("cannot create a file in {}: {}",
                                                                               p.string(), std::strerror(errno))));
      continue;
    }
    // A pattern that differs per block, so a read that returns the wrong block is caught.
    std::vector<uint64_t> buf(block / 8);
    uint64_t sum_written = 0;
    bool write_ok = true;
    const auto t0 = Clock::now();
    int64_t done = 0;
    for (int64_t b = 0; done < bytes; ++b) {
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = (uint64_t(b) << 32) ^ (i * 0x9E3779B97F4A7C15ull);
      const size_t n = size_t(std::min<int64_t>(int64_t(block), bytes - done));
      for (size_t i = 0; i < n / 8; ++i) sum_written += buf[i];
      if (::write(fd, buf.data(), n) != ssize_t(n)) {
        write_ok = false;
        break;
      }
      done += int64_t(n);
    }
    const bool sync_ok = ::fsync(fd) == 0;
    const double wt = seconds_since(t0);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // drop our pages, so the read comes from the device
    ::close(fd);
    if (!write_ok || !sync_ok) {
      out.push_back(result("storage", name, "fail", "write failed",
                           fmt::format("writing {} to {}: {}", human_bytes(double(bytes)), p.string(), std::strerror(errno))));
      fs::remove(file, ec);
      continue;
    }
    fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    uint64_t sum_read = 0;
    const auto t1 = Clock::now();
    int64_t got = 0;
    ssize_t n;
    while (fd >= 0 && (n = ::read(fd, buf.data(), block)) > 0) {
      for (size_t i = 0; i < size_t(n) / 8; ++i) sum_read += buf[i];
      got += n;
    }
    const double rt = seconds_since(t1);
    if (fd >= 0) ::close(fd);
    fs::remove(file, ec);
    const double wmb = double(bytes) / wt / 1e6, rmb = double(got) / rt / 1e6;
    std::string status = "pass", detail = fmt::format("{} written with fsync and read back intact; {} free",
                                                      human_bytes(double(bytes)), human_bytes(free_b));
    if (got != bytes || sum_read != sum_written) status = "fail", detail = "the data read back differs from what was written";
    else if (have_free && free_b < double(1ll << 30)) status = "fail", detail = fmt::format("only {} free", human_bytes(free_b));
    else if (have_free && free_b < 10.0 * double(1ll << 30))
      status = "warn", detail = fmt::format("only {} free: checkpoints may not fit", human_bytes(free_b));
    out.push_back(result("storage", name, status, fmt::format("write {:.0f} MB/s, read {:.0f} MB/s", wmb, rmb), detail));
  }
  return out;
}

// ---- network -----------------------------------------------------------------------------------

std::vector<CheckResult> network_checks(parallel::ProcessGroup& pg, const NetworkOptions& o) {
  using parallel::CommType;
  using parallel::ReduceOp;
  const int n = pg.size(), me = pg.rank();
  std::vector<CheckResult> out;
  // Where each rank runs, for naming links.
  std::vector<std::string> nodes(n);
  {
    std::string h = host_name();
    h.resize(64, '\0');
    std::vector<char> all(64 * size_t(n));
    pg.all_gather(h.data(), all.data(), 64, CommType::U8);
    for (int r = 0; r < n; ++r) nodes[r] = std::string(all.data() + 64 * r, strnlen(all.data() + 64 * r, 64));
  }
  auto who = [&](int r) { return fmt::format("rank {} ({})", r, nodes[r]); };
  // Correctness first: a wrong sum makes every number below meaningless.
  {
    std::vector<double> v(1024, double(me + 1));
    pg.all_reduce(v);
    const double expect = double(n) * (n + 1) / 2;
    bool ok = true;
    for (double x : v) ok &= x == expect;
    const double all_ok = pg.all_reduce_value(ok ? 1.0 : 0.0, ReduceOp::Min);
    out.push_back(result("network", "all-reduce correctness", all_ok == 1.0 ? "pass" : "fail",
                         fmt::format("{} ranks", n),
                         all_ok == 1.0 ? "sum over ranks is exact on every rank" : "a rank received a wrong sum"));
  }
  // Clock offset of each rank against rank 0 (Cristian's method: the midpoint of a round trip).
  {
    std::vector<double> offsets(n, 0.0);
    for (int r = 1; r < n; ++r) {
      double t[1];
      if (me == 0) {
        double best_rtt = 1e9, best_off = 0;
        for (int k = 0; k < 5; ++k) {
          const double t0 = now_epoch();
          pg.isend(t, 1, CommType::F64, r, 1)->wait();
          pg.irecv(t, 1, CommType::F64, r, 2)->wait();
          const double t1 = now_epoch();
          if (t1 - t0 < best_rtt) best_rtt = t1 - t0, best_off = t[0] - 0.5 * (t0 + t1);
        }
        offsets[r] = best_off;
      } else if (me == r) {
        for (int k = 0; k < 5; ++k) {
          pg.irecv(t, 1, CommType::F64, 0, 1)->wait();
          t[0] = now_epoch();
          pg.isend(t, 1, CommType::F64, 0, 2)->wait();
        }
      }
    }
    double worst = 0;
    int worst_rank = 0;
    for (int r = 0; r < n; ++r)
      if (std::fabs(offsets[r]) > std::fabs(worst)) worst = offsets[r], worst_rank = r;
    out.push_back(result("network", "clock offset", std::fabs(worst) <= o.max_clock_offset_s ? "pass" : "warn",
                         fmt::format("{:+.3f} ms (worst: {})", 1e3 * worst, who(worst_rank)),
                         fmt::format("wall clocks of all ranks against rank 0; warn above {:.0f} ms", 1e3 * o.max_clock_offset_s)));
  }
  // Point-to-point, one pair at a time while the others wait: latency (8-byte ping-pong, half the
  // round trip) and bandwidth (ping-pong of p2p_bytes, bytes moved / time).
  struct Pair {
    int a, b;
    double lat_us, bw_gbs;
  };
  std::vector<Pair> pairs;
  std::vector<char> big(size_t(o.p2p_bytes), 1), small(8, 1);
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      pg.barrier();
      double lat = 0, bw = 0;
      if (me == a || me == b) {
        const int peer = me == a ? b : a;
        auto pingpong = [&](std::vector<char>& buf, int reps) {
          for (int k = 0; k < reps; ++k) {
            if (me == a) {
              pg.isend(buf.data(), int64_t(buf.size()), CommType::U8, peer, 3)->wait();
              pg.irecv(buf.data(), int64_t(buf.size()), CommType::U8, peer, 4)->wait();
            } else {
              pg.irecv(buf.data(), int64_t(buf.size()), CommType::U8, peer, 3)->wait();
              pg.isend(buf.data(), int64_t(buf.size()), CommType::U8, peer, 4)->wait();
            }
          }
        };
        pingpong(small, 10);  // warm-up: connection set-up is not latency
        auto t0 = Clock::now();
        pingpong(small, o.latency_reps);
        lat = seconds_since(t0) / (2.0 * o.latency_reps);
        pingpong(big, 1);
        t0 = Clock::now();
        pingpong(big, o.p2p_reps);
        bw = 2.0 * double(o.p2p_bytes) * o.p2p_reps / seconds_since(t0) / 1e9;
      }
      if (me == a) pairs.push_back({a, b, 1e6 * lat, bw});
    }
  // Every rank holds the pairs it led; rank 0 needs all of them.
  {
    const int64_t total = int64_t(n) * (n - 1) / 2;
    std::vector<double> lat(size_t(total), 0.0), bw(size_t(total), 0.0);
    int64_t idx = 0;
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b, ++idx)
        for (const auto& p : pairs)
          if (p.a == a && p.b == b) lat[size_t(idx)] = p.lat_us, bw[size_t(idx)] = p.bw_gbs;
    pg.all_reduce(lat);
    pg.all_reduce(bw);
    pairs.clear();
    idx = 0;
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b, ++idx) pairs.push_back({a, b, lat[size_t(idx)], bw[size_t(idx)]});
  }
  std::vector<double> bws, lats;
  for (const auto& p : pairs) bws.push_back(p.bw_gbs), lats.push_back(p.lat_us);
  const double med_bw = median(bws), med_lat = median(lats);
  for (const auto& p : pairs) {
    const bool slow = p.bw_gbs < o.slow_factor * med_bw || p.lat_us > med_lat / o.slow_factor;
    out.push_back(result("network", fmt::format("p2p {} <-> {}", who(p.a), who(p.b)), slow ? "warn" : "pass",
                         fmt::format("{:.1f} us, {:.2f} GB/s", p.lat_us, p.bw_gbs),
                         slow ? fmt::format("slow link: below {:.0f}% of the median bandwidth {:.2f} GB/s or above "
                                            "{:.0f}x the median latency {:.1f} us", 100 * o.slow_factor, med_bw,
                                            1 / o.slow_factor, med_lat)
                              : fmt::format("{} ping-pongs of 8 B and {} of {}", o.latency_reps, o.p2p_reps,
                                            human_bytes(double(o.p2p_bytes)))));
  }
  // Slow ranks: with 3+ ranks, a rank whose links are all slow is the likely culprit.
  if (n >= 3) {
    std::vector<double> rank_bw(n);
    for (int r = 0; r < n; ++r) {
      std::vector<double> v;
      for (const auto& p : pairs)
        if (p.a == r || p.b == r) v.push_back(p.bw_gbs);
      rank_bw[r] = median(v);
    }
    const double m = median(rank_bw);
    std::vector<std::string> slow;
    for (int r = 0; r < n; ++r)
      if (rank_bw[r] < o.slow_factor * m) slow.push_back(who(r));
    out.push_back(result("network", "slow ranks", slow.empty() ? "pass" : "warn",
                         slow.empty() ? "none" : fmt::format("{}", fmt::join(slow, ", ")),
                         fmt::format("median bandwidth of each rank's links against the median {:.2f} GB/s", m)));
  }
  // All-reduce bus bandwidth, as nccl-tests reports it: the time is the slowest rank's, algbw =
  // bytes / time and busbw = algbw * 2(n-1)/n, the rate each link must sustain in a ring.
  std::string table;
  double best_busbw = 0;
  for (int64_t bytes : o.allreduce_bytes) {
    std::vector<float> buf(size_t(bytes / 4), 1.0f);
    pg.all_reduce(buf.data(), int64_t(buf.size()), CommType::F32, ReduceOp::Sum);  // warm-up
    pg.barrier();
    const auto t0 = Clock::now();
    for (int k = 0; k < o.allreduce_reps; ++k) pg.all_reduce(buf.data(), int64_t(buf.size()), CommType::F32, ReduceOp::Sum);
    const double t = pg.all_reduce_value(seconds_since(t0) / o.allreduce_reps, ReduceOp::Max);
    const double algbw = double(bytes) / t / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
    best_busbw = std::max(best_busbw, busbw);
    table += fmt::format("{}{}: {:.1f} us, algbw {:.2f} GB/s, busbw {:.2f} GB/s", table.empty() ? "" : "; ",
                         human_bytes(double(bytes)), 1e6 * t, algbw, busbw);
  }
  out.push_back(result("network", "all-reduce bus bandwidth", "info", fmt::format("{:.2f} GB/s at the largest size", best_busbw),
                       table));
  if (me != 0) out.clear();
  return out;
}

// ---- report ------------------------------------------------------------------------------------

int PreflightReport::count(const std::string& status) const {
  return int(std::count_if(checks.begin(), checks.end(), [&](const CheckResult& c) { return c.status == status; }));
}

std::string render_markdown(const PreflightReport& r) {
  std::string s = fmt::format("# Preflight report\n\n{} rank(s), reported by {} at {}\n\n", r.world_size, r.host, r.time);
  s += fmt::format("**{} pass, {} warn, {} fail, {} skip, {} info**\n", r.count("pass"), r.count("warn"), r.count("fail"),
                   r.count("skip"), r.count("info"));
  auto cell = [](std::string v) {
    for (size_t i = 0; (i = v.find('|', i)) != std::string::npos; i += 2) v.replace(i, 1, "\\|");
    return v;
  };
  for (const char* section : {"host", "gpu", "network", "storage"}) {
    bool any = false;
    for (const auto& c : r.checks) any |= c.section == section;
    if (!any) continue;
    s += fmt::format("\n## {}\n\n| check | node | status | value | detail |\n|---|---|---|---|---|\n", section);
    for (const auto& c : r.checks)
      if (c.section == section)
        s += fmt::format("| {} | {} | {} | {} | {} |\n", cell(c.name), cell(c.node),
                         c.status == "fail" ? "**FAIL**" : c.status == "warn" ? "WARN" : c.status, cell(c.value),
                         cell(c.detail));
  }
  return s;
}

json render_json(const PreflightReport& r) {
  json checks = json::array();
  for (const auto& c : r.checks) checks.push_back(to_json(c));
  return json{{"host", r.host},
              {"time", r.time},
              {"world_size", r.world_size},
              {"summary",
               {{"pass", r.count("pass")}, {"warn", r.count("warn")}, {"fail", r.count("fail")},
                {"skip", r.count("skip")}, {"info", r.count("info")}}},
              {"checks", checks}};
}

void check_report_path(const fs::path& path) {
  std::error_code ec;
  if (path.empty()) fail("the preflight report path is empty");
  if (fs::is_directory(path, ec)) fail("cannot write the preflight report to '{}': it is a folder", path.string());
  const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec))
    fail("cannot write the preflight report to '{}': folder '{}' does not exist", path.string(), parent.string());
  if (::access(parent.c_str(), W_OK) != 0)
    fail("cannot write the preflight report to '{}': folder '{}' is not writable ({})", path.string(), parent.string(),
         std::strerror(errno));
  if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0)
    fail("cannot write the preflight report to '{}': the file is not writable ({})", path.string(), std::strerror(errno));
}

}  // namespace primus::safe
