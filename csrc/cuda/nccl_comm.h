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

// The host does not wait (nccl_host_wait() off): record the end of what was enqueued so far on
// `stream` and hand it to the watchdog thread (started on first use). It polls every pending
// call about once a millisecond, in order: NCCL's asynchronous errors on `comm` end the job with
// their message (the communicator aborted first), as wait_for does, and a call not done after
// the stall timeout (Init(timeout=)) ends the job naming it. More than kMaxWatched calls
// pending makes the host wait for the oldest, so a runaway queue cannot grow without bound.
void watch(const char* what, ncclComm_t comm, int device, const c10::cuda::CUDAStream& stream);

// Wait on the host until every watched call is done (before the communicators are destroyed).
void drain_watched();

}  // namespace fluxmpi::nccl
