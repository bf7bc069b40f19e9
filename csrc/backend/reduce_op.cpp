#include "backend/reduce_op.h"

#include <c10/util/Exception.h>

namespace fluxmpi {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Average: return "average";
    case ReduceOp::BAnd: return "band";
    case ReduceOp::BOr: return "bor";
    case ReduceOp::BXor: return "bxor";
  }
  return "?";
}

ReduceOp parse_op(const std::string& name) {
  if (name == "sum" || name == "+") return ReduceOp::Sum;
  if (name == "average" || name == "avg" || name == "mean") return ReduceOp::Average;
  if (name == "min") return ReduceOp::Min;
  if (name == "max") return ReduceOp::Max;
  if (name == "prod" || name == "product" || name == "*") return ReduceOp::Prod;
  if (name == "band") return ReduceOp::BAnd;
  if (name == "bor") return ReduceOp::BOr;
  if (name == "bxor") return ReduceOp::BXor;
  TORCH_CHECK_VALUE(false, "fluxmpi_py: unknown reduction op '", name,
                    "'; expected one of sum, average, min, max, prod, band, bor, bxor (also "
                    "'avg' and 'mean' for average, 'product' and '*' for prod, '+' for sum)");
}

}  // namespace fluxmpi
