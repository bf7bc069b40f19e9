// torch.distributed's send / recv / recv-from-any-source for the fluxmpi backend: nonblocking
// MPI point-to-point on a communicator of their own (a duplicate of fluxmpi's), so that no
// message of the user can match one of our collectives' internal messages. Point-to-point
// calls are not collectives (only two ranks take part), so they stay outside the BlockingCall
// count; they are started and polled under the engine (Engine::run_inline), which keeps MPI
// calls serialized where MPI allows no more, and never holds the engine while waiting. So a
// send or recv starts after the collectives queued before it on this rank, as on NCCL.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fluxmpi {

// recv's source when any rank may send.
constexpr int kAnySource = -1;

// Create the point-to-point communicator (a collective over fluxmpi's world: every rank calls
// it at the same point, when the backend is made). Later calls do nothing.
void ensure_p2p_comm();

// Start sending `t` to rank `dst` with `tag`; the Work completes when `t` may be reused.
c10::intrusive_ptr<c10d::Work> start_send(const at::Tensor& t, int dst, int tag);
// Start receiving into `t` from rank `src` (or kAnySource) with `tag`; the Work's
// sourceRank() names the sender once it completed.
c10::intrusive_ptr<c10d::Work> start_recv(const at::Tensor& t, int src, int tag);

}  // namespace fluxmpi
