// The NCCL backend for CUDA memory (compiled only when FLUXMPI_WITH_CUDA is defined; the code
// lives in csrc/cuda/). The contract of every Backend (flat contiguous buffers, calls made in
// the same order on all ranks), in stream order: a call returns once its work is queued, and
// any later work on the caller's current stream sees the data moved, so the ops layer and the
// engine treat it as the blocking MPI backend (FLUXMPI_NCCL_HOST_WAIT=1: the host waits too).
//
// Communicators: one per CUDA device, created on the first collective that touches a buffer on
// that device. Creating one is itself collective (rank 0's ncclUniqueId travels over MPI), so
// every rank must use its devices in the same order; in the usual setup each rank has exactly
// one device (fluxmpi_py.Init picks it) and this holds by construction.
#pragma once

#include <c10/core/Stream.h>

#include <string>

#include "backend/backend.h"

namespace fluxmpi {

// The NCCL backend of CUDA device `device`: every buffer passed to it lives on that device,
// which it makes current before any CUDA call.
Backend& nccl_backend(int device);

// What CUDA tensors of `device` take over MPI: on a group (group=, not the world), and
// everywhere when cuda_over_mpi() (ranks sharing a GPU): every collective staged through
// pinned host memory over the current group's MPI communicator (StagedBackend), as the CPU
// tests run it with a host copier. Slower than NCCL; it needs no NCCL communicator.
Backend& cuda_mpi_backend(int device);

// The communication stream of CUDA device `device` (torch's pool, high priority), made on first
// use; NCCL calls run on it when nccl_comm_stream() is on.
c10::Stream nccl_comm_stream_for(int device);

// Version of the NCCL library loaded at run time, "major.minor.patch". Needs no GPU.
std::string nccl_version_string();

// Destroy every NCCL communicator. Collective over the ranks that created them: call it on
// every rank while all ranks are still alive, before MPI is finalized. It is registered as a
// shutdown hook (runtime/environment.h), so shutdown() calls it after the exit handshake.
// Never called from a static destructor: at exit the communicators are left to the operating
// system instead, because by then MPI is finalized and the CUDA runtime may already be
// unloading. A later collective creates new ones.
void nccl_shutdown();

// Test-only: abort this rank's NCCL communicators in place (see nccl::abort_all_comms); how
// many were aborted.
int nccl_abort_all_for_test();

}  // namespace fluxmpi
