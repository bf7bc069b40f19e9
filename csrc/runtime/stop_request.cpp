#include "runtime/stop_request.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace fluxmpi {
namespace {

constexpr int kMaxSignal = 65;
std::atomic<bool> g_here{false};
std::atomic<bool> g_agreed{false};
std::atomic<std::int64_t> g_agreed_at{-1};
std::atomic<std::int64_t> g_agreements{0};  // world agreements seen by note_stop_lane
std::atomic<bool> g_armed{false};
std::atomic<pid_t> g_installer{0};  // the rank's process; others are forked from it
struct sigaction g_old[kMaxSignal];
bool g_installed[kMaxSignal] = {};

// The old action of `sig`, as if this handler were not there.
void chain(int sig, siginfo_t* info, void* context) {
  struct sigaction& old = g_old[sig];
  if ((old.sa_flags & SA_SIGINFO) != 0) {
    if (old.sa_sigaction != nullptr) old.sa_sigaction(sig, info, context);
  } else if (old.sa_handler == SIG_DFL) {
    sigaction(sig, &old, nullptr);  // the default action (the process ends), raised again
    raise(sig);
  } else if (old.sa_handler != SIG_IGN) {
    old.sa_handler(sig);
  }
}

void on_signal(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  if (getpid() != g_installer.load()) {
    // A process forked from the rank (a DataLoader worker): Slurm signals every process of
    // the step, and the warning is the rank's business, not a reason for this one to end;
    // SIGTERM keeps its old action (multiprocessing's terminate() must still end a worker).
    if (sig != SIGUSR1) chain(sig, info, context);
    errno = saved;
    return;
  }
  const bool again = (sig == SIGTERM || sig == SIGINT) && g_here.load();
  if (g_armed.load() && !again) {
    g_here.store(true);
  } else {
    chain(sig, info, context);
  }
  errno = saved;
}

}  // namespace

void request_stop() noexcept { g_here.store(true); }
bool stop_requested_here() noexcept { return g_here.load(); }

std::int64_t stop_lane() noexcept { return g_here.load() ? 1 : 0; }

void note_stop_lane(std::int64_t agreed) noexcept {
  const std::int64_t n = g_agreements.fetch_add(1) + 1;
  if (agreed != 0 && !g_agreed.load()) {
    g_agreed_at.store(n);
    g_agreed.store(true);
  }
}

bool stop_agreed() noexcept { return g_agreed.load(); }
std::int64_t stop_agreed_at() noexcept { return g_agreed_at.load(); }

void install_stop_signals(const std::vector<int>& signals) {
  g_installer.store(getpid());
  for (int sig : signals) {
    if (sig <= 0 || sig >= kMaxSignal || g_installed[sig]) continue;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sig, &sa, &g_old[sig]) == 0) g_installed[sig] = true;
  }
}

void arm_stop_signals(bool armed) noexcept { g_armed.store(armed); }
bool stop_signals_armed() noexcept { return g_armed.load(); }

void clear_stop() noexcept {
  g_here.store(false);
  g_agreed.store(false);
  g_agreed_at.store(-1);
}

}  // namespace fluxmpi
