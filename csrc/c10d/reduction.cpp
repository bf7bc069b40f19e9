#include "c10d/reduction.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "ops/consensus.h"

namespace fluxmpi {

C10dReduction parse_reduction(const c10d::ReduceOp& op, const std::vector<at::Tensor>& tensors,
                              std::string& error) {
  C10dReduction r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r.op = "sum"; return r;
    case c10d::ReduceOp::AVG: r.op = "average"; return r;
    case c10d::ReduceOp::PRODUCT: r.op = "prod"; return r;
    case c10d::ReduceOp::MIN: r.op = "min"; return r;
    case c10d::ReduceOp::MAX: r.op = "max"; return r;
    case c10d::ReduceOp::BAND: r.op = "band"; return r;
    case c10d::ReduceOp::BOR: r.op = "bor"; return r;
    case c10d::ReduceOp::BXOR: r.op = "bxor"; return r;
    case c10d::ReduceOp::PREMUL_SUM: break;
    default:
      if (error.empty()) {
        error = "ReduceOp " + std::to_string(static_cast<int>(op.op_)) +
                " is not supported by the fluxmpi backend";
      }
      return r;
  }
  r.premul = true;
  const auto* supplement = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (supplement == nullptr) {
    if (error.empty()) {
      error =
          "ReduceOp.PREMUL_SUM without its factor; make it with "
          "torch.distributed._make_nccl_premul_sum(factor)";
    }
    return r;
  }
  r.factor = supplement->double_factor;
  r.tensor_factor = supplement->tensor_factor;
  for (const auto& t : tensors) {
    if (!error.empty()) break;
    if (t.defined() && !c10::isFloatingType(t.scalar_type())) {
      error =
          "ReduceOp.PREMUL_SUM takes floating-point tensors (float16, bfloat16, float32, "
          "float64), got a tensor of " +
          dtype_name(t.scalar_type());
    }
  }
  return r;
}

at::Tensor premultiplied(const C10dReduction& r, const at::Tensor& t) {
  if (!t.defined()) return t;
  c10::AutoGradMode no_grad(false);
  // A Scalar does not promote t's dtype: a float16 tensor stays float16, as under NCCL.
  const at::Scalar factor = r.tensor_factor.defined() ? r.tensor_factor.item() : r.factor;
  return at::mul(t, factor);
}

}  // namespace fluxmpi
