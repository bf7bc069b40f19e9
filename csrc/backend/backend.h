// A communication backend over flat, contiguous buffers. Backends never see tensors' shapes,
// buckets or Python; they move bytes. Every call must be made in the same order on all ranks.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/direct.h"
#include "backend/reduce_op.h"

namespace fluxmpi {

// The owner's part of Backend::reduce_parts_by_owner: `rows[j]` points at rank j's values of
// elements [at, at + count) of this rank's part; the result of those elements goes to `out`,
// which may be one of the rows. Must not throw (the other ranks would wait for this one).
using OwnerPass = std::function<void(const std::vector<const void*>& rows, void* out,
                                     std::int64_t at, std::int64_t count)>;

// One contiguous run of a buffer made of several (a tensor of a grouped call): `bytes` bytes
// at `ptr`.
struct BufferPiece {
  void* ptr;
  std::int64_t bytes;
};

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
  // As allreduce, for float16/bfloat16 callers that accept 16 bits on the wire, each combine
  // computed in fp32 and rounded (compressed gradient buckets: HalfReduction::Wire16 in
  // ops/collectives.h). The MPI backend's 16-bit reduction already is that; a backend that
  // would otherwise widen 16-bit sums (NCCL) reduces natively here.
  virtual void allreduce_wire16(void* buf, std::int64_t count, c10::ScalarType dtype, ReduceOp op) {
    allreduce(buf, count, dtype, op);
  }
  // Reduce an envelope (backend/envelope.h) of `bytes` bytes in place across the ranks: one
  // message that carries a call's check and a small call's data.
  virtual void allreduce_envelope(void* buf, std::int64_t bytes) {
    unsupported("allreduce_envelope");
  }
  // Run a small group's agreement point to point (backend/direct.h).
  virtual void exchange_direct(DirectExchange& x) { unsupported("exchange_direct"); }
  // The largest payload the current group's direct agreements move through shared memory
  // (backend/mpi_direct_slots.h), 0 where they do not (yet); the same on every rank.
  virtual std::int64_t direct_slot_bytes() { return 0; }
  // Whether allreduce (allreduce_divided with `divided`) of `count` elements of `dtype` with
  // `op` would be one MPI_Allreduce, no ring or node-aware path: then an envelope may carry
  // it (the same sum order). Decided from the process's options alone, like the paths.
  virtual bool allreduces_plainly(std::int64_t count, c10::ScalarType dtype, ReduceOp op,
                                  bool divided) {
    return false;
  }
  // A sum in place, each element's ranks added in the order of torch's gloo backend
  // (backend/mpi_ring.h, SumOrder::Gloo). Returns false, having moved nothing, where this
  // backend has no such order (NCCL: CUDA tensors sum in NCCL's order); it decides from its
  // kind alone, so every rank of an agreed call decides alike.
  virtual bool allreduce_in_gloo_order(void* buf, std::int64_t count, c10::ScalarType dtype) {
    return false;
  }
  // As allreduce (Average: the sum divided by the group's size), over `count` elements of
  // `dtype` that lie in `pieces` in order, reduced where they lie: no packing into one buffer.
  // Pieces must not overlap. Returns false, having moved nothing, where this backend does not
  // take the call (the caller packs the pieces instead); it decides from count, dtype, op and
  // its options alone, so every rank of an agreed call decides alike.
  virtual bool allreduce_pieces(const std::vector<BufferPiece>& pieces, std::int64_t count,
                                c10::ScalarType dtype, ReduceOp op) {
    return false;
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
  // `pieces` hold, in order, `size` parts of `part_count` elements of `dtype` (a piece's
  // bytes a multiple of the element's; pieces must not overlap), part r rank r's to reduce:
  // rank r's `pass` gets every rank's values of part r (in rounds of a few MiB, split at its
  // pieces' edges, each element once) and writes their reduction, which then lands in part r
  // of every rank's pieces. What an alltoall, the pass and an allgather do, without their
  // copies. Returns false, having moved nothing, where this backend has no memory that all
  // the ranks share (the caller takes that path); it decides from its kind and the ranks'
  // hosts alone, so every rank of an agreed call decides alike. `sets` > 1: the pieces hold
  // `sets` such runs of `size` parts one after another (set s's part r at s * size + r); rank
  // r's pass gets `sets * size` rows (set s's rank j's values at s * size + j), and the
  // results land in the last set's part r alone.
  virtual bool reduce_parts_by_owner(const std::vector<BufferPiece>& pieces,
                                     std::int64_t part_count, c10::ScalarType dtype,
                                     const OwnerPass& pass, int sets = 1) {
    return false;
  }

  // The variable-size collectives below move bytes (any dtype); counts are per rank, in bytes,
  // and each rank's part lies at the sum of the counts before it (rank order).
  // Every rank's `send` (send_bytes) reaches every rank's `recv`, rank r's at its offset.
  virtual void allgatherv(const void* send, std::int64_t send_bytes, void* recv,
                          const std::vector<std::int64_t>& recv_bytes) {
    unsupported("allgather");
  }
  // As allgatherv, but only the root receives; `recv` is used on the root only.
  virtual void gatherv(const void* send, std::int64_t send_bytes, void* recv,
                       const std::vector<std::int64_t>& recv_bytes, int root) {
    unsupported("gather");
  }
  // The root's `send` is cut into parts of send_bytes[r]; rank r receives part r in `recv`.
  virtual void scatterv(const void* send, const std::vector<std::int64_t>& send_bytes, void* recv,
                        std::int64_t recv_bytes, int root) {
    unsupported("scatter");
  }
  // Part r of `send` (send_bytes[r]) goes to rank r; part r of `recv` (recv_bytes[r]) comes
  // from rank r.
  virtual void alltoallv(const void* send, const std::vector<std::int64_t>& send_bytes, void* recv,
                         const std::vector<std::int64_t>& recv_bytes) {
    unsupported("alltoall");
  }
  // alltoallv where every part of every rank is `part_bytes` long. The caller decides from
  // what every rank knows (all ranks' splits), so that every rank takes this call or none:
  // MPI_Alltoall and MPI_Alltoallv do not match each other.
  virtual void alltoall_equal(const void* send, void* recv, std::int64_t part_bytes, int size) {
    const std::vector<std::int64_t> parts(static_cast<std::size_t>(size), part_bytes);
    alltoallv(send, parts, recv, parts);
  }
  // Elementwise reduction of every rank's `send` (the sum of `counts` elements); rank r
  // receives part r of the result (counts[r] elements) in `recv`.
  virtual void reduce_scatter(const void* send, void* recv, const std::vector<std::int64_t>& counts,
                              c10::ScalarType dtype, ReduceOp op) {
    unsupported("reduce_scatter");
  }

 protected:
  [[noreturn]] void unsupported(const char* what) const {
    TORCH_CHECK(false, "fluxmpi_py: ", what, " is not supported on this backend (", name(),
                ", device ", std::strcmp(name(), "mpi") == 0 ? "cpu" : "cuda",
                "); move the tensors to the CPU for this call");
  }
};

// The MPI backend for host memory of the current group (runtime/group.h): the world's, on the
// communicator of fluxmpi::env(), unless a GroupScope is active on this thread.
Backend& mpi_backend();

}  // namespace fluxmpi
