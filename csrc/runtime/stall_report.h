// The words of a stall report (runtime/stall_watch.h runs the rounds that gather them): which
// ranks have not entered the call, which wait in it, which are done with it or silent, what
// each is doing with its Python stack, and which hosts answer not at all.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/stall_answer.h"

namespace fluxmpi {

// A closed round as this rank sees it, about its own call in flight (`mine`): the members of
// its group, each by its count of calls on that group.
struct StallView {
  const Answer& mine;
  const std::vector<std::optional<Answer>>& answers;  // by rank; empty where none came
  int rank = 0;
  int size = 0;
  bool timed_out = false;  // the timeout's round: the job is aborted after it
  const std::vector<std::string>* hosts = nullptr;  // every rank's host, by rank (may be empty)
  std::string job_label;                            // "Slurm job 42, step 0", or ""
  double reply_wait_s = 0;                          // how long the round waited for answers
  double stack_wait_s = 0;                          // and a rank for its Python stack
  double timeout_s = 0;                             // the job's timeout (0: none)
  double next_report_s = 0;  // the wait of this report; the next comes at twice it
};

// The report's text; `lowest_waiting` tells whether this rank is the lowest one that waits in
// the call (that one prints it).
std::string build_report(const StallView& v, bool* lowest_waiting);

}  // namespace fluxmpi
