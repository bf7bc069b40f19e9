#include "runtime/wait_policy.h"

#include <dlfcn.h>
#include <strings.h>

#include <cstdlib>
#include <cstring>

namespace fluxmpi {
namespace {

std::string g_policy;

bool user_turned_yield_off() {
  const char* v = std::getenv("OMPI_MCA_mpi_yield_when_idle");
  if (v == nullptr) return false;
  return std::strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0 || strcasecmp(v, "no") == 0;
}

}  // namespace

std::string apply_wait_policy() {
  // bool opal_progress_set_yield_when_idle(bool): sets the flag the progress loop reads on
  // each idle pass and returns the previous value. Exported by Open MPI 1.x to 5.x.
  using Setter = bool (*)(bool);
  auto set = reinterpret_cast<Setter>(dlsym(RTLD_DEFAULT, "opal_progress_set_yield_when_idle"));
  if (set == nullptr) {
    g_policy = "the MPI library's own (not Open MPI)";
  } else if (user_turned_yield_off()) {
    g_policy = "poll (OMPI_MCA_mpi_yield_when_idle=0)";
  } else {
    g_policy = set(true) ? "yield (set when MPI started)" : "yield (set by fluxmpi_py.Init)";
  }
  return g_policy;
}

const std::string& wait_policy() { return g_policy; }

}  // namespace fluxmpi
