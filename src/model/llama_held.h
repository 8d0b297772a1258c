// LlamaModel::Held, shared by the model's source files (llama.cpp, mtp.cpp).
#pragma once

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "model/llama.h"

namespace primus {

// Acquires the units that hold `params` (each once) for one pass; releases them when it ends.
class LlamaModel::Held {
 public:
  Held(const LlamaModel& m, std::initializer_list<int> params, int next) : src_(m.source()) {
    for (int p : params) {
      const int u = m.unit_of(p);
      if (std::find(units_.begin(), units_.end(), u) == units_.end()) units_.push_back(u);
    }
    for (size_t i = 0; i < units_.size(); ++i) src_.acquire(units_[i], i + 1 < units_.size() ? units_[i + 1] : next);
  }
  ~Held() {
    for (size_t i = units_.size(); i-- > 0;) src_.release(units_[i]);
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

 private:
  WeightSource& src_;
  std::vector<int> units_;
};

}  // namespace primus
