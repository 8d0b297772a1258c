// The components of a Hugging Face tokenizer.json (normalizer, pre_tokenizer, decoder,
// post_processor) are a step or a `Sequence` of them, and a Sequence may hold Sequences. Every
// reader of a component walks it through component_steps: the steps in order, flattened without
// recursion, null skipped, and at most kMaxComponentSteps of them (real files have fewer than ten;
// each step costs time on every text encoded). The file's nesting depth is bounded when it is
// parsed (core/bounded_json.h).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace primus::data {

constexpr size_t kMaxComponentSteps = 1024;

// `node`: the component (null: no steps); `list_key`: where a Sequence keeps its steps
// ("normalizers", "pretokenizers", "decoders", "processors"); `what`: the component in errors
// ("tokenizer file 'x': normalizer"). A step that is not an object, a Sequence without its list,
// or more than kMaxComponentSteps steps is a primus::Error naming `what`. The pointers point into
// `node`.
std::vector<const nlohmann::json*> component_steps(const nlohmann::json& node, const char* list_key,
                                                   const std::string& what);

}  // namespace primus::data
