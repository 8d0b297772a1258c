// Where the model finds its working weights and puts its weight gradients, one unit at a time.
//
// A unit is a run of consecutive parameters that a pass uses together: the embedding, one decoder
// block, the head (final norm and output layer). Before a pass reads a unit's weights the model
// acquires the unit and releases it after; a W pass asks for the unit's gradient buffer and
// reports, through the weight-gradient hook (llama.h), when it is done with it. The model's own
// buffers are the default source (always there: acquire and release do nothing). FSDP
// (parallel/fsdp.h) all-gathers a unit's shards just in time, prefetches the next unit, frees the
// gathered copy on release (or keeps it from a microbatch's forward to its W passes, with
// torch_fsdp2_reshard_after_forward false), and reduce-scatters the unit's gradients after each
// microbatch's W passes (or once per step, with reduce_sharded_grads_once_per_step); the trainer
// chooses the source.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace primus {

struct WeightUnit {
  int first_param = 0, last_param = 0;  // inclusive ids into the model's ParamStore
  int64_t begin = 0, end = 0;           // the elements [begin, end) of the flat layout they span
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The model is about to run a pass that reads `unit`'s weights; `next` is the unit it will read
  // after this one in the same pass (-1: none), which a source may start fetching now.
  virtual void acquire(int unit, int next) = 0;
  virtual void release(int unit) = 0;
  // The working weights of an acquired unit, flat: element 0 is element `begin` of the layout.
  virtual Tensor weights(int unit) = 0;
  // The unit's gradient buffer (master dtype, indexed the same way) that W passes add to.
  virtual Tensor grads(int unit) = 0;
  // The master values of a buffer (StoredParam::buffer: the MoE expert bias), whole and writable,
  // whether or not its unit is acquired: the model reads and updates them itself.
  virtual Tensor buffer(int param) = 0;
};

}  // namespace primus
