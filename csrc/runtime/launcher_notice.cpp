#include "runtime/launcher_notice.h"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <thread>

#include "runtime/flight.h"

namespace fluxmpi {
namespace {

std::atomic<int> g_fd{-1};
std::atomic<bool> g_watching{false};

void write_all(int fd, const std::string& text) {
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
      pollfd p{fd, POLLOUT, 0};
      (void)::poll(&p, 1, 100);  // the launcher's line is non-blocking: wait for room
    } else {
      return;
    }
  }
}

[[noreturn]] void end_excluded(const std::string& prefix) {
  const std::string why =
      "fluxmpi_py: the other ranks excluded this rank and went on without it (Open MPI's "
      "failure detector declared it failed: it was silent past mpi_ft_detector_timeout, "
      "stopped or hung); the launcher told it so. It ends now (exit status " +
      std::to_string(kExcludedStatus) + ")";
  flight_dump("excluded", why.c_str());
  write_all(STDERR_FILENO, prefix + why + "\n");
  ::_exit(kExcludedStatus);
}

void listen(int fd, std::string prefix) {
  std::string buffer;
  char chunk[256];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // the launcher is gone: nothing more will come
    buffer.append(chunk, static_cast<std::size_t>(n));
    for (std::size_t end; (end = buffer.find('\n')) != std::string::npos;) {
      const std::string line = buffer.substr(0, end);
      buffer.erase(0, end + 1);
      if (line == "excluded") end_excluded(prefix);
    }
  }
}

}  // namespace

void watch_launcher_line(int fd, std::string prefix) {
  if (fd < 0 || g_watching.exchange(true)) return;
  g_fd.store(fd);
  std::thread(listen, fd, std::move(prefix)).detach();
}

void tell_launcher_excluded(std::int64_t pid, std::int64_t start) {
  const int fd = g_fd.load();
  if (fd < 0) return;
  write_all(fd, "excluded " + std::to_string(pid) + " " + std::to_string(start) + "\n");
}

}  // namespace fluxmpi
