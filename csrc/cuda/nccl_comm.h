// NCCL communicators (one per CUDA device, created lazily and collectively) and the host-side
// wait that gives NCCL calls the blocking semantics of the MPI backend.
#pragma once

#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include "runtime/group.h"

namespace fluxmpi::nccl {

// The communicator of `group`'s members on `device`, created on first use. Collective over the
// group's members when it creates: the group's rank 0 makes an ncclUniqueId and broadcasts it
// over the group's MPI communicator, then every member joins ncclCommInitRank. The world is
// group 0; a sub-group has one only with nccl_groups() on (backend/select.h).
ncclComm_t comm_for(int device, const Group& group);

// Destroy every communicator (see nccl_shutdown in backend/nccl_backend.h).
void destroy_all_comms();

// Abort every communicator of this rank (ncclCommAbort: local, waits for no peer) and forget
// them; how many. Test-only: the peers then meet NCCL's asynchronous error, as when a rank's
// connections break (scripts/gpu_kill_check.py --mode nccl-abort).
int abort_all_comms();

// Block the host until everything enqueued so far on `stream` has completed, inside a
// BlockingCall named `what` (so a peer that exits ends the job instead of hanging it). While
// waiting, NCCL's asynchronous errors on `comm` are polled: on one, the communicator is
// aborted and the job ends with the error (abort_job), as in torch's NCCL async error handling.
// `group`: the index of the group the call is on (its BlockingCall counts there).
void wait_for(const char* what, ncclComm_t comm, int device, const c10::cuda::CUDAStream& stream,
              int group = 0);

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
