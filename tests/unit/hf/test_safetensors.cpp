#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "core/error.h"
#include "support/error_of.h"
#include "hf/safetensors.h"

namespace fs = std::filesystem;
using namespace primus;
using namespace primus::hf;

namespace {

using test::error_of;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("primus_st_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A file from its parts: header length, header, data.
void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::ofstream f(p, std::ios::binary);
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << data;
}

}  // namespace

// The byte layout of the format, built by hand: the reader finds the tensors where the format puts them.
TEST(Safetensors, ReadsAHandBuiltFile) {
  const fs::path d = fresh_dir("hand");
  const float v[3] = {1.5f, -2.0f, 3.25f};
  const uint16_t b[2] = {0x3F80, 0xC040};  // bf16 1.0, -3.0
  std::string data(reinterpret_cast<const char*>(b), 4);
  data.append(reinterpret_cast<const char*>(v), 12);
  write_raw(d / "model.safetensors",
            R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
            R"("a":{"dtype":"F32","shape":[1,3],"data_offsets":[4,16]}})",
            data);
  SafetensorsReader r(d.string());  // the folder: model.safetensors inside it
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.entry("a").shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(r.as_f32("a"), (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(r.as_f32("b"), (std::vector<float>{1.0f, -3.0f}));
  EXPECT_EQ(r.raw("b"), data.substr(0, 4));
  fs::remove_all(d);
}

TEST(Safetensors, WriteThenReadSingleAndSharded) {
  for (uint64_t shard : {uint64_t(1) << 30, uint64_t(100)}) {
    const fs::path d = fresh_dir(fmt::format("rw{}", shard));
    std::vector<TensorOut> ts;
    for (int i = 0; i < 5; ++i) {
      std::vector<float> v(size_t(10 + i));
      for (size_t k = 0; k < v.size(); ++k) v[k] = float(i) + 0.001f * float(k);
      ts.push_back({fmt::format("t{}", i), i % 2 ? "BF16" : "F32", {int64_t(v.size())}, f32_to_bytes(v, i % 2 ? "BF16" : "F32")});
    }
    auto files = write_safetensors(d.string(), ts, shard);
    const bool sharded = shard < 1000;
    EXPECT_EQ(fs::exists(d / "model.safetensors.index.json"), sharded);
    EXPECT_EQ(files.size(), sharded ? 3u + 1u : 1u);  // 40+22, 48+26, 56 bytes; and the index
    SafetensorsReader r(d.string());
    ASSERT_EQ(r.tensors().size(), 5u);
    for (const auto& t : ts) {
      EXPECT_EQ(r.raw(t.name), t.bytes) << t.name;
      EXPECT_EQ(r.entry(t.name).dtype, t.dtype);
    }
    // The header is padded so that data starts 8-byte aligned.
    std::ifstream f(files[0], std::ios::binary);
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ(n % 8, 0u);
    fs::remove_all(d);
  }
}

TEST(Safetensors, BadFilesAreNamedErrors) {
  const fs::path d = fresh_dir("bad");
  const std::string four(4, '\0');
  write_raw(d / "past_end.safetensors", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", four);
  EXPECT_NE(error_of([&] { SafetensorsReader r((d / "past_end.safetensors").string()); }).find("'x'"),
            std::string::npos);
  write_raw(d / "overlap.safetensors",
            R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
            std::string(8, '\0'));
  EXPECT_NE(error_of([&] { SafetensorsReader r((d / "overlap.safetensors").string()); }).find("overlap"),
            std::string::npos);
  write_raw(d / "dtype.safetensors", R"({"x":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", "a");
  EXPECT_NE(error_of([&] { SafetensorsReader r((d / "dtype.safetensors").string()); }).find("unknown dtype 'Q4'"),
            std::string::npos);
  write_raw(d / "json.safetensors", "{not json", "");
  EXPECT_NE(error_of([&] { SafetensorsReader r((d / "json.safetensors").string()); }).find("not valid JSON"),
            std::string::npos);
  {
    std::ofstream f(d / "short.safetensors");
    f << "abc";
  }
  EXPECT_NE(error_of([&] { SafetensorsReader r((d / "short.safetensors").string()); }).find("too short"),
            std::string::npos);
  EXPECT_NE(error_of([&] { SafetensorsReader r((d / "nothing").string()); }).find("does not exist"), std::string::npos);
  fs::create_directories(d / "empty");
  EXPECT_NE(error_of([&] { SafetensorsReader r((d / "empty").string()); }).find("neither"), std::string::npos);
  fs::remove_all(d);
}

// Issue 32: a tensor named twice in a header was read as its last entry, silently; a shape whose
// size overflows 64 bits was undefined arithmetic; a header nested thousands deep is refused before
// it is walked.
TEST(Safetensors, DuplicateNamesOverflowingShapesAndDeepHeadersAreRefused) {
  const fs::path d = fresh_dir("hostile");
  write_raw(d / "dup.safetensors",
            R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            std::string(8, '\0'));
  std::string e = error_of([&] { SafetensorsReader r((d / "dup.safetensors").string()); });
  EXPECT_NE(e.find("has the key 'w' twice"), std::string::npos) << e;
  write_raw(d / "huge.safetensors",
            R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776,16],"data_offsets":[0,0]}})", "");
  e = error_of([&] { SafetensorsReader r((d / "huge.safetensors").string()); });
  EXPECT_NE(e.find("does not fit the file"), std::string::npos) << e;
  // Found by fuzz_safetensors_header: a size too large for an integer is a float to JSON, and its
  // conversion was undefined behaviour.
  write_raw(d / "float.safetensors", R"({"w":{"dtype":"F32","shape":[1099511627099511109951162709951196],"data_offsets":[0,4]}})",
            std::string(4, '\0'));
  e = error_of([&] { SafetensorsReader r((d / "float.safetensors").string()); });
  EXPECT_NE(e.find("has shape holding 1.099511627099511e+33, not a size"), std::string::npos) << e;
  write_raw(d / "deep.safetensors", R"({"__metadata__":)" + std::string(30000, '[') + std::string(30000, ']') + "}", "");
  e = error_of([&] { SafetensorsReader r((d / "deep.safetensors").string()); });
  EXPECT_NE(e.find("more than 64 levels deep"), std::string::npos) << e;
}

// Issue 32: an export over an older sharded one left its index beside the new model.safetensors,
// and the reader preferred the stale index: the old weights came back. Both in one folder, the
// index not naming model.safetensors, is refused; an index that names it is read as before.
TEST(Safetensors, AnIndexThatDisagreesWithASingleFileIsRefused) {
  const fs::path d = fresh_dir("mixed");
  std::vector<TensorOut> old_ts, new_ts;
  for (int i = 0; i < 3; ++i) {
    old_ts.push_back({fmt::format("t{}", i), "F32", {4}, f32_to_bytes(std::vector<float>(4, 1.0f), "F32")});
    new_ts.push_back({fmt::format("t{}", i), "F32", {4}, f32_to_bytes(std::vector<float>(4, 2.0f), "F32")});
  }
  write_safetensors(d.string(), old_ts, 20);  // shards and an index
  write_safetensors(d.string(), new_ts, uint64_t(1) << 30);  // model.safetensors beside them
  const std::string e = error_of([&] { SafetensorsReader r(d.string()); });
  EXPECT_NE(e.find("holds model.safetensors and model.safetensors.index.json"), std::string::npos) << e;
  EXPECT_NE(e.find("model-00001-of-00003.safetensors"), std::string::npos) << e;
  // An index whose every tensor is in model.safetensors agrees with it.
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"weight_map": {"t0": "model.safetensors", "t1": "model.safetensors", "t2": "model.safetensors"}})";
  SafetensorsReader r(d.string());
  EXPECT_EQ(r.as_f32("t1"), std::vector<float>(4, 2.0f));
  // A tensor named twice in the index is refused.
  std::ofstream(d / "model.safetensors.index.json")
      << R"({"weight_map": {"t0": "model.safetensors", "t0": "model-00001-of-00003.safetensors"}})";
  EXPECT_NE(error_of([&] { SafetensorsReader r2(d.string()); }).find("has the key 't0' twice"), std::string::npos);
  fs::remove_all(d);
}
