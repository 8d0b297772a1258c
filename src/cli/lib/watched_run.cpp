#include "cli/lib/watched_run.h"

#include "safe/launcher_link.h"
#include "safe/supervisor.h"
#include "safe/train_watch.h"

namespace primus::cli {

int run_watched(const Launch& L, const WatchOptions& w, WatchedCommand c) {
  safe::parse_nan_policy(w.nan_policy);  // a typo fails here, before anything starts
  const HookSet hooks = L.hooks();
  for (EnvMap* e : {&c.env, &c.hook_env}) {
    safe::export_launcher_identity(*e);
    (*e)["PRIMUS_NAN_POLICY"] = w.nan_policy;
    if (w.no_watch) (*e)["PRIMUS_WATCH"] = "0";
  }
  if (w.no_watch) return run_between_hooks(hooks, L.line.task_args, c.argv, c.env, c.hook_env);
  run_hooks(hooks.pre, "pre", L.line.task_args, c.hook_env);
  safe::SuperviseOptions so;
  so.run_dir = L.run_dir;
  so.world_size = c.world_size;
  so.max_restarts = w.max_restarts;
  so.hang_timeout = w.hang_timeout;
  so.nan_policy = w.nan_policy;
  so.before_restart = c.before_restart;
  const int rc = safe::supervise(c.argv, c.env, so);
  c.hook_env["PRIMUS_TASK_EXIT_CODE"] = std::to_string(rc);
  run_hooks(hooks.post, "post", L.line.task_args, c.hook_env);
  return rc;
}

}  // namespace primus::cli
