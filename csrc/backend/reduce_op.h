// The reduction vocabulary shared by every layer: what Python names, what backends execute.
#pragma once

#include <string>

namespace fluxmpi {

// Average is not a backend op: it is a sum followed (or, for 16-bit floats, preceded) by a
// scale, done by the ops layer so that MPI and NCCL agree bit for bit on the CPU logic.
// BAnd, BOr and BXor are bitwise, for integer and bool tensors only (the ops layer refuses
// other dtypes); on bool they are logical and, or, xor.
enum class ReduceOp : int {
  Sum = 0,
  Min = 1,
  Max = 2,
  Prod = 3,
  Average = 4,
  BAnd = 5,
  BOr = 6,
  BXor = 7
};

// "sum", "min", "max", "prod", "average", "band", "bor" or "bxor".
const char* op_name(ReduceOp op);

// Parse "sum", "average" (also "avg", "mean"), "min", "max", "prod", "band", "bor", "bxor";
// throws a ValueError-like c10::Error naming the bad string and the accepted ones.
ReduceOp parse_op(const std::string& name);

inline bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor;
}

}  // namespace fluxmpi
