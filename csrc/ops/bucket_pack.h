// Pack and unpack from a pack plan (fusion/pack_plan.h) on the tensors' device: on the host
// with fusion/pack_cpu.*, on a GPU with one multi-tensor kernel launch per dtype pair (one per
// bucket, whose members share a dtype) on the current stream (cuda/pack_kernels.*).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "fusion/pack_plan.h"

namespace fluxmpi {

// flat[e.offset ...] = cast<wire>(members[e.member] * e.scale) for every entry of `plan`.
// members and flat as check_pack_tensors (fusion/pack_cpu.h) wants them, on one device. A CUDA
// flat buffer in a build without CUDA is a ValueError.
void pack(const PackPlan& plan, const std::vector<at::Tensor>& members, const at::Tensor& flat);

// members[e.member] = cast<dtype>(flat[e.offset ...] * e.unscale) for every entry.
void unpack(const PackPlan& plan, const at::Tensor& flat, const std::vector<at::Tensor>& members);

}  // namespace fluxmpi
