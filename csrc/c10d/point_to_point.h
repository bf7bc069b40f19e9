// torch.distributed's send / recv / recv-from-any-source for the fluxmpi backend: nonblocking
// MPI point-to-point on a communicator of their own (a duplicate of the group's), so that no
// message of the user can match one of our collectives' internal messages. Point-to-point
// calls are not collectives (only two ranks take part), so they stay outside the BlockingCall
// count; they are started and polled under the engine (Engine::run_inline), which keeps MPI
// calls serialized where MPI allows no more, and never holds the engine while waiting. So a
// send or recv starts after the collectives queued before it on this rank, as on NCCL.
#pragma once

#include <ATen/core/Tensor.h>
#include <mpi.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "runtime/group.h"

namespace fluxmpi {

// recv's source when any rank may send.
constexpr int kAnySource = -1;

// The point-to-point communicator of group `g` (a duplicate of the group's communicator, so
// peers are ranks in the group): made the first time, a collective over g's members (every
// member asks at the same point, when the group's backend is made); later calls return it.
MPI_Comm ensure_p2p_comm(const Group& g);

// Start sending `t` to rank `dst` of `comm` (this process is `rank` of `size` there) with
// `tag`; the Work completes when `t` may be reused.
c10::intrusive_ptr<c10d::Work> start_send(MPI_Comm comm, int rank, int size, const at::Tensor& t,
                                          int dst, int tag);
// Start receiving into `t` from rank `src` of `comm` (or kAnySource) with `tag`; the Work's
// sourceRank() names the sender (a rank of `comm`) once it completed.
c10::intrusive_ptr<c10d::Work> start_recv(MPI_Comm comm, int rank, int size, const at::Tensor& t,
                                          int src, int tag);

}  // namespace fluxmpi
