// Which collective calls this rank is in (BlockingCall, counted per group), the watchdog
// thread that reads them for stall reports (runtime/stall_watch.h), and the exit notices that
// end a job whose rank left while another waits in a call it can never join.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi {

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

// What the watch needs of the job; init() (runtime/environment.cpp) fills it in.
struct WatchedJob {
  MPI_Comm control = MPI_COMM_NULL;  // exit notices and the stall protocol, never data
  int rank = 0;
  int size = 1;
  bool watchdog = false;  // a thread of its own may call MPI (MPI_THREAD_MULTIPLE)
  // Ends the job with a message (abort_job); never returns.
  void (*abort)(const std::string& why, int code) = nullptr;
};

// For init() and shutdown() only. start_call_watch: zero the counts for `job`'s ranks and start
// the watchdog thread where it can run (more than one rank and `job.watchdog`).
// stop_call_watch: stop it.
void start_call_watch(const WatchedJob& job);
void stop_call_watch();

// Tell every rank that this one is leaving (with the number of calls it completed, per group),
// then wait for every rank's notice: after that no rank can still be inside one of our
// collectives, so MPI_Finalize cannot block on a straggler. More than one rank only.
void exchange_exit_notices();

}  // namespace fluxmpi
