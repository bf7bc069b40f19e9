// Whether the MPI library running this process takes CUDA device pointers (a CUDA-aware MPI),
// asked at run time, as Open MPI and MPICH document: a library other than the one compiled
// against may be loaded, so the header's compile-time macro alone does not tell.
#pragma once

#include <string>

namespace fluxmpi {

// "yes", "no", or "unknown" (before MPI is initialized, or an MPI with no way to ask).
std::string mpi_cuda_support();

}  // namespace fluxmpi
