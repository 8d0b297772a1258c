// The MPI backend of ProcessGroup (OpenMPI; CPU buffers). Each group owns a communicator with
// MPI_ERRORS_RETURN, so an MPI failure becomes a primus::Error instead of aborting the job.
//
// MPI is initialised once per process by init_mpi() (any call below does it on demand):
// MPI_Init_thread asking for MPI_THREAD_MULTIPLE, so that a communication thread (e.g. DP
// gradient buckets reduced while the backward runs) may call MPI beside the compute thread.
// If the library grants less, we accept MPI_THREAD_FUNNELED (only the thread that initialised
// MPI may call it) and mpi_thread_level() tells callers which they got; anything below
// FUNNELED is an error. finalize_mpi() releases the world group and calls MPI_Finalize; it is
// registered with atexit, so calling it explicitly is only needed to finalize early.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "parallel/process_group.h"

namespace primus::parallel {

enum class ThreadLevel { Single, Funneled, Serialized, Multiple };
const char* thread_level_name(ThreadLevel l);

void init_mpi();
void finalize_mpi();
// After an error on one rank: ends every rank of the job at once (MPI_Abort) instead of leaving
// the others waiting in a collective. A no-op when MPI is not initialised.
void abort_mpi(int code);
bool mpi_initialized();   // by us or by someone else, and not yet finalized
ThreadLevel mpi_thread_level();

// How a rank waits for another's message or a collective. MPI's blocking calls poll without a
// pause; when a node's ranks outnumber its cores, a polling rank holds a core its peer needs and
// every message waits a scheduler time slice (milliseconds). PRIMUS_MPI_WAIT, read once when MPI
// starts: `spin` (MPI's blocking calls), `sleep` (the non-blocking twin of each call, then
// MPI_Test with sleeps of 2 to 100 us between tries), `auto` or unset: sleep when the ranks on this
// node outnumber the cores this rank may run on, spin otherwise. The same operations either way;
// a non-blocking collective may pick another algorithm, so a sum over 3 or more ranks may round
// in another order.
bool mpi_waits_by_sleeping();

// The progress engine. OpenMPI advances a non-blocking collective only inside MPI calls of the
// process (its build has no asynchronous progress thread: `ompi_info` says "OMPI progress: no"),
// so a reduce-scatter posted before a layer's compute would otherwise make almost no headway until
// wait(). With an interval > 0 and MPI_THREAD_MULTIPLE granted, a thread of ours calls MPI's
// progress (MPI_Iprobe on a communicator nobody sends on) every `interval_us` microseconds while
// any non-blocking operation of this backend is in flight, and sleeps on a condition variable
// while none is, so blocking code and compute-only phases pay nothing. 0 stops it. Results do not
// depend on it (the same collectives, the same reduction order). Returns whether the thread runs:
// false at interval 0, or when MPI granted less than MPI_THREAD_MULTIPLE.
bool set_mpi_progress_interval(int64_t interval_us);
// Progress passes the thread made since it started (tests: it ran while operations were in flight).
int64_t mpi_progress_passes();

class MpiProcessGroup final : public ProcessGroup {
 public:
  // Takes ownership of comm (freed in the destructor unless it is MPI_COMM_WORLD/SELF).
  // world_ranks: the global rank of each member, in group-rank order.
  MpiProcessGroup(MPI_Comm comm, std::string name, std::vector<int> world_ranks);
  ~MpiProcessGroup() override;
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::string backend() const override { return "mpi"; }
  Device device() const override { return Device::CPU; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  MPI_Comm comm() const { return comm_; }

  using ProcessGroup::all_gather;
  using ProcessGroup::all_reduce;
  using ProcessGroup::all_to_all;
  using ProcessGroup::broadcast;
  using ProcessGroup::iall_gather;
  using ProcessGroup::iall_reduce;
  using ProcessGroup::ireduce_scatter;
  using ProcessGroup::irecv;
  using ProcessGroup::isend;
  using ProcessGroup::reduce_scatter;

  void all_reduce(void* buf, int64_t count, CommType t, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t,
                      ReduceOp op) override;
  void all_gather(const void* send, void* recv, int64_t send_count, CommType t) override;
  void broadcast(void* buf, int64_t count, CommType t, int root) override;
  void all_to_all(const void* send, void* recv, int64_t count_per_rank, CommType t) override;
  void barrier() override;

  WorkPtr iall_reduce(void* buf, int64_t count, CommType t, ReduceOp op) override;
  WorkPtr ireduce_scatter(const void* send, void* recv, int64_t recv_count, CommType t,
                          ReduceOp op) override;
  WorkPtr iall_gather(const void* send, void* recv, int64_t send_count, CommType t) override;
  WorkPtr isend(const void* buf, int64_t count, CommType t, int dst, int tag = 0) override;
  WorkPtr irecv(void* buf, int64_t count, CommType t, int src, int tag = 0) override;

  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;

 private:
  void check(int rc, const char* op) const;  // MPI return code -> primus::Error

  MPI_Comm comm_;
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_ = 0, size_ = 1;
};

// The group of all ranks of this launch (a duplicate of MPI_COMM_WORLD), created on first use
// after init_mpi(); lives until finalize_mpi().
MpiProcessGroup& mpi_world();

}  // namespace primus::parallel
