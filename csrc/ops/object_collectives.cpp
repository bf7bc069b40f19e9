#include "ops/object_collectives.h"

#include <limits>

#include "backend/backend.h"
#include "ops/consensus.h"
#include "runtime/environment.h"
#include "runtime/group.h"
#include "runtime/user_call.h"

namespace fluxmpi {

namespace {

Signature object_call(CallKind kind, const std::string& local_error, std::string& msg) {
  Signature s;
  s.kind = kind;
  if (!local_error.empty()) {
    s.error = ErrorClass::Value;
    msg = local_error;
  }
  return s;
}

}  // namespace

std::string broadcast_object_bytes(const std::string& data, std::int64_t root,
                                   const std::string& local_error) {
  std::string msg;
  Signature s = object_call(CallKind::ObjectBcast, local_error, msg);
  check_root(root, s, msg);
  agree(s, "broadcast_object()", msg);
  const Group& e = current_group();
  if (e.size() == 1) return {};
  const bool is_root = e.rank() == root;
  std::int64_t len = is_root ? static_cast<std::int64_t>(data.size()) : 0;
  mpi_backend().broadcast(&len, 1, c10::kLong, static_cast<int>(root));
  if (len == 0) return {};
  if (is_root) {
    // The backend's signature is not const: it writes on receivers only.
    mpi_backend().broadcast(const_cast<char*>(data.data()), len, c10::kByte,
                            static_cast<int>(root));
    return {};
  }
  std::string out(static_cast<std::size_t>(len), '\0');
  mpi_backend().broadcast(out.data(), len, c10::kByte, static_cast<int>(root));
  return out;
}

std::vector<std::string> allgather_object_bytes(const std::string& data,
                                                const std::string& local_error) {
  std::string msg;
  Signature s = object_call(CallKind::ObjectAllgather, local_error, msg);
  agree(s, "allgather_object()", msg);
  const Group& e = current_group();
  if (e.size() == 1) return {data};
  std::int64_t mine = static_cast<std::int64_t>(data.size());
  std::vector<std::int64_t> lens(e.size());
  mpi_backend().allgather(&mine, lens.data(), 1, c10::kLong);
  std::int64_t total = 0;
  for (auto n : lens) total += n;
  if (total > std::numeric_limits<int>::max()) {
    raise_on_every_rank(ErrorClass::Value,
                        std::string(user_call_or("allgather_object()")) + ": the pickles of " +
                            "all ranks take " + std::to_string(total) +
                            " bytes; the MPI backend moves at most 2 GiB - 1 per call");
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  mpi_backend().allgatherv(data.data(), mine, all.data(), lens);
  std::vector<std::string> out;
  std::size_t pos = 0;
  for (auto n : lens) {
    out.emplace_back(all.substr(pos, static_cast<std::size_t>(n)));
    pos += static_cast<std::size_t>(n);
  }
  return out;
}

}  // namespace fluxmpi
