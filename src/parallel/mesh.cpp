#include "parallel/mesh.h"

#include <map>

#include <fmt/format.h>

#include "core/error.h"

namespace primus::parallel {

const char* mesh_dim_name(MeshDim d) {
  switch (d) {
    case MeshDim::TP: return "tp";
    case MeshDim::CP: return "cp";
    case MeshDim::DP: return "dp";
    case MeshDim::PP: return "pp";
    case MeshDim::EP: return "ep";
    case MeshDim::EDP: return "edp";
    case MeshDim::DP_CP: return "dp_cp";
    case MeshDim::EDP_CP: return "edp_cp";
    case MeshDim::MP: return "mp";
  }
  return "?";
}

RankMesh::RankMesh(int world_size, const ParallelSizes& s)
    : world_(world_size),
      tp_(s.tensor_model_parallel_size),
      cp_(s.context_parallel_size),
      dp_(0),
      pp_(s.pipeline_model_parallel_size),
      ep_(s.expert_model_parallel_size) {
  auto positive = [](const char* name, int v) {
    if (v < 1) fail("{} must be a positive integer (got {})", name, v);
  };
  positive("world size", world_);
  positive("tensor_model_parallel_size", tp_);
  positive("context_parallel_size", cp_);
  positive("pipeline_model_parallel_size", pp_);
  positive("expert_model_parallel_size", ep_);
  // In 64 bits: three large sizes must not overflow into a product that happens to divide.
  int64_t model = int64_t{tp_} * cp_ * pp_;
  if (world_ % model != 0)
    fail("tensor_model_parallel_size ({}) x context_parallel_size ({}) x "
         "pipeline_model_parallel_size ({}) = {} must divide the world size ({}); the rest is "
         "the data-parallel size",
         tp_, cp_, pp_, model, world_);
  dp_ = static_cast<int>(world_ / model);
  if (dp_ % ep_ != 0)
    fail("expert_model_parallel_size ({}) must divide the data-parallel size ({} = world {} / "
         "(tp {} x cp {} x pp {})): expert parallelism is folded into data parallelism",
         ep_, dp_, world_, tp_, cp_, pp_);
}

int RankMesh::size(MeshDim d) const {
  switch (d) {
    case MeshDim::TP: return tp_;
    case MeshDim::CP: return cp_;
    case MeshDim::DP: return dp_;
    case MeshDim::PP: return pp_;
    case MeshDim::EP: return ep_;
    case MeshDim::EDP: return dp_ / ep_;
    case MeshDim::DP_CP: return dp_ * cp_;
    case MeshDim::EDP_CP: return dp_ / ep_ * cp_;
    case MeshDim::MP: return tp_ * pp_;
  }
  return 0;
}

MeshCoord RankMesh::coord(int rank) const {
  if (rank < 0 || rank >= world_)
    fail("rank {} is outside the world of {} ranks", rank, world_);
  MeshCoord c;
  c.tp = rank % tp_;
  c.cp = (rank / tp_) % cp_;
  c.dp = (rank / (tp_ * cp_)) % dp_;
  c.pp = rank / (tp_ * cp_ * dp_);
  c.ep = c.dp % ep_;
  c.edp = c.dp / ep_;
  return c;
}

int RankMesh::rank_of(int tp, int cp, int dp, int pp) const {
  if (tp < 0 || tp >= tp_ || cp < 0 || cp >= cp_ || dp < 0 || dp >= dp_ || pp < 0 || pp >= pp_)
    fail("mesh coordinate (tp {}, cp {}, dp {}, pp {}) is outside {}", tp, cp, dp, pp,
         describe());
  return tp + tp_ * (cp + cp_ * (dp + dp_ * pp));
}

namespace {
// The coordinates that stay fixed inside a group of kind d: two ranks are in the same group
// exactly when these agree. dp is split into (edp, ep) so that EP/EDP fall out the same way.
std::array<int, 5> fixed_key(MeshDim d, const MeshCoord& c) {
  constexpr int kFree = -1;
  std::array<int, 5> k = {c.tp, c.cp, c.ep, c.edp, c.pp};
  switch (d) {
    case MeshDim::TP: k[0] = kFree; break;
    case MeshDim::CP: k[1] = kFree; break;
    case MeshDim::DP: k[2] = k[3] = kFree; break;
    case MeshDim::PP: k[4] = kFree; break;
    case MeshDim::EP: k[2] = kFree; break;
    case MeshDim::EDP: k[3] = kFree; break;
    case MeshDim::DP_CP: k[1] = k[2] = k[3] = kFree; break;
    case MeshDim::EDP_CP: k[1] = k[3] = kFree; break;
    case MeshDim::MP: k[0] = k[4] = kFree; break;
  }
  return k;
}
}  // namespace

std::vector<int> RankMesh::group_ranks(MeshDim d, int rank) const {
  auto key = fixed_key(d, coord(rank));
  std::vector<int> out;
  for (int r = 0; r < world_; ++r)
    if (fixed_key(d, coord(r)) == key) out.push_back(r);
  return out;
}

std::vector<std::vector<int>> RankMesh::groups(MeshDim d) const {
  std::vector<std::vector<int>> out;
  std::map<std::array<int, 5>, size_t> index;
  for (int r = 0; r < world_; ++r) {
    auto key = fixed_key(d, coord(r));
    auto [it, fresh] = index.emplace(key, out.size());
    if (fresh) out.emplace_back();
    out[it->second].push_back(r);
  }
  return out;
}

int RankMesh::group_index(MeshDim d, int rank) const {
  int first = group_ranks(d, rank).front();
  auto all = groups(d);
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].front() == first) return static_cast<int>(i);
  PRIMUS_CHECK(false, "rank {} found in no {} group", rank, mesh_dim_name(d));
}

std::string RankMesh::describe() const {
  return fmt::format("world {} = tp {} x cp {} x dp {} x pp {} (ep {})", world_, tp_, cp_, dp_,
                     pp_, ep_);
}

ProcessGroup& MeshGroups::get(MeshDim d) const {
  const std::unique_ptr<ProcessGroup>* p = nullptr;
  switch (d) {
    case MeshDim::TP: p = &tp; break;
    case MeshDim::CP: p = &cp; break;
    case MeshDim::DP: p = &dp; break;
    case MeshDim::PP: p = &pp; break;
    case MeshDim::EP: p = &ep; break;
    case MeshDim::EDP: p = &edp; break;
    case MeshDim::DP_CP: p = &dp_cp; break;
    case MeshDim::EDP_CP: p = &edp_cp; break;
    case MeshDim::MP: p = &mp; break;
  }
  if (!p || !*p) fail("the {} group was not built", mesh_dim_name(d));
  return **p;
}

MeshGroups build_groups(const RankMesh& mesh, ProcessGroup& world) {
  if (world.size() != mesh.world_size())
    fail("the layout {} needs {} ranks but {} has {}", mesh.describe(), mesh.world_size(),
         world.describe(), world.size());
  // Mesh ranks are world-group ranks. One split per kind: every rank names its group (color)
  // and its place in it (key = position in the ordered member list).
  int me = world.rank();
  MeshGroups g;
  for (MeshDim d : kAllMeshDims) {
    auto members = mesh.group_ranks(d, me);
    int key = 0;
    while (members[static_cast<size_t>(key)] != me) ++key;
    auto sub = world.split(mesh.group_index(d, me), key, mesh_dim_name(d));
    PRIMUS_CHECK(sub && sub->size() == static_cast<int>(members.size()),
                 "the {} group has the wrong size", mesh_dim_name(d));
    switch (d) {
      case MeshDim::TP: g.tp = std::move(sub); break;
      case MeshDim::CP: g.cp = std::move(sub); break;
      case MeshDim::DP: g.dp = std::move(sub); break;
      case MeshDim::PP: g.pp = std::move(sub); break;
      case MeshDim::EP: g.ep = std::move(sub); break;
      case MeshDim::EDP: g.edp = std::move(sub); break;
      case MeshDim::DP_CP: g.dp_cp = std::move(sub); break;
      case MeshDim::EDP_CP: g.edp_cp = std::move(sub); break;
      case MeshDim::MP: g.mp = std::move(sub); break;
    }
  }
  return g;
}

}  // namespace primus::parallel
