#include "runtime/stall_report.h"

#include <algorithm>
#include <cstdio>

namespace fluxmpi {
namespace {

std::string fmt_s(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 10 ? "%.1f s" : "%.0f s", s);
  return buf;
}

std::string call_label(const CallStatus& s) {
  std::string out = s.kind.empty() ? "collective" : s.kind;
  if (!s.detail.empty() && s.detail != s.kind) out += ", " + s.detail;
  if (!s.call.empty() && s.call != s.detail) out += ", of " + s.call;
  return out;
}

std::string ranks_text(const std::vector<int>& rs) {
  std::string out = rs.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < rs.size(); ++i) out += (i ? ", " : "") + std::to_string(rs[i]);
  return out;
}

// "ranks 2, 3 on node1" or "rank 1 on a, ranks 4, 5 on b": `rs` grouped by host, in order.
std::string ranks_on_hosts(const std::vector<int>& rs, const std::vector<std::string>& hosts) {
  if (hosts.empty()) return ranks_text(rs);
  std::vector<std::pair<std::string, std::vector<int>>> by_host;
  for (int r : rs) {
    const std::string host = static_cast<std::size_t>(r) < hosts.size() ? hosts[r] : "?";
    auto it = std::find_if(by_host.begin(), by_host.end(),
                           [&](const auto& h) { return h.first == host; });
    if (it == by_host.end()) {
      by_host.emplace_back(host, std::vector<int>{});
      it = std::prev(by_host.end());
    }
    it->second.push_back(r);
  }
  std::string out;
  for (const auto& [host, ranks] : by_host)
    out += (out.empty() ? "" : ", ") + ranks_text(ranks) + " on " + host;
  return out;
}

// True when every rank of `host` is among `rs`: nobody on that host answers.
bool whole_host(const std::string& host, const std::vector<int>& rs,
                const std::vector<std::string>& hosts) {
  for (std::size_t r = 0; r < hosts.size(); ++r)
    if (hosts[r] == host && std::find(rs.begin(), rs.end(), static_cast<int>(r)) == rs.end())
      return false;
  return true;
}

std::string indented(const std::string& text, const std::string& pad) {
  std::string out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    out += pad + text.substr(pos, nl - pos) + "\n";
    pos = nl + 1;
  }
  return out;
}

// What rank `r` is doing, in one line plus its Python stack.
std::string describe_rank(int r, const Answer& a, double stack_wait_s) {
  const auto& s = a.status;
  std::string out = "  rank " + std::to_string(r) + ": ";
  if (s.active) {
    out += "inside collective call #" + std::to_string(s.number) + " (" + call_label(s) + ") for " +
           fmt_s(s.for_s);
  } else {
    out += "in user code for " + fmt_s(s.for_s);
    out += s.number > 0 ? ", since it completed collective call #" + std::to_string(s.number) +
                              " (" + call_label(s) + ")"
                        : ", and it has completed no collective call yet";
  }
  if (!a.stack.empty()) {
    out += "; its Python stack (most recent call last):\n" + indented(a.stack, "      ");
  } else {
    out += "; its Python stack could not be taken (no answer from its Python thread within " +
           fmt_s(stack_wait_s) + ": it may be holding the GIL in C code)\n";
  }
  return out;
}

}  // namespace

std::string build_report(const StallView& v, bool* lowest_waiting) {
  const auto& me = v.mine;
  const int rank = v.rank, size = v.size;
  const bool timed_out = v.timed_out;
  const int group = me.status.group;
  const std::int64_t number = me.status.number;
  std::vector<int> members = me.status.members;
  if (group == 0 || members.empty()) {
    members.clear();
    for (int r = 0; r < size; ++r) members.push_back(r);
  }
  std::vector<int> waiting, absent, finished, silent;
  for (int r : members) {
    if (r < 0 || r >= size) continue;
    const Answer* a = r == rank ? &me : (v.answers[r] ? &*v.answers[r] : nullptr);
    if (!a) {
      silent.push_back(r);
      continue;
    }
    const auto& s = a->status;
    const std::int64_t entered =
        static_cast<std::size_t>(group) < s.counts.size() ? s.counts[group] : 0;
    if (s.active && s.group == group && s.number == number) {
      waiting.push_back(r);
    } else if (entered >= number) {
      finished.push_back(r);
    } else {
      absent.push_back(r);
    }
  }
  *lowest_waiting = !waiting.empty() && waiting.front() == rank;
  std::string out = "fluxmpi_py: ";
  out += timed_out ? "timeout" : "stall";
  out += ": collective call #" + std::to_string(number) + " (" + call_label(me.status) + ")";
  if (!me.site.empty()) out += ", issued at " + me.site + ",";
  out += " has waited " + fmt_s(me.status.for_s) + " on rank " + std::to_string(rank) + "\n";
  if (!v.job_label.empty()) out += "  in " + v.job_label + "\n";
  if (!absent.empty()) out += "  not entered it: " + ranks_text(absent) + "\n";
  if (!silent.empty()) {
    out += "  no answer within " + fmt_s(v.reply_wait_s) + " from " +
           ranks_on_hosts(silent, (*v.hosts)) +
           " (hung outside Python, killed, or its host or network link is down)\n";
    std::vector<std::string> lost;  // hosts none of whose ranks answers, other than this one's
    for (int r : silent) {
      const std::string& h = (*v.hosts).size() > static_cast<std::size_t>(r) ? (*v.hosts)[r] : "";
      if (h.empty() || std::find(lost.begin(), lost.end(), h) != lost.end()) continue;
      if (static_cast<std::size_t>(rank) < (*v.hosts).size() && h == (*v.hosts)[rank]) continue;
      if (whole_host(h, silent, (*v.hosts))) lost.push_back(h);
    }
    for (const auto& h : lost)
      out += "  no rank on host " + h +
             " answers: the host, or the network link to it, is likely down\n";
  }
  out += "  waiting in it: " + ranks_text(waiting) + "\n";
  if (!finished.empty()) out += "  done with it: " + ranks_text(finished) + "\n";
  if (absent.empty() && silent.empty())
    out += finished.empty() ? "  every rank has entered it: the transfer itself is slow or lost\n"
                            : "  every rank has entered it, and the ranks done with it left: the "
                              "transfer to the others is slow or lost\n";
  auto answer = [&](int r) -> const Answer& { return r == rank ? me : *v.answers[r]; };
  for (int r : absent) out += describe_rank(r, answer(r), v.stack_wait_s);
  for (int r : finished) out += describe_rank(r, answer(r), v.stack_wait_s);
  const double timeout = v.timeout_s;
  if (timed_out) {
    out += "  the timeout is " + fmt_s(timeout) +
           " (fluxmpi_py.Init(timeout=...), torch.distributed.init_process_group(timeout=...) "
           "or FLUXMPI_TIMEOUT): aborting the job";
  } else {
    const double next = v.next_report_s * 2;
    if (timeout <= 0 || next < timeout)
      out += "  next report at " + fmt_s(next) + " of waiting; ";
    else
      out += "  ";
    out += timeout > 0 ? "the job is aborted at " + fmt_s(timeout) : std::string("no timeout");
    out +=
        " (fluxmpi_py.Init(stall_warning=..., timeout=...), FLUXMPI_STALL_WARNING, "
        "FLUXMPI_TIMEOUT)";
  }
  return out;
}

}  // namespace fluxmpi
