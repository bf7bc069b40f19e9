#include "runtime/environment.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "runtime/call_watch.h"
#include "runtime/engine.h"
#include "runtime/flight.h"
#include "runtime/runtime_end.h"
#include "runtime/stall_watch.h"
#include "runtime/wait_policy.h"
#include "runtime/world_change.h"

namespace fluxmpi {
namespace {

constexpr double kAbortGrace_s = 5.0;  // abort_job ends this rank itself after this long

void write_all(const std::string& text) {
  for (std::size_t done = 0; done < text.size();) {
    ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
}

Environment g_env;
bool g_initialized = false;
int g_world_changes = 0;
std::vector<RankProcess> g_processes;

// Registered by add_shutdown_hook. Leaked on purpose, so that a hook registered while the
// library loads (a static initializer in another file) never sees it unconstructed.
std::vector<std::function<void()>>& shutdown_hooks() {
  static auto* hooks = new std::vector<std::function<void()>>();
  return *hooks;
}

// MPI_Comm is a pointer in Open MPI and an int in MPICH; mpi4py hands us either as an integer.
template <typename Comm>
Comm comm_from_handle(std::intptr_t h) {
  if constexpr (std::is_pointer_v<Comm>) {
    return reinterpret_cast<Comm>(h);
  } else {
    return static_cast<Comm>(h);
  }
}

// Every rank's host name, for stall reports about ranks that cannot answer (a lost host).
void share_host_names() {
  std::vector<char> names(static_cast<std::size_t>(g_env.size) * MPI_MAX_PROCESSOR_NAME, '\0');
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(mine, &len);
  MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, g_env.control);
  std::vector<std::string> hosts;
  for (int r = 0; r < g_env.size; ++r) {
    const char* name = names.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts.emplace_back(name, strnlen(name, MPI_MAX_PROCESSOR_NAME));
  }
  const RuntimeName name = runtime_name();
  constexpr int kIds = 4;
  const std::int64_t me[kIds] = {static_cast<std::int64_t>(::getpid()), process_start(::getpid()),
                                 name.job, name.rank};
  std::vector<std::int64_t> ids(kIds * static_cast<std::size_t>(g_env.size), 0);
  MPI_Allgather(me, kIds, MPI_INT64_T, ids.data(), kIds, MPI_INT64_T, g_env.control);
  g_processes.assign(static_cast<std::size_t>(g_env.size), RankProcess{});
  for (int r = 0; r < g_env.size; ++r) {
    const std::int64_t* id = ids.data() + kIds * r;
    g_processes[r] = RankProcess{hosts[r], id[0], id[1], id[2], id[3]};
  }
  set_rank_hosts(std::move(hosts));
}

}  // namespace

bool initialized() { return g_initialized; }

const Environment& env() {
  TORCH_CHECK(g_initialized,
              "fluxmpi_py is not initialized: call fluxmpi_py.Init() first "
              "(it starts MPI, or a world of one when run without mpiexec)");
  return g_env;
}

void init(std::intptr_t comm_handle) {
  MPI_Comm requested = comm_handle == 0 ? MPI_COMM_WORLD : comm_from_handle<MPI_Comm>(comm_handle);
  if (g_initialized) {
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(g_env.comm, requested, &cmp);
    TORCH_CHECK(comm_handle == 0 || cmp == MPI_CONGRUENT || cmp == MPI_IDENT,
                "fluxmpi_py.Init: already initialized on a different communicator; "
                "call Init(comm=...) once, before any other fluxmpi_py call");
    return;
  }
  int mpi_inited = 0, mpi_finalized = 0;
  MPI_Initialized(&mpi_inited);
  MPI_Finalized(&mpi_finalized);
  TORCH_CHECK(!mpi_finalized, "fluxmpi_py.Init: MPI has already been finalized in this process");
  if (!mpi_inited) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    TORCH_CHECK(rc == MPI_SUCCESS, "fluxmpi_py.Init: MPI_Init_thread failed with code ", rc);
    g_env.we_initialized_mpi = true;
  }
  MPI_Query_thread(&g_env.thread_level);
  apply_wait_policy();  // whoever started MPI: no busy-polling that steals backward's core
  // Below SERIALIZED only the thread that initialized MPI may call it: no engine thread then.
  Engine::get().set_synchronous(g_env.thread_level < MPI_THREAD_SERIALIZED);
  TORCH_CHECK(requested != MPI_COMM_NULL,
              "fluxmpi_py.Init: comm is MPI.COMM_NULL; call Init only on ranks inside the "
              "communicator");
  // Errors in our communicators come back as codes we turn into Python exceptions.
  MPI_Comm_dup(requested, &g_env.comm);
  MPI_Comm_dup(requested, &g_env.control);
  MPI_Comm_set_errhandler(g_env.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g_env.comm, &g_env.rank);
  MPI_Comm_size(g_env.comm, &g_env.size);
  MPI_Comm node;
  MPI_Comm_split_type(g_env.comm, MPI_COMM_TYPE_SHARED, g_env.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &g_env.node_rank);
  MPI_Comm_size(node, &g_env.node_size);
  MPI_Comm_free(&node);
  share_host_names();
  g_initialized = true;
  start_call_watch(WatchedJob{g_env.control, g_env.rank, g_env.size,
                              g_env.thread_level >= MPI_THREAD_MULTIPLE, &abort_job});
}

int world_changes() { return g_world_changes; }

const std::vector<RankProcess>& rank_processes() { return g_processes; }

std::int64_t process_start(std::int64_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[1024] = {};
  const std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  // The command name (field 2) is in parentheses and may hold spaces: count after its ')'.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr || n == 0) return 0;
  for (int field = 2; field < 22 && p != nullptr; ++field) p = std::strchr(p + 1, ' ');
  return p == nullptr ? 0 : std::strtoll(p + 1, nullptr, 10);
}

void adopt_world(MPI_Comm comm, MPI_Comm control) {
  ++g_world_changes;
  stop_call_watch();  // its thread works on the old control communicator
  drop_stall_messages();
  g_env.comm = comm;
  g_env.control = control;
  MPI_Comm_rank(comm, &g_env.rank);
  MPI_Comm_size(comm, &g_env.size);
  MPI_Comm node;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, g_env.rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &g_env.node_rank);
  MPI_Comm_size(node, &g_env.node_size);
  MPI_Comm_free(&node);
  share_host_names();
  if (!flight_dir().empty()) set_flight_dir(flight_dir(), g_env.rank, g_env.size);
  start_call_watch(WatchedJob{g_env.control, g_env.rank, g_env.size,
                              g_env.thread_level >= MPI_THREAD_MULTIPLE, &abort_job});
}

void shutdown() {
  if (!g_initialized) return;
  Engine::get().stop();
  stop_call_watch();
  int fin = 0;
  MPI_Finalized(&fin);
  g_initialized = false;
  if (fin) return;  // somebody finalized MPI under us; there is nothing left to free
  if (g_env.size > 1) exchange_exit_notices();
  // Every rank is here (after the exit handshake): collective teardown is safe.
  drop_stall_messages();
  const auto& hooks = shutdown_hooks();
  for (auto it = hooks.rbegin(); it != hooks.rend(); ++it) (*it)();
  MPI_Comm_free(&g_env.comm);
  MPI_Comm_free(&g_env.control);
  // A survivor of a lost rank can hang in MPI_Finalize (open-mpi/ompi#11404): the process
  // ends without it, its work done and its peers past the exit handshake above.
  if (g_env.we_initialized_mpi && world_changes() == 0) MPI_Finalize();
}

void add_shutdown_hook(std::function<void()> hook) { shutdown_hooks().push_back(std::move(hook)); }

void abort_job(const std::string& why, int code) {
  flight_dump("abort", why.c_str());
  if (!why.empty()) {
    // One write, with the prefix Python's error output uses too (fluxmpi_py/_excepthooks.py).
    write_all("[rank " + std::to_string(g_env.rank) + " / " + std::to_string(g_env.size) + "] " +
              why + "\n");
  }
  // MPI_Abort needs the launcher to reach every host's daemon; where a host or its link is
  // lost it can hang for minutes ("abort is already in progress"). This rank ends itself after
  // a grace either way, so that no rank outlives the job's end on either side of a cut.
  const int status = code != 0 ? code : 1;
  std::thread([status] {
    std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGrace_s));
    const std::string line = "[rank " + std::to_string(g_env.rank) + " / " +
                             std::to_string(g_env.size) + "] fluxmpi_py: MPI_Abort has not " +
                             "ended this process within " + std::to_string(int(kAbortGrace_s)) +
                             " s (a host or link of the job may be lost): exiting with status " +
                             std::to_string(status) + "\n";
    write_all(line);
    std::_Exit(status);
  }).detach();
  MPI_Abort(g_env.comm != MPI_COMM_NULL ? g_env.comm : MPI_COMM_WORLD, status);
  std::_Exit(status);
}

bool meet_before_abort(double timeout_s) {
  if (!g_initialized || g_env.size <= 1 || g_env.thread_level < MPI_THREAD_MULTIPLE) return false;
  MPI_Request req;
  if (MPI_Ibarrier(g_env.control, &req) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  for (;;) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    // Left pending on timeout: the job is about to end anyway.
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, len);
  auto nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  while (!s.empty() && (s.back() == ',' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string mpi_standard_version() {
  int version = 0, subversion = 0;
  MPI_Get_version(&version, &subversion);
  return std::to_string(version) + "." + std::to_string(subversion);
}

}  // namespace fluxmpi
