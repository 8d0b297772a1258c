// Which nodes a restarted Slurm job step may leave out (`--exclude-failed-nodes`): the nodes of
// the ranks that failed, added to the step's --exclude, when Slurm can give a replacement:
//   - outside an allocation (`slurm srun` allocates each attempt): always; Slurm picks another
//     node of the partition;
//   - inside one (`slurm sbatch`'s job, salloc): only when the step asks for a node count (-N)
//     and the allocation has that many nodes besides the excluded ones (`--spare-nodes` keeps
//     some aside); otherwise the step restarts on the same nodes, and the plan says why.
#pragma once

#include <string>
#include <vector>

namespace primus::cli {

struct ExcludePlan {
  std::vector<std::string> argv;      // the srun command for the next attempt
  std::vector<std::string> excluded;  // every node left out so far
  std::string note;                   // what was decided, for the event log
};

// `argv`: the srun command ("srun", flags..., the task). `allocation`: the allocation's nodes
// (empty outside one).
ExcludePlan plan_exclusion(const std::vector<std::string>& argv, const std::vector<std::string>& failed_nodes,
                           const std::vector<std::string>& allocation);

// The nodes of this job's allocation (`scontrol show hostnames $SLURM_JOB_NODELIST`); empty
// outside a job.
std::vector<std::string> allocation_nodes();

}  // namespace primus::cli
