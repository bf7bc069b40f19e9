// The world replaced after ranks were lost (the shrink mode, runtime/fault_tolerance.h). Kept
// apart from environment.h, which most files include: implemented by environment.cpp, which
// owns the world.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi {

// Make `comm` (and its `control` dup) the world, with the rank, size, node ranks and host names
// read from it, and restart the watch on it. The old communicators are left alone (revoked;
// freeing them would be collective).
void adopt_world(MPI_Comm comm, MPI_Comm control);

// Every rank's process, by rank of the world (gathered with the host names at init and at
// adopt_world): a survivor can end a lost rank that still lives on its own host (a hung one).
struct RankProcess {
  std::string host;
  std::int64_t pid = 0;
  std::int64_t start = 0;        // its start time in clock ticks after boot (/proc/PID/stat), or 0
  std::int64_t runtime_job = 0;  // its launcher's job and rank there (runtime/runtime_end.h)
  std::int64_t runtime_rank = -1;
};
const std::vector<RankProcess>& rank_processes();

// The start time of process `pid` (/proc/PID/stat's 22nd field), or 0 where it cannot be read.
std::int64_t process_start(std::int64_t pid);

// How many times adopt_world ran in this process. One that has lived through a lost rank must
// not wait in MPI_Finalize: a survivor can hang there (open-mpi/ompi#11404).
int world_changes();

}  // namespace fluxmpi
