#include "backend/mpi_types.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>

namespace fluxmpi {

namespace {

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

}  // namespace

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
  if (is_bitwise(op)) {
    TORCH_INTERNAL_ASSERT(c10::isIntegralType(t, /*includeBool=*/true),
                          "bitwise reductions of floats must be refused by the ops layer");
    if (t == c10::kBool) {
      return op == ReduceOp::BAnd ? MPI_LAND : op == ReduceOp::BOr ? MPI_LOR : MPI_LXOR;
    }
    return op == ReduceOp::BAnd ? MPI_BAND : op == ReduceOp::BOr ? MPI_BOR : MPI_BXOR;
  }
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

}  // namespace fluxmpi
