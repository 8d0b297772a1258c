// The TensorBoard event file's pieces: CRC-32C against its published check value, the TFRecord
// framing, and the protocol-buffer bytes of a scalar event spelled out field by field.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "safe/tensorboard.h"
#include "support/temp_dir.h"

using namespace primus::safe;

TEST(EventFile, Crc32cCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C catalogue's check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const uint32_t c = crc32c("abc", 3);
  EXPECT_EQ(masked_crc32c("abc", 3), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(EventFile, RecordFraming) {
  const std::string payload = "hello";
  const std::string r = tfrecord(payload);
  ASSERT_EQ(r.size(), 8 + 4 + payload.size() + 4);
  uint64_t len = 0;
  std::memcpy(&len, r.data(), 8);
  EXPECT_EQ(len, payload.size());
  uint32_t crc = 0;
  std::memcpy(&crc, r.data() + 8, 4);
  EXPECT_EQ(crc, masked_crc32c(r.data(), 8));
  EXPECT_EQ(r.substr(12, payload.size()), payload);
  std::memcpy(&crc, r.data() + 12 + payload.size(), 4);
  EXPECT_EQ(crc, masked_crc32c(payload.data(), payload.size()));
}

TEST(EventFile, ScalarEventBytes) {
  // Event { wall_time: 2.0 (field 1, fixed64), step: 300 (field 2, varint),
  //         summary (field 5) { value (field 1) { tag: "a" (field 1), simple_value: 1.5 (field 2, fixed32) } } }
  const std::string e = scalar_event("a", 1.5f, 300, 2.0);
  std::string want = "\x09";
  double w = 2.0;
  want.append(reinterpret_cast<const char*>(&w), 8);
  want += "\x10\xAC\x02";  // 300 as a varint
  want += "\x2A\x0A"
          "\x0A\x08"
          "\x0A\x01"
          "a"
          "\x15";  // summary(10 bytes) > value(8 bytes) > tag, simple_value
  float v = 1.5f;
  want.append(reinterpret_cast<const char*>(&v), 4);
  EXPECT_EQ(e, want);
}

TEST(EventFile, QueueIsWrittenWhenFullAndOnFlush) {
  primus::test::TempDir d;
  EventFileWriter w((d.path / "tb").string(), 3);
  const auto size = [&] { return std::filesystem::file_size(w.path()); };
  const auto first = size();  // the file_version record
  EXPECT_GT(first, 16u);
  w.add_scalar("x", 1, 1);
  w.add_scalar("x", 2, 2);
  EXPECT_EQ(size(), first);
  w.add_scalar("x", 3, 3);  // the third fills the queue
  EXPECT_GT(size(), first);
  const auto three = size();
  w.add_scalar("x", 4, 4);
  w.flush();
  EXPECT_GT(size(), three);
  EXPECT_NE(std::filesystem::path(w.path()).filename().string().find("events.out.tfevents."), std::string::npos);
}
