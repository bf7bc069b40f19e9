// Sub-groups: a subset of the job's ranks with its own communicator and MPI backend, so that
// collectives can run among the members while the other ranks do something else.
//
// How group calls are watched (runtime/call_watch.h, BlockingCall): every group has an
// index, the same on each of its members (they agree on it when they make it), never reused
// on a rank. A collective on a group counts in that group's own call count, not in the world's,
// so the world counts stay equal on every rank whatever groups a rank is in. A rank's exit
// notice carries its world count and its count for every group; a member waiting in a group
// call aborts the job when another member has left after completing no more calls on that
// group than this one (it can never join). Stall reports and the timeout still cover group
// calls; their call numbers are world counts, and the kind names the group.
//
// The ops layer works on the *current* group of its thread: the world unless a GroupScope is
// active. Engine work runs in the group that was current where it was submitted. Groups other
// than the world are made by make_group or make_local_group (ops/new_group.h); the backend layer
// registers the world's MPI backend here (set_world_backend), as layers below cannot name it.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace fluxmpi {

class Backend;

class Group {
 public:
  // Ranks of the world that are members, in the group's order (ascending unless made with
  // sort off); the rank in the group is the index here.
  const std::vector<int>& world_ranks() const;
  // This process's rank in the group, or -1 when it is not a member.
  int rank() const;
  int size() const;
  bool is_member() const { return rank() >= 0; }
  bool is_world() const { return index_ == 0; }
  // The same on every member: 0 for the world, then increasing in the order groups are made.
  int index() const { return index_; }
  // The group's communicator (MPI_COMM_NULL on non-members).
  MPI_Comm comm() const;
  // The MPI backend (host memory) bound to the group's communicator; a ValueError on a
  // non-member, naming its rank and the group's ranks.
  Backend& backend() const;
  // "[0, 2]"; "world" for the world.
  std::string describe() const;
  // The ValueError a non-member raises when it calls `call` with this group (a no-op on
  // members): raised on this rank alone, before any communication.
  void check_member(const std::string& call) const;
  // The RuntimeError a group made before the world shrank (the shrink mode's recover()) raises
  // when used: its ranks and communicator are the old world's. The same on every rank of the
  // new world (each lived through the same recoveries); a no-op for the world and fresh groups.
  void check_fresh() const;

  // `backend` is null for the world (the registered one serves) and on non-members.
  Group(int index, std::vector<int> world_ranks, int rank, MPI_Comm comm,
        std::shared_ptr<Backend> backend);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

 private:
  int index_;
  std::vector<int> world_ranks_;  // empty for the world (env() knows its size)
  int rank_;
  MPI_Comm comm_;
  std::shared_ptr<Backend> backend_;
  int made_in_world_;  // world_changes() when it was made
};

// The group of every rank, on env().comm (throws "call Init first" before Init).
const std::shared_ptr<const Group>& world_group();

// Called once by the backend layer while the library loads: the world's MPI backend.
void set_world_backend(Backend& (*world_backend)());

// The group the ops layer on this thread works on: world_group() unless a GroupScope is active.
const Group& current_group();
const std::shared_ptr<const Group>& current_group_ptr();

// Make `g` current on this thread while in scope (null: no change).
class GroupScope {
 public:
  explicit GroupScope(std::shared_ptr<const Group> g);
  ~GroupScope();
  GroupScope(const GroupScope&) = delete;
  GroupScope& operator=(const GroupScope&) = delete;

 private:
  std::shared_ptr<const Group> previous_;
  bool set_ = false;
};

// The group a GroupScope made current on this thread, or null (the world); never throws.
const std::shared_ptr<const Group>& scoped_group();

// For Python: set the thread's current group (null: the world); returns the previous one.
std::shared_ptr<const Group> exchange_current_group(std::shared_ptr<const Group> g);

}  // namespace fluxmpi
