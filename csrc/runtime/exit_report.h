// A rank's exit status, told to the launcher (fluxmpi_py/run.py) on its connection
// (fluxmpi_py/runtime/launcher_link.py) as the process ends: one line "exit N\n".
//
// Python has no hook that sees the status its process exits with: atexit runs before it is
// final, and no call returns it. glibc's on_exit does: its handlers run inside exit(status),
// after the interpreter has finished, with that status. A process ended by a signal, by
// _exit (os._exit, a forked DataLoader worker) or by MPI_Abort runs none and says nothing; the
// launcher then knows only that the connection ended, as before.
#pragma once

namespace fluxmpi {

// Write "exit N\n" to descriptor `fd` when this process (not a child forked from it) calls
// exit(N). The last call wins; a negative `fd` turns it off.
void report_exit_status_to(int fd);

}  // namespace fluxmpi
