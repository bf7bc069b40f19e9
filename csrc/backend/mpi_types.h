// The MPI datatype and reduction operation of a tensor's dtype and our ReduceOp, for the MPI
// backend (backend/mpi_backend.cpp). MPI has no 16-bit float types: they travel as 16-bit words
// and reduce through our own MPI_Ops, which compute every pair in fp32 and round once per
// combine.
#pragma once

#include <mpi.h>

#include <c10/core/ScalarType.h>

#include "backend/reduce_op.h"

namespace fluxmpi {

MPI_Datatype mpi_type(c10::ScalarType t);

// `op` must not be Average (the caller lowers it to a sum) and, if bitwise, `t` is integral.
MPI_Op mpi_op(ReduceOp op, c10::ScalarType t);

}  // namespace fluxmpi
