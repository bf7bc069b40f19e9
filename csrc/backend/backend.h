// A communication backend over flat, contiguous buffers. Backends never see tensors' shapes,
// buckets or Python; they move bytes. Every call must be made in the same order on all ranks.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

#include "backend/reduce_op.h"

namespace fluxmpi {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // In place: every rank's `buf` ends holding the reduction of all ranks' buffers.
  virtual void allreduce(void* buf, std::int64_t count, c10::ScalarType dtype, ReduceOp op) {
    unsupported("allreduce");
  }
  // In place: every rank's `buf` ends holding (sum of all ranks' buffers) / divisor, for
  // float and double. Backends that can fold the division into the reduction (no extra pass
  // over memory) say so with fuses_division(); the ops layer divides after allreduce otherwise.
  virtual bool fuses_division() const { return false; }
  virtual void allreduce_divided(void* buf, std::int64_t count, c10::ScalarType dtype,
                                 int divisor) {
    unsupported("allreduce_divided");
  }
  virtual void broadcast(void* buf, std::int64_t count, c10::ScalarType dtype, int root) {
    unsupported("broadcast");
  }
  // `send` is read on every rank; `recv` is written on the root only.
  virtual void reduce(const void* send, void* recv, std::int64_t count, c10::ScalarType dtype,
                      ReduceOp op, int root) {
    unsupported("reduce");
  }
  // `recv` holds size * count elements, rank r's contribution at offset r * count.
  virtual void allgather(const void* send, void* recv, std::int64_t count, c10::ScalarType dtype) {
    unsupported("allgather");
  }
  virtual void barrier() { unsupported("barrier"); }

 protected:
  [[noreturn]] void unsupported(const char* what) const {
    TORCH_CHECK(false, "fluxmpi_py: backend ", name(), " does not support ", what);
  }
};

// The MPI backend for host memory, on the communicator of fluxmpi::env().
Backend& mpi_backend();

}  // namespace fluxmpi
