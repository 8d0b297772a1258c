// The validator rejects hand-broken schedules with a message that names the problem.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "pipeline/schedules/registry.h"
#include "pipeline/validator.h"

using namespace primus::pipeline;

namespace {

Schedule base() {
  ScheduleRequest r;
  r.pp = 4, r.microbatches = 8;
  return generate("zb-h1", r);
}

std::string problems(const Schedule& s) {
  std::string all;
  for (auto& p : find_problems(s)) all += p + "\n";
  return all;
}

}  // namespace

TEST(Validator, AcceptsGenerated) { EXPECT_EQ(problems(base()), ""); }

TEST(Validator, RejectsMissingOp) {
  Schedule s = base();
  s.ranks[2].pop_back();  // a W disappears
  EXPECT_NE(problems(s).find("expected F once"), std::string::npos) << problems(s);
  EXPECT_THROW(validate(s), primus::Error);
}

TEST(Validator, RejectsDuplicatedOp) {
  Schedule s = base();
  s.ranks[1].push_back(s.ranks[1][0]);
  attach_p2p(s);
  EXPECT_NE(problems(s).find("F x2"), std::string::npos) << problems(s);
}

TEST(Validator, RejectsDeadlock) {
  Schedule s = base();
  // Rank 1 waits for B1 before it ever sends F1 on: nothing can move.
  auto& ops = s.ranks[1];
  std::swap(ops[1], ops[3]);  // F0 B0 F2 F1 ... -> B0 ahead of F1? keep the check generic
  std::swap(ops[0], ops[3]);
  attach_p2p(s);
  EXPECT_NE(problems(s).find("deadlock"), std::string::npos) << problems(s);
}

TEST(Validator, RejectsWBeforeItsB) {
  Schedule s = base();
  auto& ops = s.ranks[3];
  // Last rank: F0 B0 F1 B1 ...; put W0 right after F0.
  ops.insert(ops.begin() + 1, Op{OpType::W, 0, 0, {}, {}});
  for (size_t i = ops.size() - 1; i > 0; --i)
    if (ops[i].type == OpType::W && ops[i].microbatch == 0) {
      ops.erase(ops.begin() + i);
      break;
    }
  attach_p2p(s);
  EXPECT_NE(problems(s).find("deadlock"), std::string::npos) << problems(s);
}

TEST(Validator, RejectsWrongTransfer) {
  Schedule s = base();
  s.ranks[2][0].recv->peer = 3;  // F0 on rank 2 must receive from rank 1
  std::string p = problems(s);
  EXPECT_NE(p.find("receives"), std::string::npos) << p;
  s = base();
  s.ranks[0][0].send.reset();  // rank 0 never sends F0
  p = problems(s);
  EXPECT_NE(p.find("never sends"), std::string::npos) << p;
}

TEST(Validator, RejectsOutOfRange) {
  Schedule s = base();
  s.ranks[0][0].chunk = 1;
  EXPECT_NE(problems(s).find("out of range"), std::string::npos);
}
