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

// The order in which a float sum over 3 or more ranks adds the ranks' values (over 2 ranks a
// sum is one addition: the same bits in any order). Fastest: whatever MPI_Allreduce or fluxmpi's
// ring (backend/mpi_ring.h) does, float16 and bfloat16 summed in fp32 and rounded once. Gloo: the
// order of torch's gloo backend (gloo's ring allreduce), each addition rounded to the dtype, so
// that a sum of host tensors has gloo's bits at any size: DDP on fluxmpi then trains bit for bit as
// DDP on gloo. Measured against Fastest (3 ranks, one host; docs/measurements.md): 1.2x the time
// at 4-64 KiB, where a ring's 2 (size - 1) messages cost more than MPI_Allreduce, 0.6-0.7x at 1-4
// MiB.
enum class SumOrder { Fastest = 0, Gloo = 1 };

inline bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor;
}

}  // namespace fluxmpi
