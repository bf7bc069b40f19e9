// Making sub-groups (runtime/group.h): a collective over the world that agrees on the ranks,
// splits the world's communicator and gives the members an MPI backend of their own.
#pragma once

#include <memory>
#include <vector>

#include "runtime/group.h"

namespace fluxmpi {

// A collective over the world: every rank calls it with the same list (order does not matter;
// ranks are sorted), in the same order as its other make_group calls. The lists are agreed
// first: different lists raise a RuntimeError on every rank naming each rank's list; an empty
// list, a rank twice or out of range a ValueError on every rank. Members get a new
// communicator (MPI_Comm_split of env().comm) and their own MPI backend; non-members get a
// Group that answers about its ranks and raises on use.
std::shared_ptr<const Group> make_group(std::vector<int> world_ranks);

}  // namespace fluxmpi
