#include "data/component_steps.h"

#include "core/error.h"

namespace primus::data {

std::vector<const nlohmann::json*> component_steps(const nlohmann::json& node, const char* list_key,
                                                   const std::string& what) {
  std::vector<const nlohmann::json*> steps;
  std::vector<const nlohmann::json*> todo{&node};  // last in, first out: pushed in reverse order
  while (!todo.empty()) {
    const nlohmann::json& n = *todo.back();
    todo.pop_back();
    if (n.is_null()) continue;
    if (!n.is_object()) fail("{}: a step must be an object with a \"type\", got {}", what, n.type_name());
    const auto type = n.find("type");
    if (type != n.end() && type->is_string() && type->get_ref<const std::string&>() == "Sequence") {
      const auto list = n.find(list_key);
      if (list == n.end() || !list->is_array()) fail("{}: a Sequence needs a \"{}\" list", what, list_key);
      for (auto it = list->rbegin(); it != list->rend(); ++it) todo.push_back(&*it);
    } else {
      steps.push_back(&n);
    }
    if (steps.size() + todo.size() > kMaxComponentSteps)
      fail("{} has more than {} steps; real tokenizers have a handful (a damaged or hostile file?)", what,
           kMaxComponentSteps);
  }
  return steps;
}

}  // namespace primus::data
