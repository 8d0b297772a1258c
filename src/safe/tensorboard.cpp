#include "safe/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/launch_env.h"
#include "core/log.h"
#include "safe/events.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace primus::safe {
namespace {

// CRC-32C's reflected polynomial.
std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// Protocol-buffer wire format: the field key (number, wire type), varints, fixed-size numbers.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, uint64_t(field) << 3 | uint64_t(wire_type));
}
template <class T>
void put_fixed(std::string& out, int field, T v) {  // wire type 1 (8 bytes) or 5 (4 bytes), little-endian
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  put_key(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& s) {
  put_key(out, field, 2);
  put_varint(out, s.size());
  out += s;
}

// Event: 1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary (Summary).
// Summary: 1 value (repeated Value). Value: 1 tag (string), 2 simple_value (float).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_fixed(e, 1, wall_time);
  if (step != 0) {
    put_key(e, 2, 0);
    put_varint(e, uint64_t(step));
  }
  return e;
}

std::string file_name() {
  return fmt::format("events.out.tfevents.{}.{}.{}.0", int64_t(now_epoch()), host_name(), ::getpid());
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

std::string tfrecord(const std::string& payload) {
  std::string r;
  const uint64_t len = payload.size();
  char b[8];
  std::memcpy(b, &len, 8);
  r.append(b, 8);
  uint32_t crc = masked_crc32c(b, 8);
  std::memcpy(b, &crc, 4);
  r.append(b, 4);
  r += payload;
  crc = masked_crc32c(payload.data(), payload.size());
  std::memcpy(b, &crc, 4);
  r.append(b, 4);
  return r;
}

std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v;
  put_bytes(v, 1, tag);
  put_fixed(v, 2, value);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

EventFileWriter::EventFileWriter(const std::string& dir, int64_t queue_size)
    : file_([&] {
        std::error_code ec;
        fs::create_directories(dir, ec);
        if (ec) fail("tensorboard_dir {}: cannot create it: {}", dir, ec.message());
        return (fs::path(dir) / file_name()).string();
      }()),
      queue_size_(std::max<int64_t>(1, queue_size)),
      last_flush_(std::chrono::steady_clock::now()) {
  std::string e = event_head(now_epoch(), 0);
  put_bytes(e, 3, "brain.Event:2");
  file_.append(tfrecord(e));
}

EventFileWriter::~EventFileWriter() {
  try {
    flush();
  } catch (const std::exception& e) {
    log::warn("TensorBoard events not written: {}", e.what());
  }
}

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  pending_ += tfrecord(scalar_event(tag, float(value), step, now_epoch()));
  ++queued_;
  if (queued_ >= queue_size_ || std::chrono::steady_clock::now() - last_flush_ > std::chrono::seconds(120)) flush();
}

void EventFileWriter::flush() {
  last_flush_ = std::chrono::steady_clock::now();
  if (pending_.empty()) return;
  std::string bytes;
  bytes.swap(pending_);
  queued_ = 0;
  file_.append(bytes);
}

TensorBoardLog::TensorBoardLog(const TensorBoardOptions& o) : o_(o), file_(o.dir, o.queue_size) {
  if (o_.log_interval <= 0) fail("tensorboard_log_interval must be positive, got {}", o_.log_interval);
}

void TensorBoardLog::both(const std::string& tag, double value, int64_t iteration, int64_t samples) {
  file_.add_scalar(tag, value, iteration);
  file_.add_scalar(tag + " vs samples", value, samples);
}

void TensorBoardLog::write(const json& row) {
  const int64_t it = row.at("iteration").get<int64_t>();
  const int64_t samples = row.value("consumed_samples", int64_t(0));
  if (row.contains("eval_lm_loss")) {  // Megatron's evaluate_and_print_results
    const double loss = row["eval_lm_loss"].get<double>();
    both("lm loss validation", loss, it, samples);
    if (o_.validation_ppl) both("lm loss validation ppl", std::exp(std::min(20.0, loss)), it, samples);
    return;
  }
  if (!row.contains("lm_loss")) return;
  if (it % o_.log_interval == 0) {  // Megatron's training_log, at tensorboard_log_interval
    if (o_.learning_rate) both("learning-rate", row["lr"].get<double>(), it, samples);
    if (o_.batch_size) both("batch-size", double(o_.global_batch_size), it, samples);
    both("lm loss", row["lm_loss"].get<double>(), it, samples);
    if (o_.loss_scale) both("loss-scale", 1.0, it, samples);  // bf16 and fp32 train without loss scaling
    if (o_.world_size) both("world-size", double(o_.world), it, samples);
    both("grad-norm", row["grad_norm"].get<double>(), it, samples);
    if (o_.memory) {
      file_.add_scalar("mem-reserved-bytes", row.value("memory_reserved_bytes", 0.0), it);
      file_.add_scalar("mem-allocated-bytes", row.value("memory_allocated_bytes", 0.0), it);
      file_.add_scalar("mem-max-allocated-bytes", row.value("peak_memory_bytes", 0.0), it);
    }
  }
  if (o_.timers) {  // at log_interval, as Megatron: seconds per iteration, TFLOP/s per rank
    file_.add_scalar("iteration-time", row["step_time_ms"].get<double>() / 1e3, it);
    file_.add_scalar("throughput", row["tflops"].get<double>() / double(o_.world), it);
  }
}

}  // namespace primus::safe
