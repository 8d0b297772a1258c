// RankMesh: where each rank sits in the parallel layout. Ranks are laid out as in Megatron-LM,
// tp fastest, then cp, dp, pp slowest:
//   rank = tp + tp_size * (cp + cp_size * (dp + dp_size * pp))
// so the ranks of a tensor-parallel group are neighbours (same node, fastest links) and a
// pipeline stage is a contiguous block. dp = world / (tp * cp * pp). Expert parallelism is folded
// into dp: the dp index splits as dp = edp * ep_size + ep, so an expert-parallel group is ep_size
// consecutive dp ranks and the expert-data-parallel group links the ranks that hold the same
// experts.
//
// The mesh is pure arithmetic (no MPI) so that a layout can be validated, printed and tested
// before any process starts work; build_groups() turns it into ProcessGroups.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "parallel/process_group.h"

namespace primus::parallel {

// The groups a rank belongs to. dp_cp is Megatron's data-parallel group "with context
// parallel" (where gradients are reduced when cp > 1), edp_cp its expert counterpart (the ranks
// holding the same experts, over which their gradients are reduced); mp is the model-parallel
// group (tp x pp: every rank that holds a different piece of one model replica).
enum class MeshDim { TP, CP, DP, PP, EP, EDP, DP_CP, EDP_CP, MP };
inline constexpr std::array<MeshDim, 9> kAllMeshDims = {
    MeshDim::TP, MeshDim::CP,  MeshDim::DP,    MeshDim::PP,    MeshDim::EP,
    MeshDim::EDP, MeshDim::DP_CP, MeshDim::EDP_CP, MeshDim::MP};
const char* mesh_dim_name(MeshDim d);  // "tp", "cp", "dp", "pp", "ep", "edp", "dp_cp", "edp_cp", "mp"

struct ParallelSizes {
  int tensor_model_parallel_size = 1;
  int context_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  int expert_model_parallel_size = 1;
};

struct MeshCoord {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  int ep = 0;   // dp % ep_size: position inside the expert-parallel group
  int edp = 0;  // dp / ep_size: position inside the expert-data-parallel group
};

class RankMesh {
 public:
  // Validates the layout; throws primus::Error naming the rule that fails:
  //   every size positive; tp * cp * pp divides world_size; ep divides dp.
  RankMesh(int world_size, const ParallelSizes& sizes);

  int world_size() const { return world_; }
  int tp_size() const { return tp_; }
  int cp_size() const { return cp_; }
  int dp_size() const { return dp_; }
  int pp_size() const { return pp_; }
  int ep_size() const { return ep_; }
  int size(MeshDim d) const;  // members of each group of that kind

  MeshCoord coord(int rank) const;
  int rank_of(int tp, int cp, int dp, int pp) const;

  // The members of the group of kind d that contains rank, ordered by global rank (which is
  // also their rank inside the group: e.g. the dp group's i-th member has dp index i).
  std::vector<int> group_ranks(MeshDim d, int rank) const;
  // Every group of kind d, ordered by their first member; each rank is in exactly one.
  std::vector<std::vector<int>> groups(MeshDim d) const;
  // Index of rank's group within groups(d).
  int group_index(MeshDim d, int rank) const;

  // "world 8 = tp 2 x cp 1 x dp 2 x pp 2 (ep 1)".
  std::string describe() const;

 private:
  int world_, tp_, cp_, dp_, pp_, ep_;
};

// One rank's sub-groups, built from the world group. Each is a real group even when its size
// is 1, so callers never special-case a missing dimension.
struct MeshGroups {
  std::unique_ptr<ProcessGroup> tp, cp, dp, pp, ep, edp, dp_cp, edp_cp, mp;
  ProcessGroup& get(MeshDim d) const;
};

// Collective over every rank of world: world.size() must equal mesh.world_size().
MeshGroups build_groups(const RankMesh& mesh, ProcessGroup& world);

}  // namespace primus::parallel
