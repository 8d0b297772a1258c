// main() of every gtest binary that runs under mpirun: every rank runs every case in the same
// order (collectives must match); rank 0 prints progress, the others only their failures, tagged
// with the rank. Any rank's failure fails mpirun's exit code.
#include <gtest/gtest.h>

#include <cstdio>

#include "parallel/mpi_process_group.h"

namespace {
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  using namespace primus::parallel;
  ::testing::InitGoogleTest(&argc, argv);
  init_mpi();
  const int rank = mpi_world().rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  } else {
    std::printf("MPI ranks: %d, thread level granted: %s\n", mpi_world().size(),
                thread_level_name(mpi_thread_level()));
  }
  const int rc = RUN_ALL_TESTS();
  finalize_mpi();
  return rc;
}
