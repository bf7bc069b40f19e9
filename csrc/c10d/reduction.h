// torch's ReduceOp for the fluxmpi backend: fluxmpi's name for the op, and PREMUL_SUM's factor
// (torch.distributed._make_nccl_premul_sum: each rank's tensor times the factor, then a sum).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

namespace fluxmpi {

struct C10dReduction {
  std::string op = "sum";  // fluxmpi's name: "sum", "average", "min", ..., "band", "bor", "bxor"
  bool premul = false;     // PREMUL_SUM: scale by the factor, then "sum"
  double factor = 1.0;
  at::Tensor tensor_factor;  // a one-element tensor, when the factor was given as one
};

// What `op` asks for. An op fluxmpi does not know sets `error` (when empty); PREMUL_SUM over
// `tensors` that are not all floating point sets `error` too, as torch's NCCL backend refuses
// them. The caller passes `error` into the collective, which raises it on every rank.
C10dReduction parse_reduction(const c10d::ReduceOp& op, const std::vector<at::Tensor>& tensors,
                              std::string& error);

// A new tensor: `t` times the reduction's factor, in t's dtype (undefined stays undefined).
// Only for floating-point `t` (parse_reduction refused the others).
at::Tensor premultiplied(const C10dReduction& r, const at::Tensor& t);

}  // namespace fluxmpi
