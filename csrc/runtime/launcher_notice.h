// What passes on a rank's line to the launcher (fluxmpi_py/run.py,
// fluxmpi_py/runtime/launcher_link.py) while the job runs, in the shrink mode: the survivors of a
// loss tell it which processes they excluded ("excluded PID START\n"), and a rank hears that it
// was excluded itself ("excluded\n"). The exit status is told apart (runtime/exit_report.h).
//
// A rank that hangs alone on its host (stopped, stuck) is declared failed by Open MPI's detector
// and excluded, but no survivor shares its host to end it (runtime/fault_tolerance.cpp). The
// launcher, told, ends it where it can; and a rank that still runs ends itself on hearing it:
// its listening thread needs neither the GIL nor MPI.
#pragma once

#include <cstdint>
#include <string>

namespace fluxmpi {

// The exit status of a rank that heard it was excluded.
constexpr int kExcludedStatus = 1;

// Listen on descriptor `fd` (the launcher's line) from a thread of its own: on "excluded", write
// `prefix` and why to stderr and end this process (_exit(kExcludedStatus), no MPI_Finalize). An
// end of stream ends the listening only. Later tells go to `fd`. Once per process.
void watch_launcher_line(int fd, std::string prefix);

// Tell the launcher (when watch_launcher_line was given a line) that the survivors excluded the
// process `pid` that started at `start` (clock ticks after boot, /proc/PID/stat).
void tell_launcher_excluded(std::int64_t pid, std::int64_t start);

}  // namespace fluxmpi
