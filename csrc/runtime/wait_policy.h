// How a rank waits inside MPI. Open MPI busy-polls by default; while a gradient bucket is in
// flight on the engine thread, that polling takes the core from backward on a rank without a
// spare core. `mpi_yield_when_idle` makes Open MPI yield instead, but it is read when MPI
// starts (OMPI_MCA_mpi_yield_when_idle, which `import fluxmpi_py` sets), and its MPI_T control
// variable is read-only afterwards. So Init also switches it on at run time, through Open
// MPI's own exported setter, for the cases where MPI started before fluxmpi_py was imported
// (mpi4py imported first, Init(comm=...)).
//
// A yielding rank still shows a full core while it waits (sched_yield returns at once when
// nothing else wants the core), for as long as a late rank keeps it waiting: up to the job
// timeout. So a wait that lasts backs off to sleeping: once a thread has been inside one
// blocking collective (a BlockingCall, runtime/call_watch.h) for FLUXMPI_WAIT_BACKOFF's
// threshold (100 ms), each pass of Open MPI's progress loop on that thread naps, from 50 us
// doubling up to the cap (1 ms), through a progress callback registered with Open MPI. Short
// waits, and every other thread, keep yielding. Once the late rank arrives, the call finishes
// with naps between its progress passes: about 1 ms more on a small allreduce, nothing
// measurable on 16 MiB (benchmarks/bench_long_wait.py).
#pragma once

#include <chrono>

#include <string>

namespace fluxmpi {

// After MPI is initialized: make Open MPI yield when idle unless the user turned it off
// (OMPI_MCA_mpi_yield_when_idle=0), and set up the backoff for long waits unless
// FLUXMPI_WAIT_BACKOFF turns it off (ValueError on a malformed value). Returns what applies:
// "yield (set when MPI started)", "yield (set by fluxmpi_py.Init)",
// "poll (OMPI_MCA_mpi_yield_when_idle=0)", or "the MPI library's own (not Open MPI)",
// followed by "; past 100 ms, sleep (naps up to 1 ms)" or "; no sleep (FLUXMPI_WAIT_BACKOFF=off)"
// under Open MPI.
std::string apply_wait_policy();

// The last result of apply_wait_policy(), "" before it ran.
const std::string& wait_policy();

// The calling thread enters (at `since`, the caller's clock read: one per call) / leaves the
// outermost blocking collective: the backoff counts from there. Only thread-local stores;
// BlockingCall calls them.
void long_wait_enter(std::chrono::steady_clock::time_point since);
void long_wait_leave();

}  // namespace fluxmpi
