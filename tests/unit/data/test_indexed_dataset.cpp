#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "data/indexed_dataset.h"
#include "test_util.h"

namespace primus::data {
namespace {

using testing::slurp;
using testing::spit;
using testing::temp_dir;

template <typename T>
T read_at(const std::string& s, size_t off) {
  T v;
  std::memcpy(&v, s.data() + off, sizeof(T));
  return v;
}

std::string expect_error(const std::string& prefix) {
  try {
    IndexedDataset ds(prefix);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "opening " << prefix << " should fail";
  return "";
}

// Two documents: the first of two sequences (sentences), the second of one.
std::string write_sample(const std::filesystem::path& dir, TokenDType dtype = TokenDType::u16) {
  std::string prefix = (dir / "ds").string();
  IndexedDatasetBuilder b(prefix, dtype);
  b.add_item(std::vector<int32_t>{1, 2, 3});
  b.add_item(std::vector<int32_t>{4, 5});
  b.end_document();
  b.add_item(std::vector<int32_t>{60000, 7, 8, 9});
  b.end_document();
  b.finalize();
  return prefix;
}

TEST(IndexedDataset, IdxLayoutFieldByField) {
  auto dir = temp_dir();
  std::string prefix = write_sample(dir);
  std::string idx = slurp(prefix + ".idx");
  // Megatron's MMIDIDX: magic, u64 version, u8 dtype code, u64 sequences, u64 document entries,
  // int32 lengths, int64 byte pointers, int64 document indices.
  ASSERT_EQ(idx.size(), 9u + 8 + 1 + 8 + 8 + 3 * 4 + 3 * 8 + 3 * 8);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(read_at<uint64_t>(idx, 9), 1u);
  EXPECT_EQ(read_at<uint8_t>(idx, 17), 8u);  // uint16
  EXPECT_EQ(read_at<uint64_t>(idx, 18), 3u);
  EXPECT_EQ(read_at<uint64_t>(idx, 26), 3u);
  size_t o = 34;
  EXPECT_EQ(read_at<int32_t>(idx, o), 3);
  EXPECT_EQ(read_at<int32_t>(idx, o + 4), 2);
  EXPECT_EQ(read_at<int32_t>(idx, o + 8), 4);
  o += 12;
  EXPECT_EQ(read_at<int64_t>(idx, o), 0);
  EXPECT_EQ(read_at<int64_t>(idx, o + 8), 6);   // 3 tokens * 2 bytes
  EXPECT_EQ(read_at<int64_t>(idx, o + 16), 10);
  o += 24;
  EXPECT_EQ(read_at<int64_t>(idx, o), 0);
  EXPECT_EQ(read_at<int64_t>(idx, o + 8), 2);
  EXPECT_EQ(read_at<int64_t>(idx, o + 16), 3);
  std::string bin = slurp(prefix + ".bin");
  ASSERT_EQ(bin.size(), 18u);
  EXPECT_EQ(read_at<uint16_t>(bin, 0), 1);
  EXPECT_EQ(read_at<uint16_t>(bin, 10), 60000);
  EXPECT_EQ(read_at<uint16_t>(bin, 16), 9);
}

TEST(IndexedDataset, ReadsBackWhatWasWritten) {
  auto dir = temp_dir();
  for (TokenDType t : {TokenDType::u16, TokenDType::i32, TokenDType::i64}) {
    std::string prefix = write_sample(dir, t);
    IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), t);
    EXPECT_EQ(ds.num_sequences(), 3u);
    EXPECT_EQ(ds.num_documents(), 2u);
    EXPECT_EQ(ds.num_tokens(), 9);
    EXPECT_EQ(ds.get(0), (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(ds.get(2), (std::vector<int32_t>{60000, 7, 8, 9}));
    EXPECT_EQ(ds.get(2, 1, 2), (std::vector<int32_t>{7, 8}));
    EXPECT_THROW(ds.get(3), Error);
    EXPECT_THROW(ds.get(1, 1, 5), Error);
  }
}

TEST(IndexedDataset, DtypeChoiceFollowsMegatron) {
  EXPECT_EQ(optimal_dtype(32000), TokenDType::u16);
  EXPECT_EQ(optimal_dtype(65499), TokenDType::u16);
  EXPECT_EQ(optimal_dtype(65500), TokenDType::i32);
  EXPECT_EQ(optimal_dtype(128256), TokenDType::i32);
  auto dir = temp_dir();
  IndexedDatasetBuilder b((dir / "x").string(), TokenDType::u16);
  EXPECT_THROW(b.add_item(std::vector<int32_t>{70000}), Error);
}

TEST(IndexedDataset, CorruptFilesAreClearErrors) {
  auto dir = temp_dir();
  std::string prefix = write_sample(dir);
  std::string idx = slurp(prefix + ".idx"), bin = slurp(prefix + ".bin");

  spit(prefix + ".bin", bin.substr(0, bin.size() - 2));
  EXPECT_NE(expect_error(prefix).find("do not match"), std::string::npos);
  spit(prefix + ".bin", bin);

  spit(prefix + ".idx", idx.substr(0, idx.size() - 8));
  EXPECT_NE(expect_error(prefix).find("truncated"), std::string::npos);
  spit(prefix + ".idx", idx.substr(0, 20));
  EXPECT_NE(expect_error(prefix).find("truncated"), std::string::npos);

  std::string bad = idx;
  bad[17] = 9;
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("unknown dtype code 9"), std::string::npos);

  bad = idx;
  bad[0] = 'X';
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("MMIDIDX"), std::string::npos);

  bad = idx;
  bad[9] = 2;
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("version 2"), std::string::npos);

  bad = idx;
  int64_t p = 4;  // second pointer no longer follows the first sequence
  std::memcpy(bad.data() + 34 + 12 + 8, &p, 8);
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("sequence 1"), std::string::npos);

  bad = idx;
  uint64_t huge = 1ull << 60;  // a count that would overflow a size computation
  std::memcpy(bad.data() + 18, &huge, 8);
  spit(prefix + ".idx", bad);
  EXPECT_NE(expect_error(prefix).find("truncated or corrupt"), std::string::npos);

  std::filesystem::remove(prefix + ".bin");
  spit(prefix + ".idx", idx);
  EXPECT_NE(expect_error(prefix).find("ds.bin"), std::string::npos);
}

}  // namespace
}  // namespace primus::data
