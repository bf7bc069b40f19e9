// NCCL communicators (one per CUDA device, created lazily and collectively) and the host-side
// wait that gives NCCL calls the blocking semantics of the MPI backend.
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

namespace fluxmpi::nccl {

// The communicator for `device`, created on first use. Collective when it creates: rank 0's
// ncclUniqueId is broadcast over MPI on env().comm, then every rank joins ncclCommInitRank.
ncclComm_t comm_for(int device);

// Destroy every communicator (see nccl_shutdown in backend/nccl_backend.h).
void destroy_all_comms();

// Block the host until everything enqueued so far on `stream` has completed, inside a
// BlockingCall named `what` (so a peer that exits ends the job instead of hanging it). While
// waiting, NCCL's asynchronous errors on `comm` are polled: on one, the communicator is
// aborted and the job ends with the error (abort_job), as in torch's NCCL async error handling.
void wait_for(const char* what, ncclComm_t comm, int device, const c10::cuda::CUDAStream& stream);

}  // namespace fluxmpi::nccl
