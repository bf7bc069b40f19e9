// The MPI side of an envelope (backend/envelope.h): one MPI_Allreduce of one element of a
// contiguous type of the envelope's size, with a user-defined commutative op.
#pragma once

#include <mpi.h>

#include <cstdint>

namespace fluxmpi {

// Reduce the envelope `buf` of `bytes` bytes (a whole number of words) across `comm`, in place,
// one blocking call of group index `group` (runtime/call_watch.h: 0 the world).
void mpi_allreduce_envelope(void* buf, std::int64_t bytes, MPI_Comm comm, int group);

}  // namespace fluxmpi
