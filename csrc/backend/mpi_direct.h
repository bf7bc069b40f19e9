// The MPI side of a direct agreement (backend/direct.h): point-to-point messages on the
// group's own communicator.
#pragma once

#include <mpi.h>

#include "backend/direct.h"
#include "backend/mpi_direct_slots.h"

namespace fluxmpi {

// Run `x` among the `size` ranks of `comm` (at most kDirectMaxRanks), as rank `rank`, one
// blocking call of group index `group` (runtime/call_watch.h: 0 the world). `shm`: the
// communicator's shared slots (backend/mpi_direct_slots.h), nullptr while it has none. Returns
// whether the call passed while there are none: the same on every rank, which then make them
// together (make_direct_slots).
bool mpi_exchange_direct(DirectExchange& x, MPI_Comm comm, int rank, int size, int group,
                         DirectSlots* shm);

}  // namespace fluxmpi
