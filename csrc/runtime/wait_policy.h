// How a rank waits inside MPI. Open MPI busy-polls by default; while a gradient bucket is in
// flight on the engine thread, that polling takes the core from backward on a rank without a
// spare core. `mpi_yield_when_idle` makes Open MPI yield instead, but it is read when MPI
// starts (OMPI_MCA_mpi_yield_when_idle, which `import fluxmpi_py` sets), and its MPI_T control
// variable is read-only afterwards. So Init also switches it on at run time, through Open
// MPI's own exported setter, for the cases where MPI started before fluxmpi_py was imported
// (mpi4py imported first, Init(comm=...)).
#pragma once

#include <string>

namespace fluxmpi {

// After MPI is initialized: make Open MPI yield when idle unless the user turned it off
// (OMPI_MCA_mpi_yield_when_idle=0). Returns what applies: "yield (set when MPI started)",
// "yield (set by fluxmpi_py.Init)", "poll (OMPI_MCA_mpi_yield_when_idle=0)", or
// "the MPI library's own (not Open MPI)".
std::string apply_wait_policy();

// The last result of apply_wait_policy(), "" before it ran.
const std::string& wait_policy();

}  // namespace fluxmpi
