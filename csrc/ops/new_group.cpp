#include "ops/new_group.h"

#include <mpi.h>

#include <algorithm>
#include <string>

#include "backend/mpi_backend.h"
#include "backend/mpi_check.h"
#include "ops/consensus.h"
#include "runtime/engine.h"
#include "runtime/environment.h"
#include "runtime/hash.h"
#include "runtime/user_call.h"

namespace fluxmpi {
namespace {

std::string ranks_text(const std::vector<int>& rs) {
  std::string out = "[";
  for (std::size_t i = 0; i < rs.size(); ++i) out += (i ? ", " : "") + std::to_string(rs[i]);
  return out + "]";
}

}  // namespace

std::shared_ptr<const Group> make_group(std::vector<int> world_ranks) {
  const auto& e = env();
  UserCall named("new_group()");
  GroupScope on_world(world_group());
  const std::vector<int> given = world_ranks;
  std::sort(world_ranks.begin(), world_ranks.end());
  Signature s;
  s.kind = CallKind::NewGroup;
  s.numel = static_cast<std::int64_t>(world_ranks.size());
  s.detail = hash_bytes(world_ranks.data(), world_ranks.size() * sizeof(int));
  std::string msg;
  if (world_ranks.empty()) {
    s.error = ErrorClass::Value;
    msg = "ranks is empty; a group needs at least one rank";
  } else if (world_ranks.front() < 0 || world_ranks.back() >= e.size) {
    s.error = ErrorClass::Value;
    msg = "ranks " + ranks_text(given) + " has a rank outside 0 .. " + std::to_string(e.size - 1);
  } else if (std::adjacent_find(world_ranks.begin(), world_ranks.end()) != world_ranks.end()) {
    s.error = ErrorClass::Value;
    msg = "ranks " + ranks_text(given) + " names a rank twice";
  }
  const auto it = std::lower_bound(world_ranks.begin(), world_ranks.end(), e.rank);
  const bool member = it != world_ranks.end() && *it == e.rank;
  MPI_Comm comm = MPI_COMM_NULL;
  Engine::get().run_inline([&] {
    agree(s, "new_group()", msg, [&] { return "ranks " + ranks_text(given); });
    if (e.size > 1) {
      BlockingCall guard("new_group");
      mpi_check(MPI_Comm_split(e.comm, member ? 0 : MPI_UNDEFINED, e.rank, &comm),
                "MPI_Comm_split");
    } else {
      MPI_Comm_dup(e.comm, &comm);
    }
  });
  if (comm != MPI_COMM_NULL) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  const int index = register_call_group(world_ranks, ranks_text(world_ranks));
  const int rank = member ? static_cast<int>(it - world_ranks.begin()) : -1;
  std::shared_ptr<Backend> backend;
  if (member) {
    backend = make_mpi_backend(comm, rank, static_cast<int>(world_ranks.size()), index);
  }
  return std::make_shared<Group>(index, std::move(world_ranks), rank, comm, std::move(backend));
}

}  // namespace fluxmpi
