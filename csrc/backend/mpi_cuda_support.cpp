#include "backend/mpi_cuda_support.h"

#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>  // Open MPI's extensions: MPIX_Query_cuda_support where built
#endif

namespace fluxmpi {

std::string mpi_cuda_support() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return "unknown";
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support() ? "yes" : "no";
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;  // MPICH 4
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) != MPI_SUCCESS) return "unknown";
  return supported ? "yes" : "no";
#else
  return "unknown";
#endif
}

}  // namespace fluxmpi
