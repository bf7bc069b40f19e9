// Shared memory that every rank of a communicator maps, when its ranks all run on one host:
// each rank makes its own part (a POSIX shared-memory object, shm_open) and maps every other
// rank's. The ranks agree on the outcome (the minimum of theirs), so either every rank maps every
// part or none does and the caller keeps its messages. Cached on the communicator, and freed
// with it. The direct agreements' slots (backend/mpi_direct_slots.h) and the grouped
// shared-memory collectives (backend/mpi_shared_pieces.h) each keep one.
//
// Not MPI_Win_allocate_shared: Open MPI 5.0.11 (PyPI) prints "osc_ucx_component.c:375 Error:
// OSC UCX component priority set inside component query failed" once per rank from its
// one-sided component selection on hosts without UCX devices, on a correct run.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace fluxmpi {

struct ShmSegment {
  ShmSegment() = default;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  virtual ~ShmSegment();    // unmaps every part
  bool mapped = false;      // false: the ranks span hosts (or a rank failed), nothing is shared
  std::int64_t bytes = 0;   // each rank's part, in bytes
  std::vector<char*> base;  // each rank's part, mapped here (empty unless `mapped`)
};

// What a communicator keeps a segment for: one segment of each per communicator.
enum class ShmUse : int { DirectSlots = 0, SharedPieces = 1 };

// The segment kept for `use` on `comm`, or nullptr while none was made.
ShmSegment* find_shm_segment(MPI_Comm comm, ShmUse use);

// Map `bytes` of each rank's into `s` and keep it on `comm` for `use`: a collective, which every
// rank of `comm` reaches at the same call. `one_host`: whether its ranks all run on one host,
// the same on every rank; if not, or where any rank fails at any step (a /dev/shm too small for
// the parts: their pages are reserved here), `s->mapped` is false on every rank.
ShmSegment& keep_shm_segment(MPI_Comm comm, ShmUse use, std::unique_ptr<ShmSegment> s,
                             std::int64_t bytes, bool one_host);

}  // namespace fluxmpi
