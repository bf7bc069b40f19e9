#include <mpi.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <limits>

#include "backend/backend.h"
#include "runtime/environment.h"

namespace fluxmpi {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Average: return "average";
  }
  return "?";
}

ReduceOp parse_op(const std::string& name) {
  if (name == "sum" || name == "+") return ReduceOp::Sum;
  if (name == "average" || name == "avg" || name == "mean") return ReduceOp::Average;
  if (name == "min") return ReduceOp::Min;
  if (name == "max") return ReduceOp::Max;
  if (name == "prod" || name == "product" || name == "*") return ReduceOp::Prod;
  TORCH_CHECK_VALUE(false, "fluxmpi_py: unknown reduction op '", name,
                    "'; expected one of sum, average, min, max, prod");
}

namespace {

// MPI has no 16-bit float types. They travel as 16-bit words and reduce through our own
// MPI_Op, which computes every pair in fp32 and rounds once per combine.
template <typename T, typename F>
void combine16(void* in, void* inout, int* len, F f) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

template <typename T>
struct Ops16 {
  static void sum(void* in, void* io, int* n, MPI_Datatype*) {
    combine16<T>(in, io, n, [](float x, float y) { return x + y; });
  }
  static void prod(void* in, void* io, int* n, MPI_Datatype*) {
    combine16<T>(in, io, n, [](float x, float y) { return x * y; });
  }
  static void min(void* in, void* io, int* n, MPI_Datatype*) {
    combine16<T>(in, io, n, [](float x, float y) { return std::min(x, y); });
  }
  static void max(void* in, void* io, int* n, MPI_Datatype*) {
    combine16<T>(in, io, n, [](float x, float y) { return std::max(x, y); });
  }
};

struct UserOps {
  MPI_Op half[4];
  MPI_Op bf16[4];
  UserOps() {
    MPI_Op_create(&Ops16<c10::Half>::sum, 1, &half[0]);
    MPI_Op_create(&Ops16<c10::Half>::min, 1, &half[1]);
    MPI_Op_create(&Ops16<c10::Half>::max, 1, &half[2]);
    MPI_Op_create(&Ops16<c10::Half>::prod, 1, &half[3]);
    MPI_Op_create(&Ops16<c10::BFloat16>::sum, 1, &bf16[0]);
    MPI_Op_create(&Ops16<c10::BFloat16>::min, 1, &bf16[1]);
    MPI_Op_create(&Ops16<c10::BFloat16>::max, 1, &bf16[2]);
    MPI_Op_create(&Ops16<c10::BFloat16>::prod, 1, &bf16[3]);
  }
  // Not freed: MPI_Op_free after MPI_Finalize is an error, and these live for the process.
};

UserOps& user_ops() {
  static UserOps* ops = new UserOps();
  return *ops;
}

MPI_Datatype mpi_type(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return MPI_FLOAT;
    case c10::kDouble: return MPI_DOUBLE;
    case c10::kHalf:
    case c10::kBFloat16: return MPI_UINT16_T;
    case c10::kChar: return MPI_INT8_T;
    case c10::kShort: return MPI_INT16_T;
    case c10::kInt: return MPI_INT32_T;
    case c10::kLong: return MPI_INT64_T;
    case c10::kByte: return MPI_UINT8_T;
    case c10::kBool: return MPI_C_BOOL;
    default: TORCH_CHECK_TYPE(false, "fluxmpi_py: dtype ", t, " is not supported by MPI backend");
  }
}

MPI_Op mpi_op(ReduceOp op, c10::ScalarType t) {
  TORCH_INTERNAL_ASSERT(op != ReduceOp::Average, "average must be lowered to sum by the caller");
  int i = static_cast<int>(op);
  if (t == c10::kHalf) return user_ops().half[i];
  if (t == c10::kBFloat16) return user_ops().bf16[i];
  if (t == c10::kBool) {
    // logical or/and for min/max/sum/prod on bools
    return (op == ReduceOp::Sum || op == ReduceOp::Max) ? MPI_LOR : MPI_LAND;
  }
  static const MPI_Op table[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
  return table[i];
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  TORCH_CHECK(false, "fluxmpi_py: ", what, " failed: ", std::string(msg, len));
}

// MPI counts are ints: move large buffers in chunks of at most 2^30 elements.
constexpr std::int64_t kMaxChunk = std::int64_t(1) << 30;

class MpiBackend final : public Backend {
 public:
  const char* name() const override { return "mpi"; }

  void allreduce(void* buf, std::int64_t count, c10::ScalarType dt, ReduceOp op) override {
    BlockingCall guard("allreduce");
    auto type = mpi_type(dt);
    auto mop = mpi_op(op, dt);
    auto* p = static_cast<char*>(buf);
    std::size_t esz = c10::elementSize(dt);
    for (std::int64_t off = 0; off < count; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - off));
      check(MPI_Allreduce(MPI_IN_PLACE, p + off * esz, n, type, mop, env().comm), "MPI_Allreduce");
    }
  }

  void broadcast(void* buf, std::int64_t count, c10::ScalarType dt, int root) override {
    BlockingCall guard("broadcast");
    auto* p = static_cast<char*>(buf);
    std::size_t esz = c10::elementSize(dt);
    // bytes travel as bytes: no datatype conversion, any dtype
    std::int64_t bytes = count * static_cast<std::int64_t>(esz);
    for (std::int64_t off = 0; off < bytes; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      check(MPI_Bcast(p + off, n, MPI_BYTE, root, env().comm), "MPI_Bcast");
    }
  }

  void reduce(const void* send, void* recv, std::int64_t count, c10::ScalarType dt, ReduceOp op,
              int root) override {
    BlockingCall guard("reduce");
    auto type = mpi_type(dt);
    auto mop = mpi_op(op, dt);
    std::size_t esz = c10::elementSize(dt);
    bool is_root = env().rank == root;
    for (std::int64_t off = 0; off < count; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - off));
      const void* s = static_cast<const char*>(send) + off * esz;
      void* r = is_root ? static_cast<char*>(recv) + off * esz : nullptr;
      if (is_root && s == r) s = MPI_IN_PLACE;
      check(MPI_Reduce(s, r, n, type, mop, root, env().comm), "MPI_Reduce");
    }
  }

  void allgather(const void* send, void* recv, std::int64_t count, c10::ScalarType dt) override {
    BlockingCall guard("allgather");
    std::int64_t bytes = count * static_cast<std::int64_t>(c10::elementSize(dt));
    TORCH_CHECK(bytes * env().size < std::numeric_limits<int>::max(),
                "fluxmpi_py: allgather of ", bytes, " bytes per rank is too large");
    check(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes),
                        MPI_BYTE, env().comm),
          "MPI_Allgather");
  }

  void barrier() override {
    BlockingCall guard("barrier");
    check(MPI_Barrier(env().comm), "MPI_Barrier");
  }
};

}  // namespace

Backend& mpi_backend() {
  static MpiBackend backend;
  return backend;
}

}  // namespace fluxmpi
