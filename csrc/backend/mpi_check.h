// MPI return codes as exceptions, for the MPI backend and its ring allreduce.
#pragma once

#include <mpi.h>

#include <c10/util/Exception.h>

#include <string>

#include "runtime/fault_tolerance.h"

namespace fluxmpi {

// Throws a RuntimeError naming `what` and MPI's text for `rc`, unless rc is MPI_SUCCESS; in
// the shrink mode, RanksLost where a rank was lost (runtime/fault_tolerance.h).
inline void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  if (shrink_mode() && is_rank_loss(rc)) throw_rank_loss(rc, what);
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  TORCH_CHECK(false, "fluxmpi_py: ", what, " failed: ", std::string(msg, len));
}

}  // namespace fluxmpi
