// Making sub-groups (runtime/group.h): agree on the ranks, make the members' communicator and
// give the members an MPI backend of their own. Ranks in a group follow the order of its list
// (sorted unless the caller keeps its order). Each group's index is the largest
// next_call_group_index() among the ranks that make it, so that its members agree on it.
#pragma once

#include <memory>
#include <vector>

#include "runtime/group.h"

namespace fluxmpi {

// A collective over the world: every rank calls it with the same list, in the same order as
// its other make_group calls (`sort`: the order of the list does not matter; else ranks in the
// group follow it, and every rank must give that order). The lists are agreed first:
// different lists raise a RuntimeError on every rank naming each rank's list; an empty list, a
// rank twice or out of range a ValueError on every rank. Members get a new communicator
// (MPI_Comm_split of env().comm) and their own MPI backend; non-members get a Group that
// answers about its ranks and raises on use.
std::shared_ptr<const Group> make_group(std::vector<int> world_ranks, bool sort = true);

// The same made by the members alone (torch's use_local_synchronization): only the ranks in
// the list call it, and nothing is asked of the others. Members first send their list to
// every rank they name, and to every rank a list they receive names, then compare: a list
// that differs from this rank's raises a RuntimeError on every rank that took part, naming
// each rank's list; then MPI_Comm_create_group over the members. A rank named that never
// calls leaves the others waiting: after `timeout_s` seconds they raise a RuntimeError naming
// the ranks that did not answer (the job is out of step then).
std::shared_ptr<const Group> make_local_group(std::vector<int> world_ranks, bool sort,
                                              double timeout_s);

}  // namespace fluxmpi
