// The reduction vocabulary shared by every layer: what Python names, what backends execute.
#pragma once

#include <string>

namespace fluxmpi {

// Average is not a backend op: it is a sum followed (or, for 16-bit floats, preceded) by a
// scale, done by the ops layer so that MPI and NCCL agree bit for bit on the CPU logic.
enum class ReduceOp : int { Sum = 0, Min = 1, Max = 2, Prod = 3, Average = 4 };

// "sum", "min", "max", "prod" or "average".
const char* op_name(ReduceOp op);

// Parse "sum", "average" (also "avg", "mean"), "min", "max", "prod"; throws a ValueError-like
// c10::Error naming the bad string and the accepted ones.
ReduceOp parse_op(const std::string& name);

}  // namespace fluxmpi
