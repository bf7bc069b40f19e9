#include "runtime/environment.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/engine.h"

namespace fluxmpi {
namespace {

constexpr int kExitTag = 7001;

Environment g_env;
bool g_initialized = false;

// Watchdog state: the number of live BlockingCall objects and what the newest one is.
std::mutex g_wd_mu;
std::condition_variable g_wd_cv;
int g_wd_active = 0;
std::uint64_t g_wd_gen = 0;  // bumped by every BlockingCall, to tell one call from the next
const char* g_wd_what = "";
bool g_wd_stop = false;
std::thread g_wd_thread;

// A peer's exit notice while we wait means the call can never complete, except for a call
// the peer had already finished its side of (a broadcast root returns early). So the call
// must still be the same one after a grace period before the job is aborted.
constexpr auto kGrace = std::chrono::seconds(3);

void watchdog_loop() {
  std::unique_lock<std::mutex> lk(g_wd_mu);
  bool suspect = false;
  std::uint64_t suspect_gen = 0;
  int suspect_rank = -1;
  auto suspect_since = std::chrono::steady_clock::now();
  while (!g_wd_stop) {
    // One wake-up a second (measured cost: none visible in the step benchmarks). Waking the
    // watchdog from every BlockingCall instead would put a futex call on each collective.
    g_wd_cv.wait_for(lk, std::chrono::seconds(1));
    if (g_wd_stop) break;
    if (g_wd_active == 0) {
      suspect = false;
      continue;
    }
    if (suspect && suspect_gen == g_wd_gen) {
      if (std::chrono::steady_clock::now() - suspect_since >= kGrace) {
        std::string what = g_wd_what;
        lk.unlock();
        abort_job("rank " + std::to_string(suspect_rank) +
                  " has exited while this rank waits in " + what +
                  "; it can never complete, so the job is aborted");
      }
      continue;
    }
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kExitTag, g_env.control, &flag, &st);
    if (flag) {
      suspect = true;
      suspect_gen = g_wd_gen;
      suspect_rank = st.MPI_SOURCE;
      suspect_since = std::chrono::steady_clock::now();
    }
  }
}

void start_watchdog() {
  if (g_env.size <= 1 || g_env.thread_level < MPI_THREAD_MULTIPLE) return;
  g_wd_stop = false;
  g_wd_thread = std::thread(watchdog_loop);
}

void stop_watchdog() {
  {
    std::lock_guard<std::mutex> lk(g_wd_mu);
    g_wd_stop = true;
  }
  g_wd_cv.notify_all();
  if (g_wd_thread.joinable()) g_wd_thread.join();
}

}  // namespace

BlockingCall::BlockingCall(const char* what) {
  if (g_env.size <= 1) return;
  std::lock_guard<std::mutex> lk(g_wd_mu);
  ++g_wd_gen;
  g_wd_what = what;
  ++g_wd_active;
}

BlockingCall::~BlockingCall() {
  if (g_env.size <= 1) return;
  std::lock_guard<std::mutex> lk(g_wd_mu);
  --g_wd_active;
}

bool initialized() { return g_initialized; }

const Environment& env() {
  TORCH_CHECK(g_initialized,
              "fluxmpi_py is not initialized: call fluxmpi_py.Init() first "
              "(it starts MPI, or a world of one when run without mpiexec)");
  return g_env;
}

void init(std::intptr_t comm_handle) {
  MPI_Comm requested = comm_handle == 0 ? MPI_COMM_WORLD : reinterpret_cast<MPI_Comm>(comm_handle);
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
  g_initialized = true;
  start_watchdog();
}

void shutdown() {
  if (!g_initialized) return;
  Engine::get().stop();
  stop_watchdog();
  if (g_env.size > 1) {
    // Tell everyone we are leaving, then wait for everyone's notice: after this no rank can
    // still be inside one of our collectives, so MPI_Finalize cannot block on a straggler.
    char byte = 0;
    std::vector<MPI_Request> reqs;
    for (int r = 0; r < g_env.size; ++r) {
      if (r == g_env.rank) continue;
      reqs.emplace_back();
      MPI_Isend(&byte, 1, MPI_CHAR, r, kExitTag, g_env.control, &reqs.back());
    }
    std::vector<char> in(g_env.size);
    for (int r = 0; r < g_env.size; ++r) {
      if (r == g_env.rank) continue;
      reqs.emplace_back();
      MPI_Irecv(&in[r], 1, MPI_CHAR, r, kExitTag, g_env.control, &reqs.back());
    }
    MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  }
  MPI_Comm_free(&g_env.comm);
  MPI_Comm_free(&g_env.control);
  g_initialized = false;
  int fin = 0;
  MPI_Finalized(&fin);
  if (g_env.we_initialized_mpi && !fin) MPI_Finalize();
}

void abort_job(const std::string& why, int code) {
  std::fprintf(stderr, "[fluxmpi_py rank %d/%d] %s\n", g_env.rank, g_env.size, why.c_str());
  std::fflush(stderr);
  MPI_Abort(g_env.comm != MPI_COMM_NULL ? g_env.comm : MPI_COMM_WORLD, code);
  std::_Exit(code);
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

}  // namespace fluxmpi
