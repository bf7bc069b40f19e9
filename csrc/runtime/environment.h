// The MPI environment: initialize MPI (or adopt a communicator), node-local rank, shutdown
// and aborting the job. Which collectives this rank is in, and the exit protocol that keeps a
// finished rank from blocking in MPI_Finalize while others wait: runtime/call_watch.h.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fluxmpi {

struct Environment {
  MPI_Comm comm = MPI_COMM_NULL;     // the job's communicator (our own dup): all data traffic
  MPI_Comm control = MPI_COMM_NULL;  // a second dup for exit notices, never blocked on data
  int rank = 0;
  int size = 1;
  int node_rank = 0;  // rank among the ranks on this node (MPI_Comm_split_type SHARED)
  int node_size = 1;
  int thread_level = MPI_THREAD_SINGLE;
  bool we_initialized_mpi = false;
};

// True once init() has run and shutdown() has not.
bool initialized();

// The environment; throws a c10::Error telling the user to call fluxmpi_py.Init() first.
const Environment& env();

// Initialize MPI if nobody has (asking for MPI_THREAD_MULTIPLE) and adopt `comm_handle`
// (an MPI_Comm cast to an integer, as mpi4py's MPI._handleof returns; 0 means COMM_WORLD).
// Idempotent for the same communicator.
void init(std::intptr_t comm_handle);

// Called at interpreter exit: tell every rank this one is leaving, wait until all have said
// the same, free our communicators and finalize MPI if we initialized it. A rank blocked in a
// collective sees the notice through its watchdog and aborts the job instead of hanging.
void shutdown();

// Run `hook` in every later shutdown() on every rank, after the exit handshake (all ranks are
// there, none is inside a collective) and before the communicators are freed and MPI is
// finalized; hooks run in reverse order of registration. A backend that holds collective
// resources (the NCCL communicators) registers their teardown here, so that the runtime never
// calls up into a backend.
void add_shutdown_hook(std::function<void()> hook);

// Print `why` prefixed with the rank to stderr (nothing when it is empty), write the flight
// recorder's dump where a directory is named (runtime/flight.h), and abort every rank of the
// job.
[[noreturn]] void abort_job(const std::string& why, int code = 1);

// A meeting point for ranks that report one error together: returns true once every rank has
// called it, false after `timeout_s` seconds or where it cannot run (one rank, or MPI below
// MPI_THREAD_MULTIPLE). The rank that reports the error aborts the job only after the others
// have written their line (fluxmpi_py/_excepthooks.py). A nonblocking barrier on the control
// communicator, polled every 5 ms.
bool meet_before_abort(double timeout_s);

// Vendor and version string of the MPI library (MPI_Get_library_version, first line).
std::string mpi_library_version();

// Version of the MPI standard the library implements, "major.minor" (MPI_Get_version).
std::string mpi_standard_version();

}  // namespace fluxmpi
