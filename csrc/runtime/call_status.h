// What one rank is doing, as its watchdog reports it in a stall report's round
// (runtime/stall_watch.h, runtime/stall_answer.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi {

// What one rank is doing, as its watchdog sees it (filled by runtime/environment.cpp). Calls
// are numbered per group: the world's calls, and each group's (runtime/group.h; a group's
// index is the same on every rank), so that a rank's progress on the stalled call's group is
// told apart from its calls elsewhere.
struct CallStatus {
  int group = 0;            // the group of the call in flight, or of the last one (0: the world)
  std::int64_t number = 0;  // that call's number among its group's calls, from 1 (0: none yet)
  bool active = false;      // inside that call
  double for_s = 0;         // seconds inside that call, or since the last call returned
  std::vector<std::int64_t> counts;  // calls entered so far on each group, by index (0: world)
  std::vector<int> members;          // the world ranks of `group` (empty for the world)
  std::string kind;    // of the active call, or of the last one completed: "allreduce"
  std::string call;    // the user call it belongs to ("DistributedOptimizer.step()"), or ""
  std::string detail;  // the engine work's label ("gradient bucket 2 of 5: fc.weight"), or ""
};

}  // namespace fluxmpi
