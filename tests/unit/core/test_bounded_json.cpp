// JSON from untrusted files (core/bounded_json.h): nesting past the limit, a duplicate key and a
// file past its size are errors naming the file, before anything deep is built.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/bounded_json.h"
#include "core/error.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

namespace primus {
namespace {

using test::error_of;

std::string arrays(int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); }

TEST(BoundedJson, NestingPastTheLimitIsRefusedByName) {
  EXPECT_EQ(parse_json(arrays(64), "x").size(), 1u);  // 64 levels: the limit itself
  const std::string e = error_of([] { parse_json(arrays(65), "tokenizer file 't.json'"); });
  EXPECT_NE(e.find("tokenizer file 't.json' nests objects and arrays more than 64 levels deep"), std::string::npos) << e;
  // 50,000 levels (100 kB): what killed the readers by stack overflow, refused while parsing.
  EXPECT_NE(error_of([] { parse_json(arrays(50'000), "f"); }).find("more than 64 levels"), std::string::npos);
  std::string objects;
  for (int i = 0; i < 50'000; ++i) objects += "{\"a\":";
  objects += "1" + std::string(50'000, '}');
  EXPECT_NE(error_of([&] { parse_json(objects, "f"); }).find("more than 64 levels"), std::string::npos);
  JsonLimits shallow;
  shallow.max_depth = 2;
  EXPECT_NO_THROW(parse_json(R"({"a": [1, 2]})", "f", shallow));
  EXPECT_NE(error_of([&] { parse_json(R"({"a": [[1]]})", "f", shallow); }).find("more than 2 levels"),
            std::string::npos);
}

TEST(BoundedJson, DuplicateKeysAreRefusedWhenAsked) {
  const std::string text = R"({"w": {"a": 1}, "v": {"a": 2, "b": 3}, "w": {"a": 4}})";
  EXPECT_EQ(parse_json(text, "f")["w"]["a"], 4);  // nlohmann's rule: the last one wins
  JsonLimits unique;
  unique.unique_keys = true;
  const std::string e = error_of([&] { parse_json(text, "the header of 'm.safetensors'", unique); });
  EXPECT_NE(e.find("the header of 'm.safetensors' has the key 'w' twice in one object"), std::string::npos) << e;
  // The same key in two different objects is fine.
  EXPECT_NO_THROW(parse_json(R"({"x": {"a": 1}, "y": {"a": 2}, "z": [{"a": 1}, {"a": 2}]})", "f", unique));
}

TEST(BoundedJson, FilesAreReadWithinTheirSize) {
  test::TempDir d("primus_json_");
  const std::string f = d.write("c.json", R"({"hidden_size": 64})");
  EXPECT_EQ(read_json_file(f, "config 'c.json'")["hidden_size"], 64);
  JsonLimits tiny;
  tiny.max_bytes = 8;
  std::string e = error_of([&] { read_json_file(f, "config 'c.json'", tiny); });
  EXPECT_NE(e.find("config 'c.json' is 19 B, more than the 8 B a file of this kind may have"), std::string::npos) << e;
  e = error_of([&] { read_json_file(d.path / "none.json", "config 'none.json'"); });
  EXPECT_NE(e.find("config 'none.json' does not exist"), std::string::npos) << e;
  e = error_of([&] { parse_json("{\"a\": ", "config 'c.json'"); });
  EXPECT_NE(e.find("config 'c.json' is not valid JSON"), std::string::npos) << e;
}

}  // namespace
}  // namespace primus
