// The allreduce of a list's pieces in place through shared memory, for communicators whose
// ranks all run on one host: each rank writes its parts of the others' chunks straight into
// their windows (each rank's part of a shared-memory segment, backend/shm_segment.h), reduces
// its own chunk in its pieces, and copies the finished chunks out of their owners' windows.
// One copy in, one copy out and the reduction per element, as a flat allreduce; MPI's
// point-to-point path over datatypes that describe the pieces costs two copies each way here
// (shared memory, Open MPI 4.1).
#pragma once

#include <mpi.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/reduce_op.h"

namespace fluxmpi {

// Each rank's window, in bytes: a call moves in rounds of about this much of the list.
constexpr std::int64_t kSharedWindowBytes = std::int64_t(4) << 20;

// In place over the `count` elements of `dt` (float, double, int32, int64) laid out in
// `pieces` (which must not overlap): `op` (Sum, Min, Max; Average divides the sum by `size`).
// Every rank of `comm` must be on this host and call it at the same point (the first call on
// a communicator maps its windows, a collective; they are freed with the communicator).
// Each element is reduced by one rank, in rank order, and copied to the others: identical
// bits on every rank. A blocking collective: the caller holds the BlockingCall. False, on
// every rank, where the windows could not be mapped (a /dev/shm too small): then nothing was
// done, and the caller takes its messages.
bool shared_allreduce_pieces(const std::vector<BufferPiece>& pieces, std::int64_t count,
                             c10::ScalarType dt, ReduceOp op, MPI_Comm comm, int rank, int size);

// How many calls this process has made (for tests, through ring_calls()).
std::int64_t shared_pieces_calls();

// A reduce-scatter through the same window: `send` holds every rank's part in rank order
// (`counts[r]` elements for rank r), `recv` gets this rank's part reduced over the ranks
// (`op`: Sum, Min, Max; averages are divided by the caller). Each rank writes its parts of the
// others' chunks into their windows and reduces its own chunk straight into `recv`: one copy
// and the reduction per element, where Open MPI 4.1's MPI_Reduce_scatter and
// MPI_Reduce_scatter_block took 2-10x an allgather of the same bytes on one host
// (docs/measurements.md). Reduced in rank order (rank 0's part, then rank 1's, ...): identical
// whatever the window's rounds. Same requirements as shared_allreduce_pieces; `counts` must be
// the same on every rank. False as shared_allreduce_pieces is.
bool shared_reduce_scatter(const void* send, void* recv, const std::vector<std::int64_t>& counts,
                           c10::ScalarType dt, ReduceOp op, MPI_Comm comm, int rank, int size);

// Whether shared_reduce_scatter takes `dt` and `op` (float, double, int32, int64; sum, min, max).
bool shared_reduce_scatter_takes(c10::ScalarType dt, ReduceOp op);

// A reduce-scatter of at least this many bytes in all goes through shared memory on one host.
constexpr std::int64_t kSharedReduceScatterMinBytes = std::int64_t(128) << 10;

// How many shared_reduce_scatter calls this process has made (for tests).
std::int64_t shared_reduce_scatter_calls();

// Backend::reduce_parts_by_owner through the same window: `pieces` hold `size` parts of
// `part_bytes` bytes, part r rank r's. In rounds of at most kSharedWindowBytes / size bytes of
// each part, each rank writes its values of the others' parts into their owners' windows;
// after a meeting each owner runs `pass` over every rank's values (its own read where they
// lie) and writes the result into its window; after a second meeting every rank copies every
// owner's result into its pieces. One copy in and one out per element, where an alltoall and
// an allgather cost two each way here. `elem` is the element size in bytes. Same
// requirements as shared_allreduce_pieces. `sets` > 1: `sets` such runs of parts, one after
// another, each rank's values of all of them in one pass (Backend::reduce_parts_by_owner);
// a round then moves 1 / sets of a slot of each, and the results go into the last set. False
// as shared_allreduce_pieces is.
bool shared_owner_parts(const std::vector<BufferPiece>& pieces, std::int64_t part_bytes,
                        std::int64_t elem, const OwnerPass& pass, MPI_Comm comm, int rank, int size,
                        int sets = 1);

// How many shared_owner_parts calls this process has made (for tests).
std::int64_t shared_owner_parts_calls();

}  // namespace fluxmpi
