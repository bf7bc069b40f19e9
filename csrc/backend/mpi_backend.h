// Making MPI backends: the world's, and one per communicator for sub-groups (runtime/group.h).
#pragma once

#include <mpi.h>

#include <memory>

#include "backend/backend.h"

namespace fluxmpi {

// The MPI backend of the world: on env().comm, read at each call.
Backend& world_mpi_backend();

// An MPI backend on `comm`, where this process is `rank` of `size`. Its blocking calls count
// for call group `group` (runtime/call_watch.h, BlockingCall; 0 is the world). The caller
// keeps `comm` alive as long as the backend.
std::unique_ptr<Backend> make_mpi_backend(MPI_Comm comm, int rank, int size, int group);

}  // namespace fluxmpi
