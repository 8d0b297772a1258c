// RankMesh: coordinates and group membership in Megatron's order (tp fastest, cp, dp, pp), and
// the layout rules with their messages.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "parallel/mesh.h"

using namespace primus;
using namespace primus::parallel;
using Groups = std::vector<std::vector<int>>;

namespace {
ParallelSizes sizes(int tp, int cp, int pp, int ep = 1) {
  ParallelSizes s;
  s.tensor_model_parallel_size = tp;
  s.context_parallel_size = cp;
  s.pipeline_model_parallel_size = pp;
  s.expert_model_parallel_size = ep;
  return s;
}

std::string error_of(int world, const ParallelSizes& s) {
  try {
    RankMesh m(world, s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every kind of group partitions the world, has the advertised size, and agrees with
// group_ranks/group_index.
void check_partition(const RankMesh& m) {
  for (MeshDim d : kAllMeshDims) {
    auto gs = m.groups(d);
    std::set<int> seen;
    for (size_t i = 0; i < gs.size(); ++i) {
      EXPECT_EQ(static_cast<int>(gs[i].size()), m.size(d)) << mesh_dim_name(d);
      for (int r : gs[i]) {
        EXPECT_TRUE(seen.insert(r).second) << mesh_dim_name(d) << " rank " << r;
        EXPECT_EQ(m.group_ranks(d, r), gs[i]) << mesh_dim_name(d);
        EXPECT_EQ(m.group_index(d, r), static_cast<int>(i)) << mesh_dim_name(d);
      }
    }
    EXPECT_EQ(static_cast<int>(seen.size()), m.world_size()) << mesh_dim_name(d);
  }
}
}  // namespace

TEST(RankMesh, World8Tp2Pp2GivesDp2) {
  RankMesh m(8, sizes(2, 1, 2));
  EXPECT_EQ(m.dp_size(), 2);
  EXPECT_EQ(m.describe(), "world 8 = tp 2 x cp 1 x dp 2 x pp 2 (ep 1)");
  // rank = tp + 2 * (dp + 2 * pp)
  for (int r = 0; r < 8; ++r) {
    auto c = m.coord(r);
    EXPECT_EQ(c.tp, r % 2);
    EXPECT_EQ(c.cp, 0);
    EXPECT_EQ(c.dp, (r / 2) % 2);
    EXPECT_EQ(c.pp, r / 4);
    EXPECT_EQ(m.rank_of(c.tp, c.cp, c.dp, c.pp), r);
  }
  EXPECT_EQ(m.groups(MeshDim::TP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.groups(MeshDim::DP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.groups(MeshDim::PP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.groups(MeshDim::CP), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(m.groups(MeshDim::MP), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(m.groups(MeshDim::DP_CP), m.groups(MeshDim::DP));
  EXPECT_EQ(m.group_ranks(MeshDim::PP, 6), (std::vector<int>{2, 6}));
  check_partition(m);
}

TEST(RankMesh, World16Tp2Cp2Pp2) {
  RankMesh m(16, sizes(2, 2, 2));
  EXPECT_EQ(m.dp_size(), 2);
  for (int r = 0; r < 16; ++r) {
    auto c = m.coord(r);
    EXPECT_EQ(c.tp, r % 2);
    EXPECT_EQ(c.cp, (r / 2) % 2);
    EXPECT_EQ(c.dp, (r / 4) % 2);
    EXPECT_EQ(c.pp, r / 8);
  }
  EXPECT_EQ(m.coord(13).tp, 1);
  EXPECT_EQ(m.coord(13).cp, 0);
  EXPECT_EQ(m.coord(13).dp, 1);
  EXPECT_EQ(m.coord(13).pp, 1);
  EXPECT_EQ(m.groups(MeshDim::TP)[5], (std::vector<int>{10, 11}));
  EXPECT_EQ(m.groups(MeshDim::CP),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(m.groups(MeshDim::DP),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(m.groups(MeshDim::PP).size(), 8u);
  EXPECT_EQ(m.groups(MeshDim::PP)[3], (std::vector<int>{3, 11}));
  EXPECT_EQ(m.groups(MeshDim::DP_CP),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(m.size(MeshDim::MP), 4);
  EXPECT_EQ(m.group_ranks(MeshDim::MP, 5), (std::vector<int>{4, 5, 12, 13}));
  check_partition(m);
}

TEST(RankMesh, ExpertParallelFoldsIntoDp) {
  // world 8, tp 1: dp 8 split as dp = edp * 4 + ep.
  RankMesh m(8, sizes(1, 1, 1, 4));
  EXPECT_EQ(m.dp_size(), 8);
  EXPECT_EQ(m.size(MeshDim::EDP), 2);
  EXPECT_EQ(m.groups(MeshDim::EP), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.groups(MeshDim::EDP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.coord(6).ep, 2);
  EXPECT_EQ(m.coord(6).edp, 1);
  check_partition(m);

  // With tp 2 the ep group strides over tp: ranks holding the same tp slice.
  RankMesh m2(8, sizes(2, 1, 1, 2));
  EXPECT_EQ(m2.groups(MeshDim::EP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m2.groups(MeshDim::EDP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m2.groups(MeshDim::EDP_CP), m2.groups(MeshDim::EDP));  // cp 1
  check_partition(m2);

  // With cp 2 (world 8 = cp 2 x dp 4, dp = edp 2 x ep 2): the ep peers share a cp index, and the
  // ranks holding the same experts span edp and cp.
  RankMesh m3(8, sizes(1, 2, 1, 2));
  EXPECT_EQ(m3.groups(MeshDim::EP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m3.groups(MeshDim::EDP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m3.size(MeshDim::EDP_CP), 4);
  EXPECT_EQ(m3.groups(MeshDim::EDP_CP), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  check_partition(m3);
}

TEST(RankMesh, SingleProcess) {
  RankMesh m(1, sizes(1, 1, 1));
  EXPECT_EQ(m.dp_size(), 1);
  for (MeshDim d : kAllMeshDims) EXPECT_EQ(m.groups(d), (Groups{{0}}));
}

TEST(RankMesh, RejectsBadLayoutsNamingTheRule) {
  EXPECT_NE(error_of(8, sizes(0, 1, 1)).find("tensor_model_parallel_size must be a positive"),
            std::string::npos);
  EXPECT_NE(error_of(8, sizes(1, -1, 1)).find("context_parallel_size must be a positive"),
            std::string::npos);
  EXPECT_NE(error_of(8, sizes(1, 1, 0)).find("pipeline_model_parallel_size must be a positive"),
            std::string::npos);
  EXPECT_NE(error_of(8, sizes(1, 1, 1, 0)).find("expert_model_parallel_size must be a positive"),
            std::string::npos);
  EXPECT_NE(error_of(0, sizes(1, 1, 1)).find("world size must be a positive"), std::string::npos);

  std::string e = error_of(8, sizes(3, 1, 1));
  EXPECT_NE(e.find("tensor_model_parallel_size (3) x context_parallel_size (1) x "
                   "pipeline_model_parallel_size (1) = 3 must divide the world size (8)"),
            std::string::npos)
      << e;
  e = error_of(8, sizes(2, 2, 4));  // product 16 > 8
  EXPECT_NE(e.find("= 16 must divide the world size (8)"), std::string::npos) << e;

  e = error_of(8, sizes(2, 1, 2, 4));  // dp = 2
  EXPECT_NE(e.find("expert_model_parallel_size (4) must divide the data-parallel size (2"),
            std::string::npos)
      << e;
  e = error_of(12, sizes(1, 1, 1, 8));
  EXPECT_NE(e.find("expert_model_parallel_size (8) must divide the data-parallel size (12"),
            std::string::npos)
      << e;
}

TEST(RankMesh, RejectsOutOfRangeQueries) {
  RankMesh m(4, sizes(2, 1, 1));
  EXPECT_THROW(m.coord(4), Error);
  EXPECT_THROW(m.coord(-1), Error);
  EXPECT_THROW(m.rank_of(2, 0, 0, 0), Error);
  EXPECT_THROW(m.group_ranks(MeshDim::TP, 7), Error);
}
