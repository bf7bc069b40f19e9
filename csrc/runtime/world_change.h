// The world replaced after ranks were lost (the shrink mode, runtime/fault_tolerance.h). Kept
// apart from environment.h, which most files include: implemented by environment.cpp, which
// owns the world.
#pragma once

#include <mpi.h>

namespace fluxmpi {

// Make `comm` (and its `control` dup) the world, with the rank, size, node ranks and host names
// read from it, and restart the watch on it. The old communicators are left alone (revoked;
// freeing them would be collective).
void adopt_world(MPI_Comm comm, MPI_Comm control);

// How many times adopt_world ran in this process. One that has lived through a lost rank must
// not wait in MPI_Finalize: a survivor can hang there (open-mpi/ompi#11404).
int world_changes();

}  // namespace fluxmpi
