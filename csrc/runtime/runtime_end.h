// Ending a lost rank's process through the launcher's runtime (PMIx job control), for a rank
// that hangs alone on its host under plain mpiexec: no survivor shares its host to end it
// (runtime/fault_tolerance.cpp), and without fluxmpi_py.run no launcher is told
// (runtime/launcher_notice.h), so mpiexec would wait for it after the survivors exit. Open MPI
// 5's runtime (PRRTE) ends one process of a job when a process of that job asks
// (PMIX_JOB_CTRL_KILL): its daemon on the rank's host signals it.
//
// PMIx is reached through the library Open MPI already loaded (libpmix.so.2, looked up, never
// loaded here): there is no PMIx header or link at build time, and under an MPI without it
// (Open MPI 4's embedded PMIx, MPICH) nothing is asked.
#pragma once

#include <cstdint>
#include <string>

namespace fluxmpi {

// This process's place in the launcher's runtime: PMIx's namespace (the job) as a hash, and its
// rank there; {0, -1} when not started by a PMIx launcher.
struct RuntimeName {
  std::int64_t job = 0;
  std::int64_t rank = -1;
};
RuntimeName runtime_name();

// Ask the runtime to end process `rank` of this process's job (a request that returns at once;
// the daemon on that host ends it). An empty string when asked, else why not.
std::string ask_runtime_to_end(std::int64_t rank);

}  // namespace fluxmpi
