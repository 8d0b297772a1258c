#include "cli/registry.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "core/suggest.h"

namespace primus::cli {

std::vector<TaskInfo>& task_registry() {
  static std::vector<TaskInfo> tasks;
  return tasks;
}

std::vector<RuntimeInfo>& runtime_registry() {
  static std::vector<RuntimeInfo> runtimes;
  return runtimes;
}

Invocation& invocation() {
  static Invocation inv;
  return inv;
}

static void collect_option_names(const CLI::App& app, std::vector<std::string>& out) {
  for (const CLI::Option* o : app.get_options()) {
    for (auto& l : o->get_lnames()) out.push_back("--" + l);
    for (auto& s : o->get_snames()) out.push_back("-" + s);
  }
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    collect_option_names(*sub, out);
}

std::string unknown_flag_hint(const CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> names;
  collect_option_names(app, names);
  for (const auto& a : args) {
    if (a.size() < 2 || a[0] != '-' || a == "--") continue;
    std::string flag = a.substr(0, a.find('='));
    if (std::find(names.begin(), names.end(), flag) != names.end()) continue;
    return fmt::format("unknown option '{}'{}", flag, did_you_mean(flag, names));
  }
  return "";
}

void validate_task_names(const std::vector<std::string>& task_args) {
  if (task_args.empty() || task_args[0].empty() || task_args[0][0] == '-') return;
  std::vector<std::string> names, subs;
  bool found = false;
  for (const auto& t : task_registry()) {
    if (std::find(names.begin(), names.end(), t.task) == names.end()) names.push_back(t.task);
    if (t.task != task_args[0]) continue;
    found = true;
    if (!t.subtask.empty()) subs.push_back(t.subtask);
  }
  if (!found)
    fail("unknown task '{}'{}; tasks: {}", task_args[0], did_you_mean(task_args[0], names), fmt::join(names, ", "));
  if (subs.empty() || task_args.size() < 2 || task_args[1].empty() || task_args[1][0] == '-') return;
  if (std::find(subs.begin(), subs.end(), task_args[1]) == subs.end())
    fail("unknown subtask '{} {}'{}; '{}' has: {}", task_args[0], task_args[1], did_you_mean(task_args[1], subs),
         task_args[0], fmt::join(subs, ", "));
}

int run_task(const std::vector<std::string>& task_args) {
  CLI::App app{"primus-cli task", "primus-cli <runtime> --"};
  app.require_subcommand(1);
  // One subcommand per task, one nested subcommand per subtask; actions chosen after parsing.
  std::map<std::string, CLI::App*> task_apps;
  std::vector<std::pair<CLI::App*, TaskAction>> actions;
  actions.reserve(task_registry().size());
  for (const auto& info : task_registry()) {
    CLI::App*& tapp = task_apps[info.task];
    if (!tapp) {
      tapp = app.add_subcommand(info.task, info.subtask.empty() ? info.help : info.task + " tasks");
      if (!info.subtask.empty()) tapp->require_subcommand(1);
    }
    CLI::App* target = info.subtask.empty() ? tapp : tapp->add_subcommand(info.subtask, info.help);
    actions.emplace_back(target, info.setup(*target));
  }

  // Unknown task and subtask names get a suggestion before CLI11's generic message.
  if (!task_args.empty() && task_args[0] != "--help" && task_args[0] != "-h") {
    std::vector<std::string> names;
    for (auto& [n, _] : task_apps) names.push_back(n);
    auto it = task_apps.find(task_args[0]);
    if (it == task_apps.end())
      fail("unknown task '{}'{}; tasks: {}", task_args[0], did_you_mean(task_args[0], names),
           fmt::join(names, ", "));
    if (task_args.size() > 1 && task_args[1][0] != '-' && !it->second->get_subcommands({}).empty()) {
      std::vector<std::string> subs;
      for (auto* s : it->second->get_subcommands({})) subs.push_back(s->get_name());
      if (std::find(subs.begin(), subs.end(), task_args[1]) == subs.end())
        fail("unknown subtask '{} {}'{}; '{}' has: {}", task_args[0], task_args[1],
             did_you_mean(task_args[1], subs), task_args[0], fmt::join(subs, ", "));
    }
  }

  std::vector<std::string> reversed(task_args.rbegin(), task_args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::ExtrasError& e) {
    std::string hint = unknown_flag_hint(app, task_args);
    if (hint.empty()) return app.exit(e);
    fail("{} for task '{}'", hint, fmt::join(task_args.begin(), task_args.begin() + std::min<size_t>(2, task_args.size()), " "));
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, action] : actions)
    if (sub->parsed()) return action();
  fail("no task was selected");
}

}  // namespace primus::cli
