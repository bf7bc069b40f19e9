#include "runtime/wait_policy.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <mpi.h>
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

namespace fluxmpi {
namespace {

using Clock = std::chrono::steady_clock;
using Micros = std::chrono::microseconds;

std::string g_policy;

// The backoff's settings: read by every progress pass of every thread, written at Init.
std::atomic<bool> g_backoff_on{false};
std::atomic<std::int64_t> g_backoff_after_us{100000};
std::atomic<std::int64_t> g_backoff_cap_us{1000};
constexpr std::int64_t kFirstNapUs = 50;

thread_local bool t_waiting = false;
thread_local Clock::time_point t_since;
thread_local std::int64_t t_nap_us = kFirstNapUs;

// Called by Open MPI on each pass of its progress loop (opal_progress), on the thread that
// runs it; returns the events it completed (none).
int nap_if_waiting_long() {
  if (!t_waiting || !g_backoff_on.load(std::memory_order_relaxed)) return 0;
  const auto waited = std::chrono::duration_cast<Micros>(Clock::now() - t_since).count();
  if (waited < g_backoff_after_us.load(std::memory_order_relaxed)) return 0;
  std::this_thread::sleep_for(Micros(t_nap_us));
  t_nap_us = std::min(t_nap_us * 2, g_backoff_cap_us.load(std::memory_order_relaxed));
  return 0;
}

bool user_turned_yield_off() {
  const char* v = std::getenv("OMPI_MCA_mpi_yield_when_idle");
  if (v == nullptr) return false;
  return std::strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0 || strcasecmp(v, "no") == 0;
}

// A number of milliseconds >= 0 from `s`; false when it is not one.
bool parse_ms(const std::string& s, double* ms) {
  if (s.empty()) return false;
  char* end = nullptr;
  *ms = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*ms) && *ms >= 0;
}

// FLUXMPI_WAIT_BACKOFF: "off" (or "0", "none", "no"), "AFTER_MS", or "AFTER_MS:CAP_MS".
// Returns whether the backoff is on; sets the atomics.
bool read_backoff_setting() {
  const char* v = std::getenv("FLUXMPI_WAIT_BACKOFF");
  const std::string s = v == nullptr ? "" : v;
  if (strcasecmp(s.c_str(), "off") == 0 || strcasecmp(s.c_str(), "none") == 0 ||
      strcasecmp(s.c_str(), "no") == 0 || s == "0") {
    return false;
  }
  double after_ms = 100, cap_ms = 1;
  if (!s.empty()) {
    const auto colon = s.find(':');
    const bool ok = parse_ms(s.substr(0, colon), &after_ms) &&
                    (colon == std::string::npos || parse_ms(s.substr(colon + 1), &cap_ms));
    TORCH_CHECK_VALUE(ok && cap_ms > 0,
                      "fluxmpi_py: FLUXMPI_WAIT_BACKOFF must be 'off', a wait in ms after which "
                      "to sleep (100), or that and the longest nap in ms > 0 (100:1), got '",
                      s, "'");
  }
  g_backoff_after_us = static_cast<std::int64_t>(after_ms * 1000);
  g_backoff_cap_us = std::max<std::int64_t>(1, static_cast<std::int64_t>(cap_ms * 1000));
  return true;
}

std::string ms_text(std::int64_t us) {
  std::ostringstream o;
  o << static_cast<double>(us) / 1000 << " ms";
  return o.str();
}

// A symbol of the MPI library or of a library it loaded (Open MPI's libopen-pal), nullptr when
// there is none. Not through RTLD_DEFAULT alone: the extension is loaded without RTLD_GLOBAL,
// and only Open MPI 4 opens its library again into the global scope, so under Open MPI 5 its
// symbols are found through a handle on the library that defines MPI_Init (dlsym on a handle
// searches that library's dependencies too).
void* mpi_symbol(const char* name) {
  if (void* p = dlsym(RTLD_DEFAULT, name)) return p;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&MPI_Init), &info) == 0 || info.dli_fname == nullptr) {
    return nullptr;
  }
  void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  void* p = dlsym(lib, name);
  dlclose(lib);  // RTLD_NOLOAD took a reference to a library that stays loaded
  return p;
}

}  // namespace

std::string apply_wait_policy() {
  // bool opal_progress_set_yield_when_idle(bool): sets the flag the progress loop reads on
  // each idle pass and returns the previous value. Exported by Open MPI 1.x to 5.x.
  using Setter = bool (*)(bool);
  auto set = reinterpret_cast<Setter>(mpi_symbol("opal_progress_set_yield_when_idle"));
  // int opal_progress_register(int (*)(void)): adds a callback that each progress pass calls.
  using Register = int (*)(int (*)());
  auto add = reinterpret_cast<Register>(mpi_symbol("opal_progress_register"));
  if (set == nullptr) {
    g_policy = "the MPI library's own (not Open MPI)";
    return g_policy;
  }
  const bool backoff = read_backoff_setting();
  if (user_turned_yield_off()) {
    g_policy = "poll (OMPI_MCA_mpi_yield_when_idle=0)";
  } else {
    g_policy = set(true) ? "yield (set when MPI started)" : "yield (set by fluxmpi_py.Init)";
  }
  static bool registered = false;
  if (backoff && !registered && add != nullptr) registered = add(&nap_if_waiting_long) == 0;
  g_backoff_on = backoff && registered;
  if (g_backoff_on) {
    g_policy += "; past " + ms_text(g_backoff_after_us) + ", sleep (naps up to " +
                ms_text(g_backoff_cap_us) + ")";
  } else {
    g_policy += backoff ? "; no sleep (no opal_progress_register)"
                        : "; no sleep (FLUXMPI_WAIT_BACKOFF=off)";
  }
  return g_policy;
}

const std::string& wait_policy() { return g_policy; }

void long_wait_enter(Clock::time_point since) {
  t_waiting = true;
  t_since = since;
  t_nap_us = kFirstNapUs;
}

void long_wait_leave() { t_waiting = false; }

}  // namespace fluxmpi
