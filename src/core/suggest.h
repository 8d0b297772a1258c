// "Did you mean ...?" for unknown names: keys, tasks, runtimes, algorithms.
#pragma once

#include <string>
#include <vector>

namespace primus {

size_t edit_distance(const std::string& a, const std::string& b);
// The nearest candidate by edit distance, or "" when none is close enough to be a typo.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);
// " (did you mean 'x'?)" when a candidate is close, else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace primus
