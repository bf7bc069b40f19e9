#include "ops/new_group.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "backend/mpi_backend.h"
#include "backend/mpi_check.h"
#include "ops/consensus.h"
#include "runtime/call_watch.h"
#include "runtime/engine.h"
#include "runtime/environment.h"
#include "runtime/hash.h"
#include "runtime/user_call.h"

namespace fluxmpi {
namespace {

// The members' own messages on env().comm (no other point-to-point traffic there uses them).
constexpr int kListTag = 7301;
constexpr int kCreateTag = 7302;

std::string ranks_text(const std::vector<int>& rs) {
  std::string out = "[";
  for (std::size_t i = 0; i < rs.size(); ++i) out += (i ? ", " : "") + std::to_string(rs[i]);
  return out + "]";
}

// Why `ranks` cannot make a group in a world of `size` ranks ("" when it can).
std::string ranks_error(const std::vector<int>& ranks, int size) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty()) return "ranks is empty; a group needs at least one rank";
  if (sorted.front() < 0 || sorted.back() >= size) {
    return "ranks " + ranks_text(ranks) + " has a rank outside 0 .. " + std::to_string(size - 1);
  }
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return "ranks " + ranks_text(ranks) + " names a rank twice";
  }
  return {};
}

// The group of `world_ranks` (in the group's order) on `comm`, registered at `index`.
std::shared_ptr<const Group> finish_group(std::vector<int> world_ranks, MPI_Comm comm, int index) {
  const auto it = std::find(world_ranks.begin(), world_ranks.end(), env().rank);
  const int rank = it == world_ranks.end() ? -1 : static_cast<int>(it - world_ranks.begin());
  if (comm != MPI_COMM_NULL) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  std::shared_ptr<Backend> backend;
  if (rank >= 0) {
    backend = make_mpi_backend(comm, rank, static_cast<int>(world_ranks.size()), index);
  }
  return std::make_shared<Group>(index, std::move(world_ranks), rank, comm, std::move(backend));
}

// Buffers of sends still posted when an exchange gave up: MPI may read them later.
std::mutex g_abandoned_mu;
std::vector<std::shared_ptr<std::vector<int>>> g_abandoned;

// Sends `mine` ({next index, error flag, ranks...}) to every rank its list names and to every
// rank a received list names, and receives each one's; returns them by world rank.
std::map<int, std::vector<int>> exchange_lists(const std::vector<int>& mine, double timeout_s) {
  const auto& e = env();
  auto buf = std::make_shared<std::vector<int>>(mine);
  std::vector<MPI_Request> sends;
  std::set<int> asked, waiting;
  std::map<int, std::vector<int>> heard;
  auto ask = [&](int r) {
    if (r < 0 || r >= e.size || r == e.rank || !asked.insert(r).second) return;
    sends.emplace_back();
    mpi_check(MPI_Isend(buf->data(), static_cast<int>(buf->size()), MPI_INT, r, kListTag, e.comm,
                        &sends.back()),
              "MPI_Isend");
    waiting.insert(r);
  };
  for (std::size_t i = 2; i < mine.size(); ++i) ask(mine[i]);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  auto nap = std::chrono::microseconds(50);
  int sent = sends.empty() ? 1 : 0;
  while (!waiting.empty() || !sent) {
    bool progress = false;
    for (auto it = waiting.begin(); it != waiting.end();) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(*it, kListTag, e.comm, &flag, &st);
      if (!flag) {
        ++it;
        continue;
      }
      int n = 0;
      MPI_Get_count(&st, MPI_INT, &n);
      std::vector<int> theirs(static_cast<std::size_t>(n));
      MPI_Recv(theirs.data(), n, MPI_INT, *it, kListTag, e.comm, MPI_STATUS_IGNORE);
      const int from = *it;
      it = waiting.erase(it);
      for (std::size_t i = 2; i < theirs.size(); ++i) ask(theirs[i]);  // may post more
      heard[from] = std::move(theirs);
      progress = true;
    }
    if (waiting.empty()) {
      MPI_Testall(static_cast<int>(sends.size()), sends.data(), &sent, MPI_STATUSES_IGNORE);
      if (sent) break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      for (auto& r : sends) {
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      }
      std::lock_guard<std::mutex> lk(g_abandoned_mu);
      g_abandoned.push_back(buf);
      std::vector<int> silent(waiting.begin(), waiting.end());
      TORCH_CHECK(false, "rank ", e.rank, ": ranks ", ranks_text(silent), " did not join within ",
                  timeout_s,
                  " s (a rank named in the list that never calls new_group with it, "
                  "or that names other ranks); the ranks that took part are out of step now");
    }
    if (progress) {
      nap = std::chrono::microseconds(50);
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(20));
    }
  }
  return heard;
}

}  // namespace

std::shared_ptr<const Group> make_group(std::vector<int> world_ranks, bool sort) {
  const auto& e = env();
  UserCall named("new_group()");
  GroupScope on_world(world_group());
  const std::vector<int> given = world_ranks;
  if (sort) std::sort(world_ranks.begin(), world_ranks.end());
  Signature s;
  s.kind = CallKind::NewGroup;
  s.numel = static_cast<std::int64_t>(world_ranks.size());
  s.detail = hash_bytes(world_ranks.data(), world_ranks.size() * sizeof(int));
  const std::string msg = ranks_error(given, e.size);
  if (!msg.empty()) s.error = ErrorClass::Value;
  const auto it = std::find(world_ranks.begin(), world_ranks.end(), e.rank);
  const bool member = it != world_ranks.end();
  // The split orders members by their place in the list.
  const int key = member ? static_cast<int>(it - world_ranks.begin()) : 0;
  MPI_Comm comm = MPI_COMM_NULL;
  int index = next_call_group_index();
  Engine::get().run_inline([&] {
    agree(s, "new_group()", msg, [&] {
      return "ranks " + ranks_text(sort ? world_ranks : given) + (sort ? "" : " (in this order)");
    });
    if (e.size > 1) {
      BlockingCall guard("new_group");
      mpi_check(MPI_Comm_split(e.comm, member ? 0 : MPI_UNDEFINED, key, &comm), "MPI_Comm_split");
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, &index, 1, MPI_INT, MPI_MAX, e.comm), "MPI_Allreduce");
    } else {
      MPI_Comm_dup(e.comm, &comm);
    }
  });
  register_call_group(world_ranks, ranks_text(world_ranks), index);
  return finish_group(std::move(world_ranks), comm, index);
}

std::shared_ptr<const Group> make_local_group(std::vector<int> world_ranks, bool sort,
                                              double timeout_s) {
  const auto& e = env();
  const char* call = "new_group(use_local_synchronization=True)";
  UserCall named(call);
  if (sort) std::sort(world_ranks.begin(), world_ranks.end());
  std::string error = ranks_error(world_ranks, e.size);
  const bool member =
      std::find(world_ranks.begin(), world_ranks.end(), e.rank) != world_ranks.end();
  TORCH_CHECK_VALUE(member || !error.empty(), user_call_or(call), ": rank ", e.rank,
                    " is not in ranks ", ranks_text(world_ranks),
                    "; with use_local_synchronization=True only the members call it");
  std::vector<int> mine{next_call_group_index(), error.empty() ? 0 : 1};
  mine.insert(mine.end(), world_ranks.begin(), world_ranks.end());
  MPI_Comm comm = MPI_COMM_NULL;
  int index = mine[0];
  Engine::get().run_inline([&] {
    const auto heard = exchange_lists(mine, timeout_s);
    std::string lists = "rank " + std::to_string(e.rank) + ": " + ranks_text(world_ranks);
    bool differ = false;
    for (const auto& [r, theirs] : heard) {
      const std::vector<int> ranks(theirs.begin() + 2, theirs.end());
      differ |= ranks != world_ranks;
      lists += "; rank " + std::to_string(r) + ": " + ranks_text(ranks);
      index = std::max(index, theirs[0]);
    }
    TORCH_CHECK(!differ, user_call_or(call), ": the members give different rank lists (", lists,
                "); every member must pass the same list",
                sort ? "" : " in the same order (sort_ranks=False)");
    TORCH_CHECK_VALUE(error.empty(), user_call_or(call), ": rank ", e.rank, ": ", error);
    register_call_group(world_ranks, ranks_text(world_ranks), index);
    MPI_Group world_group_mpi = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
    MPI_Comm_group(e.comm, &world_group_mpi);
    MPI_Group_incl(world_group_mpi, static_cast<int>(world_ranks.size()), world_ranks.data(),
                   &members);
    {
      BlockingCall guard("new_group", index);  // only the members enter: the group's count
      mpi_check(MPI_Comm_create_group(e.comm, members, kCreateTag, &comm), "MPI_Comm_create_group");
    }
    MPI_Group_free(&members);
    MPI_Group_free(&world_group_mpi);
  });
  return finish_group(std::move(world_ranks), comm, index);
}

}  // namespace fluxmpi
