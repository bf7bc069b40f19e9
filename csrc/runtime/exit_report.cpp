#include "runtime/exit_report.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace fluxmpi {
namespace {

std::atomic<int> g_fd{-1};
std::atomic<pid_t> g_pid{0};  // the process that asked: a forked child inherits the handler
std::atomic<bool> g_registered{false};

void on_exit_handler(int status, void*) {
  const int fd = g_fd.load();
  if (fd < 0 || getpid() != g_pid.load()) return;
  char line[32];
  const int n = std::snprintf(line, sizeof line, "exit %d\n", status);
  if (n > 0) (void)!::write(fd, line, static_cast<size_t>(n));
}

}  // namespace

void report_exit_status_to(int fd) {
  g_pid.store(getpid());
  g_fd.store(fd);
  if (fd >= 0 && !g_registered.exchange(true)) ::on_exit(&on_exit_handler, nullptr);
}

}  // namespace fluxmpi
