#include "pipeline/partition.h"

#include <regex>
#include <string>

#include <fmt/format.h>

#include "core/error.h"

namespace primus::pipeline {

namespace {

// "pipeline_model_parallel_size 4" or "pipeline_model_parallel_size x
// virtual_pipeline_model_parallel_size = 4 x 2 = 8".
std::string stages_text(int pp, int vpp) {
  if (vpp == 1) return fmt::format("pipeline_model_parallel_size {}", pp);
  return fmt::format(
      "pipeline_model_parallel_size x virtual_pipeline_model_parallel_size = {} x {} = {}", pp,
      vpp, int64_t{pp} * vpp);
}

// Layers held by each pipeline rank (all its chunks together), Megatron's rules.
std::vector<int64_t> layers_per_rank(int64_t L, int pp, int vpp, int64_t first, int64_t last) {
  if (first == 0 && last == 0) {
    if (L % (int64_t{pp} * vpp) != 0)
      fail("num_layers {} is not divisible by {}: an even pipeline split gives every stage the "
           "same number of layers; set decoder_first_pipeline_num_layers and/or "
           "decoder_last_pipeline_num_layers to split unevenly",
           L, stages_text(pp, vpp));
    return std::vector<int64_t>(pp, L / pp);
  }
  if (pp < 2)
    fail("decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers need "
         "pipeline_model_parallel_size >= 2 (got {}): with one pipeline rank all {} layers are on "
         "it",
         pp, L);
  for (auto [name, v] : {std::pair{"decoder_first_pipeline_num_layers", first},
                         std::pair{"decoder_last_pipeline_num_layers", last}}) {
    if (v < 0) fail("{} must be positive (got {}; 0 or unset means an even split)", name, v);
    if (v > 0 && v % vpp != 0)
      fail("{} = {} must be divisible by virtual_pipeline_model_parallel_size {} (each of the "
           "rank's {} chunks holds the same number of layers)",
           name, v, vpp, vpp);
  }
  const int64_t middle_layers = L - first - last;
  const int middle_ranks = pp - (first > 0) - (last > 0);
  if (middle_layers < 0)
    fail("decoder_first_pipeline_num_layers {} + decoder_last_pipeline_num_layers {} exceed "
         "num_layers {}",
         first, last, L);
  if (middle_ranks == 0) {
    if (middle_layers != 0)
      fail("with pipeline_model_parallel_size 2, decoder_first_pipeline_num_layers {} + "
           "decoder_last_pipeline_num_layers {} must equal num_layers {} (there are no middle "
           "ranks for the other {})",
           first, last, L, middle_layers);
  } else {
    if (middle_layers == 0)
      fail("decoder_first/last_pipeline_num_layers ({} + {}) take all {} layers, leaving none for "
           "the other {} pipeline rank(s)",
           first, last, L, middle_ranks);
    if (middle_layers % middle_ranks != 0)
      fail("the {} layers left after decoder_first/last_pipeline_num_layers ({} + {} of {}) are "
           "not divisible by the {} middle pipeline rank(s)",
           middle_layers, first, last, L, middle_ranks);
    const int64_t per_rank = middle_layers / middle_ranks;
    if (per_rank % vpp != 0)
      fail("each middle pipeline rank would hold {} layers ({} left after decoder_first/last_"
           "pipeline_num_layers, over {} ranks), which is not divisible by "
           "virtual_pipeline_model_parallel_size {}",
           per_rank, middle_layers, middle_ranks, vpp);
  }
  std::vector<int64_t> per(pp, middle_ranks ? middle_layers / middle_ranks : 0);
  if (first > 0) per.front() = first;
  if (last > 0) per.back() = last;
  return per;
}

constexpr size_t kMaxLayoutLetters = 1 << 20;

// Replaces each match of `pattern` (group 1 a text, group 2 a count) by the text repeated, as
// Megatron's parse_str_to_list does with re.sub, refusing an expansion past kMaxLayoutLetters.
std::string unroll(const std::string& text, const std::regex& pattern, const std::string& layout) {
  std::string out;
  size_t last = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    out.append(text, last, size_t(m.position(0)) - last);
    const std::string count = m[2].str();
    const std::string piece = m[1].str();
    if (count.size() > 7 || (out.size() + piece.size() * std::stoull(count)) > kMaxLayoutLetters)
      fail("pipeline_model_parallel_layout '{}' unrolls to more than {} letters", layout, kMaxLayoutLetters);
    for (unsigned long long i = 0, n = std::stoull(count); i < n; ++i) out += piece;
    last = size_t(m.position(0) + m.length(0));
  }
  out.append(text, last, std::string::npos);
  if (out.size() > kMaxLayoutLetters)
    fail("pipeline_model_parallel_layout '{}' unrolls to more than {} letters", layout, kMaxLayoutLetters);
  return out;
}

}  // namespace

std::vector<int64_t> parse_pipeline_layout(const std::string& layout) {
  int64_t mtp = 0;
  return parse_pipeline_layout(layout, mtp);
}

int64_t pipeline_layout_mtp_layers(const std::string& layout) {
  int64_t mtp = 0;
  parse_pipeline_layout(layout, mtp);
  return mtp;
}

std::vector<int64_t> parse_pipeline_layout(const std::string& layout, int64_t& mtp_layers) {
  mtp_layers = 0;
  std::string text;
  for (char c : layout)
    if (c != ',') text += c;
  static const std::regex group(R"(\(([^)]+)\)\*(\d+))"), letter(R"((.)\*(\d+))");
  text = unroll(unroll(text, group, layout), letter, layout);
  if (text.empty() || text.front() != 'E' || text.back() != 'L')
    fail("pipeline_model_parallel_layout '{}' must start with the embedding (E) and end with the loss (L)", layout);
  std::vector<int64_t> layers(1, 0);
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '|') {
      layers.push_back(0);
    } else if (c == 't') {
      ++layers.back();
    } else if (c == 'm') {  // beside the loss: the MTP depths run on the stage with the head
      if (text.find('|', i) != std::string::npos)
        fail("pipeline_model_parallel_layout '{}' places a multi-token prediction layer (m) before the last stage; "
             "this engine runs the MTP depths on the stage with the loss (L)",
             layout);
      ++mtp_layers;
    } else if ((c == 'E' && i != 0) || (c == 'L' && i + 1 != text.size())) {
      fail("pipeline_model_parallel_layout '{}' names the {} more than once (E and L stand once each, first and last)",
           layout, c == 'E' ? "embedding (E)" : "loss (L)");
    } else if (c != 'E' && c != 'L') {
      fail("pipeline_model_parallel_layout '{}' has the letter '{}'; the letters are E (embedding), t (transformer "
           "layer), m (multi-token prediction), L (loss), with | between stages, x*n and (...)*n for repeats",
           layout, c);
    }
  }
  for (size_t s = 0; s < layers.size(); ++s)
    if (layers[s] == 0)
      fail("pipeline_model_parallel_layout '{}': stage {} holds no transformer layer; a stage of the embedding or the "
           "loss alone is not built on this engine (give every stage at least one t)",
           layout, s);
  return layers;
}

std::vector<LayerRange> split_layers(const std::vector<int64_t>& layers_per_stage, int64_t num_layers) {
  std::vector<LayerRange> split;
  int64_t next = 0;
  for (int64_t n : layers_per_stage) {
    split.push_back({next, n});
    next += n;
  }
  if (next != num_layers)
    fail("pipeline_model_parallel_layout places {} transformer layers, the model has num_layers {}", next,
         num_layers);
  return split;
}

std::vector<LayerRange> split_layers(int64_t num_layers, int pp, int vpp,
                                     int64_t first_stage_layers, int64_t last_stage_layers,
                                     Placement placement) {
  if (num_layers < 1) fail("num_layers must be at least 1 (got {})", num_layers);
  if (pp < 1) fail("pipeline_model_parallel_size must be at least 1 (got {})", pp);
  if (vpp < 1) fail("virtual_pipeline_model_parallel_size must be at least 1 (got {})", vpp);
  if (placement == Placement::VShape && vpp != 2)
    fail("a V-shape pipeline schedule places exactly 2 chunks per rank "
         "(virtual_pipeline_model_parallel_size 2, got {})",
         vpp);
  const auto per_rank = layers_per_rank(num_layers, pp, vpp, first_stage_layers, last_stage_layers);

  Schedule shape;  // only for the placement's stage map
  shape.pp = pp;
  shape.vpp = vpp;
  shape.placement = placement;
  std::vector<LayerRange> split(static_cast<size_t>(pp) * vpp);
  int64_t next = 0;
  for (int s = 0; s < pp * vpp; ++s) {
    split[s] = {next, per_rank[shape.rank_of_stage(s)] / vpp};
    next += split[s].num_layers;
  }
  PRIMUS_CHECK(next == num_layers, "split covers {} of {} layers", next, num_layers);
  return split;
}

std::vector<LayerRange> split_layers(const Schedule& schedule, int64_t num_layers,
                                     int64_t first_stage_layers, int64_t last_stage_layers) {
  return split_layers(num_layers, schedule.pp, schedule.vpp, first_stage_layers,
                      last_stage_layers, schedule.placement);
}

LayerRange layers_of(const Schedule& schedule, const std::vector<LayerRange>& split, int rank,
                     int chunk) {
  if (static_cast<int>(split.size()) != schedule.num_stages())
    fail("layer split has {} stages but schedule '{}' has {} (pp {} x vpp {})", split.size(),
         schedule.algorithm, schedule.num_stages(), schedule.pp, schedule.vpp);
  if (rank < 0 || rank >= schedule.pp)
    fail("pipeline rank {} is out of range for pp {}", rank, schedule.pp);
  if (chunk < 0 || chunk >= schedule.vpp)
    fail("chunk {} is out of range for vpp {}", chunk, schedule.vpp);
  return split[schedule.stage_of(rank, chunk)];
}

std::vector<LayerRange> rank_layers(const Schedule& schedule, const std::vector<LayerRange>& split,
                                    int rank) {
  std::vector<LayerRange> out;
  for (int c = 0; c < schedule.vpp; ++c) out.push_back(layers_of(schedule, split, rank, c));
  return out;
}

}  // namespace primus::pipeline
