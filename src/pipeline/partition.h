// How the decoder layers are split over pipeline stages, with Megatron-LM's rules.
//
// The model's num_layers consecutive layers are cut into S = pp * vpp stages (schedule.h); stage
// s holds layers [first_layer, first_layer + num_layers). Counts are decided per pipeline *rank*,
// as Megatron does (its "first/last pipeline stage" is the first/last pp rank, all of its
// virtual chunks together):
//   - even split (default): every rank holds num_layers / pp layers, every chunk
//     num_layers / (pp * vpp); num_layers must be divisible by pp * vpp.
//   - decoder_first_pipeline_num_layers (Megatron: num_layers_in_first_pipeline_stage) = F > 0:
//     rank 0 holds F layers, F / vpp per chunk (F divisible by vpp);
//     decoder_last_pipeline_num_layers = L > 0: rank pp-1 holds L layers, L / vpp per chunk;
//     the other layers are split evenly over the remaining ("middle") ranks, whose count must
//     divide them, with a multiple of vpp per rank and at least one layer per chunk.
// Which stage a (rank, chunk) holds is the schedule's placement: looped, stage = chunk * pp + rank
// (Megatron's virtual pipeline order); V-shape, stage(r, 0) = r and stage(r, 1) = 2pp-1-r, so
// rank 0 holds the first and the last stage (embedding and loss) and `first` sizes both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace primus::pipeline {

struct LayerRange {
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  bool operator==(const LayerRange&) const = default;
};

// For each of the pp * vpp stages, in stage (model) order, the layers it holds. first_stage_layers
// and last_stage_layers of 0 mean unset. Throws primus::Error naming the rule and the numbers
// when the layers cannot be split so.
std::vector<LayerRange> split_layers(int64_t num_layers, int pp, int vpp,
                                     int64_t first_stage_layers = 0, int64_t last_stage_layers = 0,
                                     Placement placement = Placement::Looped);

// The same split for a schedule's pp, vpp and placement.
std::vector<LayerRange> split_layers(const Schedule& schedule, int64_t num_layers,
                                     int64_t first_stage_layers = 0,
                                     int64_t last_stage_layers = 0);

// Megatron-LM's pipeline_model_parallel_layout: the stages in model order, separated by '|', each
// a run of layer letters: E the embedding, t a transformer (decoder) layer, m a multi-token
// prediction layer, L the loss; "x*n" repeats a letter and "(...)*n" a group, commas are only for
// the eye ("Et*3|(tt|)*2,L" is "Ettt|tt|tt|L"). Stage i of the string is the looped placement's
// stage i (pipeline rank i mod pp, chunk i / pp), so the count of stages over pp is the vpp.
// Returns the decoder layers of each stage. Throws primus::Error, naming the layout, when it is
// not one: another letter, the embedding not first or the loss not last or either not exactly
// once, an MTP layer outside the last stage (the MTP depths run beside the loss), a stage without
// decoder layers (not built here), or an expansion past a million letters.
std::vector<int64_t> parse_pipeline_layout(const std::string& layout);
// The same, with the count of MTP layers (m) it places in mtp_layers.
std::vector<int64_t> parse_pipeline_layout(const std::string& layout, int64_t& mtp_layers);
int64_t pipeline_layout_mtp_layers(const std::string& layout);

// The split a parsed layout gives: stage s holds layers_per_stage[s] consecutive layers. Throws
// when they do not add up to num_layers.
std::vector<LayerRange> split_layers(const std::vector<int64_t>& layers_per_stage, int64_t num_layers);

// The layers chunk `chunk` of pipeline rank `rank` holds under `schedule`'s placement, from a
// split made by split_layers for that schedule.
LayerRange layers_of(const Schedule& schedule, const std::vector<LayerRange>& split, int rank,
                     int chunk);

// All chunks of one rank, in chunk order (what the model side builds on that rank).
std::vector<LayerRange> rank_layers(const Schedule& schedule, const std::vector<LayerRange>& split,
                                    int rank);

}  // namespace primus::pipeline
