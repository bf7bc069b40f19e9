// One gradient bucket's collective, the engine work that GradientReducer
// (ops/gradient_reducer.h) launches per bucket, and the 16-bit compression a bucket may travel
// in (DistributedOptimizer's `compression`).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "fusion/bucket_plan.h"
#include "fusion/pack_plan.h"

namespace fluxmpi {

// How buckets travel: in the gradients' own dtype, or in 16 bits (float16 or bfloat16; the
// result comes back into the full-precision gradients).
enum class Compression { None, Fp16, Bf16 };

// DistributedOptimizer's `compression`: "" or "none" -> None, "fp16" or "float16" -> Fp16,
// "bf16" or "bfloat16" -> Bf16; a ValueError naming `name` otherwise.
Compression parse_compression(const std::string& name);

// "none", "fp16" or "bf16".
const char* compression_name(Compression c);

// The dtype a compressed bucket travels in; none without compression.
std::optional<c10::ScalarType> compressed_dtype(Compression c);

// What pack sees of tensors: complex values as pairs of reals (the plan scales and casts
// floating dtypes only).
std::vector<at::Tensor> real_views(const std::vector<at::Tensor>& ts);

// "" when parameter `p` (with gradient `g`, undefined when it has none) still fits the bucket
// `bk` it was planned into with `planned` elements; else what differs (a parameter resized
// since the plan, a gradient of another shape, dtype, device or layout), for the message of
// a rank that cannot reduce it.
std::string gradient_mismatch(const at::Tensor& p, const at::Tensor& g, const Bucket& bk,
                              std::int64_t planned);

// One bucket's collective, on the engine: `t` is what travels (complex as pairs), `wire` the
// 16-bit buffer of a fused compressed bucket (cast back into `unpack_into` by `unpack_plan`).
// `prescaled`: the bucket's pack multiplied every contribution by 1/world, so an "average"
// is summed; otherwise the backend averages.
void reduce_bucket(const at::Tensor& t, ReduceOp op, std::optional<c10::ScalarType> comp, int world,
                   bool prescaled, const at::Tensor& wire, const PackPlan& unpack_plan,
                   const std::vector<at::Tensor>& unpack_into);

}  // namespace fluxmpi
