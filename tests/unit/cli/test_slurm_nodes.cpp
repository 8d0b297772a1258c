// --exclude-failed-nodes' plan (cli/lib/slurm_nodes.h): outside an allocation a failed node is
// added to srun's --exclude; inside one only when the step's node count leaves a spare node;
// repeated failures accumulate in the one --exclude the plan owns.
#include <gtest/gtest.h>

#include "cli/lib/slurm_nodes.h"

using namespace primus::cli;

namespace {
const std::vector<std::string> kSrun = {
    "srun", "--mpi=pmix", "-N", "2", "--kill-on-bad-exit=1", "/bin/primus-cli", "direct", "--", "train", "pretrain"};
}

TEST(SlurmNodes, OutsideAnAllocationSlurmFindsAReplacement) {
  const ExcludePlan p = plan_exclusion(kSrun, {"n3"}, {});
  ASSERT_EQ(p.argv.size(), kSrun.size() + 1);
  EXPECT_EQ(p.argv[0], "srun");
  EXPECT_EQ(p.argv[1], "--exclude=n3");
  EXPECT_EQ(p.excluded, (std::vector<std::string>{"n3"}));
  EXPECT_NE(p.note.find("Slurm allocates a replacement"), std::string::npos) << p.note;
  // A second failure adds to the same flag.
  const ExcludePlan q = plan_exclusion(p.argv, {"n5", "n3"}, {});
  EXPECT_EQ(q.argv.size(), p.argv.size());
  EXPECT_EQ(q.argv[1], "--exclude=n3,n5");
}

TEST(SlurmNodes, InsideAnAllocationOnlyWithASpareNode) {
  // 3 nodes for a 2-node step: one spare.
  const ExcludePlan p = plan_exclusion(kSrun, {"n1"}, {"n1", "n2", "n3"});
  EXPECT_EQ(p.argv[1], "--exclude=n1");
  EXPECT_NE(p.note.find("a spare node of the allocation replaces it"), std::string::npos) << p.note;
  // The spare is used up: the next failure restarts on the same nodes.
  const ExcludePlan q = plan_exclusion(p.argv, {"n2"}, {"n1", "n2", "n3"});
  EXPECT_EQ(q.argv, p.argv);
  EXPECT_NE(q.note.find("no spare node"), std::string::npos) << q.note;
  // A step without -N takes every node of the allocation: nothing to spare.
  const std::vector<std::string> all = {"srun", "--mpi=pmix", "/bin/primus-cli", "direct", "--", "train", "pretrain"};
  const ExcludePlan r = plan_exclusion(all, {"n1"}, {"n1", "n2"});
  EXPECT_EQ(r.argv, all);
  EXPECT_NE(r.note.find("--spare-nodes"), std::string::npos) << r.note;
}

TEST(SlurmNodes, NoNodeToBlame) {
  const ExcludePlan p = plan_exclusion(kSrun, {}, {});
  EXPECT_EQ(p.argv, kSrun);
  EXPECT_NE(p.note.find("no node to blame"), std::string::npos);
}
