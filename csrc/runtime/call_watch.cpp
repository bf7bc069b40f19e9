#include "runtime/call_watch.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/flight.h"
#include "runtime/stall_watch.h"
#include "runtime/user_call.h"
#include "runtime/wait_policy.h"

namespace fluxmpi {
namespace {

constexpr int kExitTag = 7001;

// The job as init() found it (start_call_watch): this rank, the world's size, the control
// communicator and how to end the job. Kept after shutdown, as BlockingCall may still run in a
// shutdown hook.
WatchedJob g_env;

[[noreturn]] void end_job(const std::string& why) {
  g_env.abort(why, 1);
  std::abort();  // g_env.abort does not return
}

// Watchdog state, all under g_wd_mu: the calls this rank has entered, whether one is in
// flight and what it is, and the exit notices received so far (-1: none from that rank).
std::mutex g_wd_mu;
std::condition_variable g_wd_cv;
std::int64_t g_calls_started = 0;
int g_calls_active = 0;
const char* g_wd_what = "";
const char* g_wd_call = "";  // the user call it is part of (runtime/user_call.h), or ""
// For stall reports: the engine work's label (copied: the Work may go before the watchdog
// reads it) and when the current call began or the last one ended.
char g_wd_label[160] = "";
std::chrono::steady_clock::time_point g_wd_since = std::chrono::steady_clock::now();
// Per rank, its exit notice: the world calls it completed before leaving, then its count for
// each group (index 1, 2, ...); empty until its notice arrives.
std::vector<std::vector<std::int64_t>> g_exit_count;
// The groups the watchdog knows (runtime/group.h), by index; entry 0 is the world, unused.
struct CallGroup {
  std::vector<int> world_ranks;
  std::string label;
  std::int64_t started = 0;  // calls this rank entered on the group
};
std::vector<CallGroup> g_groups(1);
int g_wd_group = 0;  // the group of the call in flight (or the last one), 0 for the world
// The blocking calls in flight, one per thread, oldest first: hvd.join() with process sets
// waits on the world and on each set at once, one thread each (ops/join.h). The exit check
// looks at every one; the stall report names the oldest.
struct ActiveCall {
  int group = 0;
  std::int64_t number = 0;  // its index among its group's calls, from 0 (the world's: calls)
  const char* what = "";
  const char* call = "";
  char label[160] = "";
  std::chrono::steady_clock::time_point since;
};
thread_local ActiveCall t_active;
thread_local int t_active_depth = 0;
std::vector<const ActiveCall*> g_active;
bool g_wd_stop = false;
std::thread g_wd_thread;

// Receive every pending exit notice (called with g_wd_mu held; each call is microseconds).
void receive_exit_notices() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    // An error (the shrink mode: a lost rank, a revoked communicator) leaves no message.
    const int rc = MPI_Iprobe(MPI_ANY_SOURCE, kExitTag, g_env.control, &flag, &st);
    if (rc != MPI_SUCCESS || !flag || st.MPI_SOURCE < 0 || st.MPI_SOURCE >= g_env.size) return;
    int n = 0;
    MPI_Get_count(&st, MPI_INT64_T, &n);
    std::vector<std::int64_t> counts(static_cast<std::size_t>(std::max(n, 1)), 0);
    if (MPI_Recv(counts.data(), n, MPI_INT64_T, st.MPI_SOURCE, kExitTag, g_env.control,
                 MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      return;
    }
    g_exit_count[st.MPI_SOURCE] = std::move(counts);
  }
}

// This rank's status for stall reports (called with g_wd_mu held).
CallStatus call_status() {
  CallStatus s;
  auto on = [](int g) { return g == 0 ? std::string() : " on group " + g_groups[g].label; };
  s.counts.push_back(g_calls_started);
  for (std::size_t g = 1; g < g_groups.size(); ++g) s.counts.push_back(g_groups[g].started);
  s.active = g_calls_active > 0;
  s.group = g_wd_group;  // the last call's; its number is its group's count
  if (static_cast<std::size_t>(g_wd_group) < s.counts.size())
    s.number = s.counts[static_cast<std::size_t>(g_wd_group)];
  auto since = g_wd_since;
  s.kind = g_wd_what + on(g_wd_group);
  s.call = g_wd_call;
  s.detail = g_wd_label;
  if (!g_active.empty()) {
    const ActiveCall& a = *g_active.front();
    s.group = a.group;
    s.number = a.number + 1;
    since = a.since;
    s.kind = a.what + on(a.group);
    s.call = a.call;
    s.detail = a.label;
    for (std::size_t i = 1; i < g_active.size(); ++i) {
      s.kind += (i == 1 ? " (and at once " : "; ") + std::string(g_active[i]->what) +
                on(g_active[i]->group);
    }
    if (g_active.size() > 1) s.kind += ")";
  }
  if (s.group != 0 && static_cast<std::size_t>(s.group) < g_groups.size())
    s.members = g_groups[static_cast<std::size_t>(s.group)].world_ranks;
  s.for_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  return s;
}

void watchdog_loop() {
  std::unique_lock<std::mutex> lk(g_wd_mu);
  double tick_s = 1.0;
  while (!g_wd_stop) {
    // One wake-up a second, more often only while a stall report is being gathered (measured
    // cost: none visible in the step benchmarks). Waking the watchdog from every
    // BlockingCall instead would put a futex call on each collective.
    g_wd_cv.wait_for(lk, std::chrono::duration<double>(tick_s));
    if (g_wd_stop) break;
    receive_exit_notices();
    {
      // The stall protocol talks to other ranks and waits for the Python stack: unlocked.
      CallStatus me = call_status();
      lk.unlock();
      StallAction act = stall_tick(me, g_env.control, g_env.rank, g_env.size);
      if (act.abort) end_job(act.abort_why);
      tick_s = act.next_tick_s;
      lk.lock();
      if (g_wd_stop) break;
    }
    // A call in flight is number `number` (counting from 0) of its group on every rank. A
    // rank that completed no more calls than that never entered it and never will. On a group:
    // its calls are counted apart, among its members only.
    for (const ActiveCall* a : g_active) {
      const int g = a->group;
      std::vector<int> everyone;
      if (g == 0) {
        for (int r = 0; r < g_env.size; ++r) everyone.push_back(r);
      }
      const std::vector<int>& ranks = g == 0 ? everyone : g_groups[g].world_ranks;
      for (int r : ranks) {
        const auto& notice = g_exit_count[r];
        if (notice.empty()) continue;
        const std::int64_t done = static_cast<std::size_t>(g) < notice.size() ? notice[g] : 0;
        if (done > a->number) continue;
        std::string what = *a->call ? std::string(a->call) + " (its " + a->what + ", "
                                    : std::string(a->what) + " (";
        const std::string on = g == 0 ? std::string() : " on group " + g_groups[g].label;
        const std::int64_t number = a->number;
        lk.unlock();
        end_job("rank " + std::to_string(r) + " has exited (after " + std::to_string(done) +
                " collective calls" + on + ") while this rank waits in " + what +
                "collective call " + std::to_string(number + 1) + on +
                "), which it can never join; aborting the job");
      }
    }
  }
}

}  // namespace

void start_call_watch(const WatchedJob& job) {
  g_env = job;
  g_exit_count.assign(g_env.size, {});
  g_groups.assign(1, CallGroup{});
  g_wd_group = 0;
  reset_stall_watch(g_env.size);
  g_calls_started = 0;
  g_calls_active = 0;
  g_active.clear();
  if (g_env.size <= 1 || !g_env.watchdog) return;
  g_wd_stop = false;
  g_wd_thread = std::thread(watchdog_loop);
}

void stop_call_watch() {
  {
    std::lock_guard<std::mutex> lk(g_wd_mu);
    g_wd_stop = true;
  }
  g_wd_cv.notify_all();
  stop_stack_requests();
  if (g_wd_thread.joinable()) g_wd_thread.join();
}

// The wait polls and sleeps rather than spinning in MPI_Waitall, so that a rank that finished
// early does not take a core from the ranks still working.
void exchange_exit_notices() {
  std::vector<std::int64_t> done{g_calls_started};
  {
    std::lock_guard<std::mutex> lk(g_wd_mu);
    for (std::size_t g = 1; g < g_groups.size(); ++g) done.push_back(g_groups[g].started);
  }
  std::vector<MPI_Request> reqs;
  for (int r = 0; r < g_env.size; ++r) {
    if (r == g_env.rank) continue;
    reqs.emplace_back();
    MPI_Isend(done.data(), static_cast<int>(done.size()), MPI_INT64_T, r, kExitTag, g_env.control,
              &reqs.back());
  }
  // Notices differ in length (a rank that left early knew fewer groups): probed, not posted.
  auto nap = std::chrono::microseconds(50);
  for (;;) {
    int sent = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &sent, MPI_STATUSES_IGNORE);
    bool all_in = true;
    {
      std::lock_guard<std::mutex> lk(g_wd_mu);
      receive_exit_notices();
      for (int r = 0; r < g_env.size; ++r)
        all_in = all_in && (r == g_env.rank || !g_exit_count[r].empty());
    }
    if (sent && all_in) return;
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(20));
  }
}

BlockingCall::BlockingCall(const char* what, int group, std::int64_t bytes) {
  if (g_env.size <= 1) {
    flight_ = flight_begin(what, group, 0, bytes, user_call(), user_call_since_us());
    return;
  }
  std::lock_guard<std::mutex> lk(g_wd_mu);
  const std::int64_t number = group == 0 ? ++g_calls_started : ++g_groups[group].started;
  flight_ = flight_begin(what, group, number, bytes, user_call(), user_call_since_us());
  g_wd_group = group;
  g_wd_what = what;
  g_wd_call = user_call();
  std::strncpy(g_wd_label, running_work_label(), sizeof g_wd_label - 1);
  g_wd_since = std::chrono::steady_clock::now();
  ++g_calls_active;
  if (t_active_depth++ > 0) return;
  long_wait_enter(g_wd_since);
  t_active.group = group;
  t_active.number = (group == 0 ? g_calls_started : g_groups[group].started) - 1;
  t_active.what = what;
  t_active.call = g_wd_call;
  std::memcpy(t_active.label, g_wd_label, sizeof t_active.label);
  t_active.since = g_wd_since;
  g_active.push_back(&t_active);
}

BlockingCall::~BlockingCall() {
  flight_end(flight_);
  if (g_env.size <= 1) return;
  std::lock_guard<std::mutex> lk(g_wd_mu);
  --g_calls_active;
  g_wd_since = std::chrono::steady_clock::now();
  if (--t_active_depth > 0) return;
  g_active.erase(std::find(g_active.begin(), g_active.end(), &t_active));
  long_wait_leave();
}

int register_call_group(std::vector<int> world_ranks, std::string label, int index) {
  std::lock_guard<std::mutex> lk(g_wd_mu);
  TORCH_INTERNAL_ASSERT(index >= static_cast<int>(g_groups.size()), "fluxmpi_py: group index ",
                        index, " is taken on this rank");
  g_groups.resize(static_cast<std::size_t>(index));
  g_groups.push_back(CallGroup{std::move(world_ranks), std::move(label), 0});
  return index;
}

int next_call_group_index() {
  std::lock_guard<std::mutex> lk(g_wd_mu);
  return static_cast<int>(g_groups.size());
}

}  // namespace fluxmpi
