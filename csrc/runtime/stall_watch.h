// Stall reports and the job timeout. When this rank has waited in one collective longer than
// the stall warning, its watchdog thread asks every rank what it is doing, over the control
// communicator with nonblocking point-to-point messages (never through the stalled
// collective, and over whatever transport MPI uses between hosts). Each rank's watchdog
// answers with its collective counts and its Python stack (taken by a Python thread, as
// faulthandler does). The lowest waiting rank prints the report, again at doubling waits;
// after the timeout every rank that still answers prints it as its error and the job ends.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/call_status.h"

namespace fluxmpi {

// Seconds; zero or less disables. Process-wide; Init(stall_warning=, timeout=) sets them.
void set_stall_settings(double warning_s, double timeout_s);
double stall_warning_s();
double stall_timeout_s();

// The Python stack bridge. A Python thread loops on wait_stack_request() (the GIL released)
// and answers each request with post_stack(); wait_stack_request returns false once
// stop_stack_requests() ran (at shutdown).
bool wait_stack_request();
void post_stack(std::string stack, std::string site);
void stop_stack_requests();

// Forget rounds and settings' progress (at init, for a world of `size` ranks).
void reset_stall_watch(int size);

// Every rank's host name, by rank (gathered at init): reports name the host of silent ranks.
void set_rank_hosts(std::vector<std::string> hosts);

// What launched the job, for the reports' first lines ("Slurm job 42, step 0"; "" for none).
void set_job_label(std::string label);

struct StallAction {
  double next_tick_s = 1.0;  // when the watchdog should call stall_tick again
  bool abort = false;        // abort the job, printing abort_why first (when non-empty)
  std::string abort_why;
};

// One step of the protocol, on the watchdog thread only (no lock held): answer requests from
// other ranks, read abort notices, and when `me` has waited too long, run a round of
// requests and print its report (or, past the timeout, return it as the reason to abort).
StallAction stall_tick(const CallStatus& me, MPI_Comm control, int rank, int size);

// Before the control communicator is freed: give up on messages still in flight.
void drop_stall_messages();

}  // namespace fluxmpi
