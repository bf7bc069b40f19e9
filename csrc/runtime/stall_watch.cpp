#include "runtime/stall_watch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "runtime/flight.h"
#include "runtime/stall_answer.h"
#include "runtime/stall_report.h"

namespace fluxmpi {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kStatusRequestTag = 7002;  // payload: the round's id (int64)
constexpr int kStatusReplyTag = 7003;    // payload: a serialized Answer
constexpr int kAbortTag = 7004;          // payload: the report to print before the job ends
constexpr double kReplyWait_s = 3.0;     // a round waits this long for answers
constexpr double kStackWait_s = 1.5;     // and a rank this long for its Python stack

std::atomic<double> g_warning_s{60.0};
std::atomic<double> g_timeout_s{1800.0};

// The Python stack bridge.
std::mutex g_st_mu;
std::condition_variable g_st_cv;
std::uint64_t g_st_asked = 0, g_st_answered = 0, g_st_taken = 0;
bool g_st_listening = false;  // a Python thread is waiting for requests
bool g_st_stop = false;
std::string g_st_stack, g_st_site;

// Round state, touched by the watchdog thread only.
struct Round {
  bool open = false;
  bool final = false;  // the timeout's round: abort once it closes
  std::int64_t id = 0;
  Clock::time_point deadline;
  Answer mine;
  std::vector<std::optional<Answer>> answers;
};
Round g_round;
std::int64_t g_tracked_call = -1;                        // the call the reports are about
int g_tracked_group = 0;                                 // and its group
double g_next_report_s = 0;                              // wait at which the next report is due
std::list<std::pair<std::string, MPI_Request>> g_sends;  // nodes keep buffers in place
std::vector<std::string> g_rank_hosts;                   // by rank; set at init
std::mutex g_job_label_mu;
std::string g_job_label;  // "Slurm job 42, step 0" (set_job_label), or ""

// Ask this rank's Python thread for its stack; "" when none answers within kStackWait_s (no
// thread, or the interpreter holds the GIL in C code).
std::pair<std::string, std::string> python_stack() {
  std::unique_lock<std::mutex> lk(g_st_mu);
  if (!g_st_listening || g_st_stop) return {};
  const std::uint64_t ticket = ++g_st_asked;
  g_st_cv.notify_all();
  auto wait = std::chrono::duration<double>(kStackWait_s);
  if (!g_st_cv.wait_for(lk, wait, [&] { return g_st_answered >= ticket || g_st_stop; })) return {};
  if (g_st_answered < ticket) return {};
  return {g_st_stack, g_st_site};
}

void isend(MPI_Comm comm, int to, int tag, std::string payload) {
  g_sends.emplace_back(std::move(payload), MPI_REQUEST_NULL);
  auto& [buf, req] = g_sends.back();
  MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_CHAR, to, tag, comm, &req);
}

void reap_sends() {
  for (auto it = g_sends.begin(); it != g_sends.end();) {
    int done = 0;
    MPI_Test(&it->second, &done, MPI_STATUS_IGNORE);
    it = done ? g_sends.erase(it) : std::next(it);
  }
}

// Receive one pending message with `tag` from any rank, if there is one.
std::optional<std::pair<int, std::string>> receive(MPI_Comm comm, int tag) {
  int flag = 0;
  MPI_Status st;
  // An error (the shrink mode: a lost rank, a revoked communicator) leaves no message.
  if (MPI_Iprobe(MPI_ANY_SOURCE, tag, comm, &flag, &st) != MPI_SUCCESS || !flag ||
      st.MPI_SOURCE < 0) {
    return std::nullopt;
  }
  int n = 0;
  MPI_Get_count(&st, MPI_CHAR, &n);
  std::string buf(static_cast<std::size_t>(std::max(n, 0)), '\0');
  if (MPI_Recv(buf.data(), n, MPI_CHAR, st.MPI_SOURCE, tag, comm, MPI_STATUS_IGNORE) !=
      MPI_SUCCESS) {
    return std::nullopt;
  }
  return std::make_pair(st.MPI_SOURCE, std::move(buf));
}

Answer local_answer(const CallStatus& me) {
  Answer a;
  a.status = me;
  std::tie(a.stack, a.site) = python_stack();
  return a;
}

void write_stderr(const std::string& text) {
  for (std::size_t done = 0; done < text.size();) {
    ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
}

void open_round(const CallStatus& me, MPI_Comm control, int rank, int size, bool final) {
  g_round.open = true;
  g_round.final = final;
  ++g_round.id;
  g_round.answers.assign(size, std::nullopt);
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    std::string id = std::to_string(g_round.id);
    isend(control, r, kStatusRequestTag, std::move(id));
  }
  g_round.mine = local_answer(me);
  g_round.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(kReplyWait_s));
}

void answer_requests(const CallStatus& me, MPI_Comm control) {
  std::vector<std::pair<int, std::int64_t>> asks;
  while (auto msg = receive(control, kStatusRequestTag)) {
    try {
      asks.emplace_back(msg->first, std::stoll(msg->second));
    } catch (...) {
    }
  }
  if (asks.empty()) return;
  Answer a = local_answer(me);
  for (const auto& [from, id] : asks) {
    a.round = id;
    isend(control, from, kStatusReplyTag, serialize_answer(a));
  }
}

void collect_answers(MPI_Comm control) {
  while (auto msg = receive(control, kStatusReplyTag)) {
    auto a = parse_answer(msg->second);
    if (a && g_round.open && a->round == g_round.id) g_round.answers[msg->first] = std::move(*a);
  }
}

}  // namespace

void set_stall_settings(double warning_s, double timeout_s) {
  g_warning_s = warning_s;
  g_timeout_s = timeout_s;
}

void set_rank_hosts(std::vector<std::string> hosts) { g_rank_hosts = std::move(hosts); }

void set_job_label(std::string label) {
  std::lock_guard<std::mutex> lk(g_job_label_mu);
  g_job_label = std::move(label);
}

double stall_warning_s() { return g_warning_s.load(); }
double stall_timeout_s() { return g_timeout_s.load(); }

bool wait_stack_request() {
  std::unique_lock<std::mutex> lk(g_st_mu);
  g_st_listening = true;
  g_st_cv.wait(lk, [] { return g_st_asked > g_st_taken || g_st_stop; });
  if (g_st_stop) {
    g_st_listening = false;
    return false;
  }
  g_st_taken = g_st_asked;
  return true;
}

void post_stack(std::string stack, std::string site) {
  {
    std::lock_guard<std::mutex> lk(g_st_mu);
    g_st_stack = std::move(stack);
    g_st_site = std::move(site);
    g_st_answered = g_st_taken;
  }
  g_st_cv.notify_all();
}

void stop_stack_requests() {
  {
    std::lock_guard<std::mutex> lk(g_st_mu);
    g_st_stop = true;
  }
  g_st_cv.notify_all();
}

void reset_stall_watch(int size) {
  g_round = Round{};
  g_round.answers.assign(size, std::nullopt);
  g_tracked_call = -1;
  g_tracked_group = 0;
  g_next_report_s = 0;
  std::lock_guard<std::mutex> lk(g_st_mu);
  g_st_stop = false;
}

StallAction stall_tick(const CallStatus& me, MPI_Comm control, int rank, int size) {
  StallAction act;
  reap_sends();
  if (auto msg = receive(control, kAbortTag)) {
    // The reporter's text, as this rank's error: "fluxmpi_py: timeout (reported by rank 0): ..."
    act.abort = true;
    act.abort_why = msg->second;
    const std::string head = "fluxmpi_py: timeout";
    if (act.abort_why.compare(0, head.size(), head) == 0)
      act.abort_why.insert(head.size(), " (reported by rank " + std::to_string(msg->first) + ")");
    flight_dump("timeout", act.abort_why.c_str());
    return act;
  }
  answer_requests(me, control);
  const double warning = g_warning_s.load(), timeout = g_timeout_s.load();
  if (!me.active) {
    g_round.open = false;
    g_tracked_call = -1;
    return act;
  }
  if (me.group != g_tracked_group || me.number != g_tracked_call) {
    g_tracked_group = me.group;
    g_tracked_call = me.number;
    g_round.open = false;
    g_next_report_s = warning;
  }
  if (g_round.open) {
    collect_answers(control);
    bool all = true;
    for (int r = 0; r < size; ++r) all = all && (r == rank || g_round.answers[r].has_value());
    if (all || Clock::now() >= g_round.deadline) {
      g_round.open = false;
      bool lowest = false;
      StallView view{g_round.mine, g_round.answers, rank, size, g_round.final};
      view.hosts = &g_rank_hosts;
      {
        std::lock_guard<std::mutex> lk(g_job_label_mu);
        view.job_label = g_job_label;
      }
      view.reply_wait_s = kReplyWait_s;
      view.stack_wait_s = kStackWait_s;
      view.timeout_s = g_timeout_s.load();
      view.next_report_s = g_next_report_s;
      std::string report = build_report(view, &lowest);
      const std::string prefix =
          "[rank " + std::to_string(rank) + " / " + std::to_string(size) + "] ";
      if (g_round.final) {
        // This rank's error first (the first abort ends every rank), then every rank that can
        // still read its messages prints the report as its error.
        write_stderr(prefix + report + "\n");
        flight_dump("timeout", report.c_str());
        for (int r = 0; r < size; ++r)
          if (r != rank) isend(control, r, kAbortTag, report);
        auto until = Clock::now() + std::chrono::seconds(2);
        while (!g_sends.empty() && Clock::now() < until) {
          reap_sends();
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        // A moment for the others to print before the abort ends them.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        act.abort = true;
        return act;
      }
      if (lowest) write_stderr(prefix + report + "\n");
      g_next_report_s *= 2;
    }
  } else if (timeout > 0 && me.for_s >= timeout) {
    open_round(me, control, rank, size, /*final=*/true);
  } else if (warning > 0 && me.for_s >= g_next_report_s) {
    open_round(me, control, rank, size, /*final=*/false);
  }
  act.next_tick_s = g_round.open ? 0.1 : 1.0;
  if (!g_round.open && warning > 0) {
    const double due = std::min(timeout > 0 ? timeout : 1e18, g_next_report_s) - me.for_s;
    act.next_tick_s = std::clamp(due, 0.05, 1.0);
  }
  return act;
}

void drop_stall_messages() {
  for (auto& [buf, req] : g_sends)
    if (req != MPI_REQUEST_NULL) MPI_Request_free(&req);
  g_sends.clear();
}

}  // namespace fluxmpi
