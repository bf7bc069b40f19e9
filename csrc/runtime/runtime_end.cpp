#include "runtime/runtime_end.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>

namespace fluxmpi {

namespace {

// PMIx's types as its standard fixes them (pmix_common.h): a process name, and one directive of
// the bool type. The value's union is given more room than PMIx's largest member; only one
// directive is passed, so nothing strides over the difference.
constexpr std::size_t kNamespaceBytes = 256;  // PMIX_MAX_NSLEN + 1
constexpr std::size_t kKeyBytes = 512;        // PMIX_MAX_KEYLEN + 1
constexpr std::uint16_t kPmixBool = 1;        // PMIX_BOOL
constexpr int kPmixSuccess = 0;
constexpr int kPmixOperationSucceeded = -157;   // done at once: no answer follows
constexpr char kKillKey[] = "pmix.jctrl.kill";  // PMIX_JOB_CTRL_KILL

struct PmixProc {
  char nspace[kNamespaceBytes];
  std::uint32_t rank;
};

struct alignas(8) PmixValue {
  std::uint16_t type;
  union alignas(8) {
    bool flag;
    char room[64];
  } data;
};

struct PmixInfo {
  char key[kKeyBytes];
  std::uint32_t flags;
  PmixValue value;
};

using ReleaseFn = void (*)(void*);
using InfoCallback = void (*)(int, PmixInfo*, std::size_t, void*, ReleaseFn, void*);
using JobControlNb = int (*)(const PmixProc*, std::size_t, const PmixInfo*, std::size_t,
                             InfoCallback, void*);

// A request's target and directive live until the runtime has answered.
struct Request {
  PmixProc target;
  PmixInfo directive;
};

void answered(int, PmixInfo*, std::size_t, void* cbdata, ReleaseFn release, void* release_data) {
  if (release != nullptr) release(release_data);
  delete static_cast<Request*>(cbdata);
}

std::int64_t hash_of(std::string_view s) {
  return static_cast<std::int64_t>(std::hash<std::string_view>{}(s) >> 1);
}

}  // namespace

RuntimeName runtime_name() {
  RuntimeName n;
  const char* job = std::getenv("PMIX_NAMESPACE");
  const char* rank = std::getenv("PMIX_RANK");
  if (job == nullptr || rank == nullptr || *rank == '\0') return n;
  char* end = nullptr;
  const long long r = std::strtoll(rank, &end, 10);
  if (*end != '\0' || r < 0) return n;
  n.job = hash_of(job);
  n.rank = r;
  return n;
}

std::string ask_runtime_to_end(std::int64_t rank) {
  const char* job = std::getenv("PMIX_NAMESPACE");
  if (job == nullptr || std::strlen(job) >= kNamespaceBytes) return "no PMIx namespace";
  if (rank < 0) return "no PMIx rank";
  void* lib = dlopen("libpmix.so.2", RTLD_LAZY | RTLD_NOLOAD);
  if (lib == nullptr) return "PMIx is not loaded";
  auto* control = reinterpret_cast<JobControlNb>(dlsym(lib, "PMIx_Job_control_nb"));
  dlclose(lib);  // still loaded by Open MPI: the pointer stays good
  if (control == nullptr) return "PMIx has no job control";
  auto* req = new Request{};
  std::strncpy(req->target.nspace, job, kNamespaceBytes - 1);
  req->target.rank = static_cast<std::uint32_t>(rank);
  std::strncpy(req->directive.key, kKillKey, kKeyBytes - 1);
  req->directive.value.type = kPmixBool;
  req->directive.value.data.flag = true;
  const int rc = control(&req->target, 1, &req->directive, 1, &answered, req);
  if (rc == kPmixSuccess) return "";  // `answered` frees the request
  delete req;                         // no answer will come
  if (rc == kPmixOperationSucceeded) return "";
  return "PMIx refused job control (status " + std::to_string(rc) + ")";
}

}  // namespace fluxmpi
