// `benchmark checkpoint`: how fast this machine saves and loads a model's checkpoint, against the
// disk's own sequential write and read speed measured in the same run (the limit).
//
// Every rank of `world` owns 1/N of every tensor (as replicas share the writing, docs/checkpoints.md
// "Who writes what"; ZeRO / FSDP shards are the same amount), holds only that part (12 bytes per
// owned element: values and two moments), and in turn, each phase between barriers and timed by
// its slowest rank:
//   disk write  writes its data to a plain file (writes of up to 1 GiB, as a shard's; fsync)
//   disk read   reads it back (its pages dropped from the page cache first)
//   save        saves its part through the checkpoint writer (CheckpointSave, synchronous)
//   load        reads back only its own ranges (LoadOptions::ranges; pages dropped first) into
//               its own state's flat buffers (LoadOptions::into: resident, as a resuming rank's),
//               and checks them against what it saved
//   load_new    the same into buffers the load allocates (CheckpointData's: page faults included)
//   load_all    every tensor whole into each rank's buffers (as no_shard replicas need it), each
//               rank reading all of it
//   load_shared the same, each rank reading a 1/N share and receiving the rest from the others
//               (LoadTarget::replicas); checked equal to load_all's. Bytes: the checkpoint's.
//   disk write and read again; the faster of the two measurements of the disk is reported
// The page cache is bypassed with posix_fadvise(DONTNEED) on fsynced files, so reads come from
// the disk where the kernel honours it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/param_store.h"

namespace primus::parallel {
class ProcessGroup;
}

namespace primus::checkpoint {

struct BenchPhase {
  double seconds = 0;        // the slowest rank's
  uint64_t bytes = 0;        // over all ranks
  std::vector<double> rank_seconds;
  // CPU time (user and system, every thread) the phase took, summed over the ranks: what the
  // phase costs the machine, which other work on a shared host moves far less than its wall time.
  double cpu_seconds = 0;
  double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
  double cpu_seconds_per_gb() const { return bytes > 0 ? cpu_seconds / (double(bytes) / 1e9) : 0.0; }
};

struct CheckpointBench {
  int ranks = 1;
  int64_t parameters = 0;
  std::vector<uint64_t> rank_bytes;  // each rank's shard file
  BenchPhase disk_write, disk_read, save, load, load_new, load_all, load_shared;
};

// `layout`: the model's tensors (not allocated). Collective over world (nullptr: one process).
// Writes under `dir` (created; the files are removed at the end).
CheckpointBench bench_checkpoint(const ParamStore& layout, parallel::ProcessGroup* world, const std::string& dir);

}  // namespace primus::checkpoint
