#include "ops/bytes_broadcast.h"

#include "backend/backend.h"
#include "runtime/environment.h"
#include "runtime/group.h"

namespace fluxmpi {

Signature object_signature(ObjectStage stage, std::int64_t root, ErrorClass err, std::string& msg) {
  Signature s;
  s.kind = CallKind::ObjectBroadcast;
  s.detail = static_cast<std::int64_t>(stage);
  s.error = err;
  check_root(root, s, msg);
  return s;
}

std::string broadcast_bytes(const char* data, std::int64_t len, std::int64_t root, ErrorClass err,
                            const std::string& err_text) {
  std::string msg = err_text;
  Signature s = object_signature(ObjectStage::Skeleton, root, err, msg);
  agree(s, kSyncWhat, msg);
  const Group& e = current_group();
  std::string out;
  if (e.size() == 1) return out;  // the root's own bytes are the answer
  mpi_backend().broadcast(&len, 1, c10::kLong, static_cast<int>(root));
  if (len == 0) return out;
  if (e.rank() == root) {
    // The backend's signature is not const: it writes on receivers only.
    mpi_backend().broadcast(const_cast<char*>(data), len, c10::kByte, static_cast<int>(root));
    return out;  // the caller keeps its own bytes
  }
  out.resize(static_cast<std::size_t>(len));
  mpi_backend().broadcast(out.data(), len, c10::kByte, static_cast<int>(root));
  return out;
}

}  // namespace fluxmpi
