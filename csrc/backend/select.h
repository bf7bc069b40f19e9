// Which backend moves a tensor: MPI for host memory, NCCL for CUDA memory when compiled in.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <optional>
#include <string>

#include "backend/backend.h"

namespace fluxmpi {

Backend& backend_for(const at::Tensor& t);

// True when this build can move tensors of this device type.
bool device_supported(const at::Tensor& t);

// Whether this build has the NCCL backend (compiled with FLUXMPI_WITH_CUDA).
bool compiled_with_cuda();

// Why CUDA tensors may not go to NCCL in this process, "" when they may. Init sets it when
// ranks of a node share a GPU, which NCCL refuses ("Duplicate GPU detected") inside its first
// collective; the checks before every collective raise it instead, on every rank together.
void set_cuda_refusal(std::string why);
std::string cuda_refusal();

// Whether CUDA tensors may go to a CUDA-aware MPI library directly (Init sets it from
// fluxmpi_py.cudampi_enabled(), i.e. disable_cudampi_support()); where not, the collectives
// NCCL lacks stage CUDA tensors through host memory. Default: allowed.
void set_cuda_mpi_allowed(bool on);
bool cuda_mpi_allowed();

// Whether CUDA tensors go over MPI instead of NCCL, for every collective: staged through pinned
// host buffers over the current group's MPI communicator (or straight to a CUDA-aware MPI for
// the collectives that only move bytes). Init sets it when ranks of a node share a GPU, which
// NCCL refuses, or when FLUXMPI_CUDA_OVER_MPI=1. Default: off (NCCL).
void set_cuda_over_mpi(bool on);
bool cuda_over_mpi();

// Whether NCCL calls run on a communication stream of their own per device (torch's pool, high
// priority; it waits, on the device, for the caller's stream first) instead of the caller's
// current stream, where backward's kernels would queue behind an NCCL kernel waiting for its
// peer. On by default; FLUXMPI_NCCL_COMM_STREAM=0 at Init turns it off.
void set_nccl_comm_stream(bool on);
bool nccl_comm_stream();

// Whether an NCCL call blocks the host until its kernel is done (the MPI backend's semantics)
// or returns once it is queued, as ProcessGroupNCCL does: the caller's current stream then
// waits for the call on the device, and a watchdog thread polls its completion for NCCL's
// asynchronous errors and the stall timeout (cuda/nccl_comm.h). Off by default (calls return
// once queued); FLUXMPI_NCCL_HOST_WAIT=1 at Init makes the host wait.
void set_nccl_host_wait(bool on);
bool nccl_host_wait();

// Whether a sub-group's CUDA collectives (group=) go through an NCCL communicator of its
// members (made on the group's first CUDA collective, collectively over its members) instead of
// MPI, staged through host memory. On by default (Init; run on an H200 at 2 ranks);
// FLUXMPI_NCCL_GROUPS=0 at Init turns it off.
void set_nccl_groups(bool on);
bool nccl_groups();

// The communication stream of `device` when nccl_comm_stream() is on and the device's
// collectives go to NCCL; otherwise none (the work runs on the thread's current stream). The
// engine thread makes it current around its CUDA work, so that the stream marks of
// ops/stream_order.h order the collective against its producer exactly.
std::optional<c10::Stream> comm_stream_of(c10::Device device);

// Version of the NCCL library loaded at run time, "major.minor.patch"; "" without CUDA.
std::string nccl_version();

// How a host thread waiting for the current CUDA device (torch.cuda.synchronize, .item(), a
// host wait of ours) uses its CPU: "spin", "yield", "blocking" (asleep until the device is
// done) or "auto" (CUDA's choice: spin unless there are more contexts than CPUs). It holds for
// the whole process's use of that device (cudaSetDeviceFlags; CUDA 12 and later change it on
// an active device too). Init applies FLUXMPI_CUDA_SCHEDULE: where each rank is bound to one
// core, a spinning thread takes that core from NCCL's proxy threads. Returns the schedule in
// force afterwards; "" for mode reads it without a change. A build without CUDA: "" for "",
// else an error.
std::string cuda_schedule(const std::string& mode);

// Test-only (scripts/gpu_kill_check.py --mode nccl-abort): abort this rank's NCCL
// communicators in place, as if its connections broke, so that its peers meet NCCL's
// asynchronous error. How many were aborted; 0 in a build without CUDA.
int abort_nccl_comms_for_test();

}  // namespace fluxmpi
