// Collective benchmarks over any ProcessGroup (MPI on CPUs, NCCL on GPUs), measured and reported
// as nccl-tests / rccl-tests do (`benchmark collectives`, alias `benchmark rccl`):
//
//   size     nccl-tests' "size": the bytes of the whole buffer: all_reduce, broadcast and send/recv
//            the buffer each rank holds; all_gather the gathered result; reduce_scatter the input;
//            alltoall the buffer each rank sends. Each rank's share (size / n) is a whole number
//            of elements.
//   time     the mean over `iters` runs (after `warmup`), the slowest rank's.
//   algbw    size / time (GB/s, 1e9 bytes).
//   busbw    algbw x the op's factor, comparable with the links' bandwidth whatever the rank count:
//            all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall (n-1)/n; broadcast and
//            send/recv 1.
//
// --check fills every rank's input with a known pattern (small integers: exact in bf16 for up to
// 128 ranks) before the timed runs, runs the op once and counts the elements that differ from the
// expected result on every rank. send/recv is a ring: each rank sends to the next rank of the group
// and receives from the previous one (a pipeline group's neighbours). Reductions are sums;
// broadcast's root is rank 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "parallel/process_group.h"

namespace primus::parallel {

enum class CollOp { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, SendRecv };
inline constexpr CollOp kAllCollOps[] = {CollOp::AllReduce, CollOp::AllGather, CollOp::ReduceScatter,
                                         CollOp::AllToAll,  CollOp::Broadcast, CollOp::SendRecv};

const char* coll_op_name(
    CollOp op);  // "all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv"
// Our names and nccl-tests' (all_reduce / allreduce, alltoall / all_to_all, sendrecv / send_recv, ...);
// anything else is an error that lists them.
CollOp parse_coll_op(const std::string& name);
// float32 | bfloat16 | float64 | int32 (and fp32, bf16, fp64, float, double, int): the types
// every backend reduces.
DType parse_coll_dtype(const std::string& name);

// busbw / algbw for `op` over `n` ranks (nccl-tests' formulas).
double bus_bandwidth_factor(CollOp op, int n);
// Elements each rank contributes for a `bytes` size (see above); 0 when `bytes` is too small for one.
int64_t elements_per_rank(CollOp op, int64_t bytes, DType t, int n);
// The size the run really measures: `bytes` rounded down to whole elements per rank.
int64_t measured_bytes(CollOp op, int64_t per_rank, DType t, int n);

struct CollResult {
  CollOp op;
  DType dtype;
  int ranks = 1;
  int64_t bytes = 0;  // the size (as above)
  int64_t count = 0;  // elements per rank (nccl-tests' count: the per-rank share for all_gather and friends)
  double seconds = 0;
  double algbw_gbs = 0, busbw_gbs = 0;
  bool checked = false;
  int64_t wrong = 0;  // elements that differ from the expected result, over every rank
};

struct CollBenchOptions {
  int warmup = 5, iters = 20;
  bool check = false;
};

// Collective over every member of `g` (each with the same arguments). Buffers live on g.device().
CollResult run_collective(ProcessGroup& g, CollOp op, DType t, int64_t bytes, const CollBenchOptions& o);

// min, min x factor, ... up to max (nccl-tests' -b -e -f; factor 1 is an error).
std::vector<int64_t> size_sweep(int64_t min_bytes, int64_t max_bytes, double factor);
// "64K", "1M", "1G", "4096" -> bytes (nccl-tests' suffixes, powers of 1024).
int64_t parse_byte_size(const std::string& text);

}  // namespace primus::parallel
