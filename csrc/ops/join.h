// Joins (fluxmpi_py.Join, hvd.join()): a rank that ran out of data waits in join_wait, taking
// part in each agreement of the ranks still active (on the world; with hvd.join() also on
// each process set it is in) with a mark (ops/consensus.h) instead of a signature. That costs
// the active ranks nothing while no rank has joined; once one has, their allreduces
// (Joinable::Allreduce) tell it what they move and it reduces zeros with them (hvd.join() only),
// their join rounds count it out, and anything else raises on every rank.
#pragma once

#include <cstdint>

namespace fluxmpi {

// An active rank's round before a step of the join's optimizer `index` (a collective on the
// current group): how many ranks are active (the group's size, with no data moved, while no
// rank has joined) and whether every active rank gave the same index.
struct JoinRound {
  std::int64_t count = 0;
  bool same_index = true;
};
JoinRound join_round(std::int64_t index);

// What ended a joined rank's wait: a round of the active ranks (count > 0: then the caller
// shadows that optimizer's step and waits again), or every rank joined (count 0).
struct JoinEvent {
  std::int64_t count = 0;       // active ranks in the round; 0: every rank has joined
  std::int64_t index = -1;      // the optimizer the round steps
  bool same_index = true;       // false: the active ranks stepped different ones (they raise)
  std::int64_t last_rank = -1;  // when every rank has joined: the last one to join
};

// This rank has joined: wait on the current group (the world, or a process set this rank is
// in: hvd.join() waits in each of them on a thread of its own, the world on the caller's)
// until its active members start a round or every member has joined. Meanwhile it reduces
// zeros with their allreduces, unless `rigid` (fluxmpi_py.Join: rounds only, on the world).
// The calls it cannot take part in raise on the active ranks; here they raise too when
// `rigid`, else it keeps waiting. `first`: the first call of this join on the world (it marks
// when this rank joined: the last rank to join is the one that joined at the latest world
// agreement, the highest such rank on a tie; `last_rank` is -1 on a process set).
JoinEvent join_wait(bool rigid, bool first);

}  // namespace fluxmpi
