// The MPI environment: initialize MPI (or adopt a communicator), node-local rank, and the
// exit protocol that keeps a finished rank from blocking in MPI_Finalize while others wait.
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

// RAII marker around every blocking collective. Contract: one BlockingCall per collective on
// env().comm (or a communicator of the same ranks), entered by every rank in the same order,
// so that "calls completed" counts the same thing on every rank. A rank that leaves sends
// that count in its exit notice. Once a second the watchdog thread of a rank inside a call
// reads the notices: a rank that left before entering this call can never join it, so the
// job is aborted with a message naming it; a rank that left after finishing its part (a
// broadcast root returns early) is no reason to abort. Entering a call only takes an
// uncontended mutex; it never wakes another thread.
//
// A call on a sub-group (runtime/group.h) passes the group's index: it counts in that group's
// count instead (entered by the group's members only, in the same order), the exit notice
// carries every group's count, and the watchdog compares only the group's members.
// Several threads may be inside calls at once, on different groups (hvd.join() waits on the
// world and on each of its process sets, a thread each): the watchdog checks every one, and
// the stall report names the oldest and lists the others.
//
// Each call is also a record of the flight recorder (runtime/flight.h), with `bytes`, what
// this rank moves (-1 when not known), in any world size.
class BlockingCall {
 public:
  explicit BlockingCall(const char* what, int group = 0, std::int64_t bytes = -1);
  ~BlockingCall();
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;

 private:
  std::int64_t flight_ = 0;  // its record's handle
};

// Tell the watchdog about a new group with its world ranks and its label for messages
// ("[0, 2]"); returns its index: `index`, which its members agreed on, at least
// next_call_group_index() (the indices skipped stay unused on this rank).
int register_call_group(std::vector<int> world_ranks, std::string label, int index);

// The lowest index a group made now could take on this rank: members agree on the largest.
int next_call_group_index();

}  // namespace fluxmpi
