#include "backend/mpi_envelope.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>

#include "backend/envelope.h"
#include "backend/mpi_check.h"
#include "runtime/call_watch.h"

namespace fluxmpi {

namespace {

void reduce_envelopes(void* in, void* inout, int* len, MPI_Datatype* type) {
  int size = 0;
  MPI_Type_size(*type, &size);
  for (int i = 0; i < *len; ++i) {
    combine_envelopes(static_cast<const char*>(in) + static_cast<std::ptrdiff_t>(i) * size,
                      static_cast<char*>(inout) + static_cast<std::ptrdiff_t>(i) * size);
  }
}

// One op and one type per envelope size, made on first use and kept for the process (freeing
// them after MPI_Finalize is an error). A loop of calls of one size uses one type.
struct EnvelopeTypes {
  std::mutex mutex;
  MPI_Op op = MPI_OP_NULL;
  std::unordered_map<std::int64_t, MPI_Datatype> types;

  MPI_Datatype type(std::int64_t bytes, MPI_Op* out_op) {
    std::lock_guard<std::mutex> lock(mutex);
    if (op == MPI_OP_NULL) mpi_check(MPI_Op_create(&reduce_envelopes, 1, &op), "MPI_Op_create");
    *out_op = op;
    auto it = types.find(bytes);
    if (it != types.end()) return it->second;
    MPI_Datatype t = MPI_DATATYPE_NULL;
    TORCH_INTERNAL_ASSERT(bytes > 0 && bytes % 8 == 0 && bytes < (std::int64_t(1) << 31),
                          "fluxmpi_py: an envelope of ", bytes, " bytes");
    mpi_check(MPI_Type_contiguous(static_cast<int>(bytes / 8), MPI_INT64_T, &t),
              "MPI_Type_contiguous");
    mpi_check(MPI_Type_commit(&t), "MPI_Type_commit");
    types.emplace(bytes, t);
    return t;
  }
};

EnvelopeTypes& envelope_types() {
  static auto* t = new EnvelopeTypes();
  return *t;
}

}  // namespace

void mpi_allreduce_envelope(void* buf, std::int64_t bytes, MPI_Comm comm, int group) {
  BlockingCall guard("allreduce", group, bytes);
  MPI_Op op = MPI_OP_NULL;
  MPI_Datatype type = envelope_types().type(bytes, &op);
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, 1, type, op, comm), "MPI_Allreduce");
}

}  // namespace fluxmpi
