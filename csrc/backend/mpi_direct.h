// The MPI side of a direct agreement (backend/direct.h): point-to-point messages on the
// group's own communicator.
#pragma once

#include <mpi.h>

#include "backend/direct.h"

namespace fluxmpi {

// Run `x` among the `size` ranks of `comm` (at most kDirectMaxRanks), as rank `rank`, one
// blocking call of group index `group` (runtime/call_watch.h: 0 the world).
void mpi_exchange_direct(DirectExchange& x, MPI_Comm comm, int rank, int size, int group);

}  // namespace fluxmpi
