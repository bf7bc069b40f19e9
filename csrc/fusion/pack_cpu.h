// Pack and unpack on the host, from a pack plan (fusion/pack_plan.h): one pass per member that
// copies, scales and casts in the same loop. cuda/pack_kernels.* does the same on a GPU, in one
// launch per plan; ops/bucket_pack.* picks between them by device.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "fusion/pack_plan.h"

namespace fluxmpi {

// Checks that `members` (one tensor per plan member: contiguous, of the entry's dtype and
// length) and `flat` (contiguous, of the wire dtype, at least plan.numel long) fit `plan` and
// share one device. A ValueError names the first that does not; `what` starts the message.
void check_pack_tensors(const PackPlan& plan, const std::vector<at::Tensor>& members,
                        const at::Tensor& flat, const char* what);

// flat[e.offset ...] = members[e.member] * e.scale, cast to the wire dtype, for every entry.
// Bytes between entries are left as they are. Host tensors; checked with check_pack_tensors.
void pack_cpu(const PackPlan& plan, const std::vector<at::Tensor>& members, const at::Tensor& flat);

// members[e.member] = flat[e.offset ...] * e.unscale, cast to the member's dtype.
void unpack_cpu(const PackPlan& plan, const at::Tensor& flat,
                const std::vector<at::Tensor>& members);

}  // namespace fluxmpi
