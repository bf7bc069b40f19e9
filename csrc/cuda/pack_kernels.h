// Multi-tensor copy kernels for fused buckets: one launch converts many spans (copy, scale by a
// factor, cast between float64, float32, float16 and bfloat16), their addresses and lengths in
// one small device table. ops/bucket_pack.* turns a pack plan (fusion/pack_plan.h) into spans;
// this file never sees a plan. CUDA builds only.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace fluxmpi {

// dst[j] = To(Op(src[j]) * scale) for j < numel, Op the source's math type (double for double,
// float otherwise). `src` and `dst` may be the same memory; other overlaps are not allowed.
struct CopySpan {
  const void* src = nullptr;
  void* dst = nullptr;
  std::int64_t numel = 0;
  double scale = 1.0;
};

// One kernel launch on `device`'s current stream for all `spans` (from -> to); nothing when
// spans is empty. The table travels host -> device on the same stream from pinned memory, so
// the launch never blocks the host. A plain copy (from == to, scale 1) of another dtype moves
// bytes.
void launch_copy_spans(const std::vector<CopySpan>& spans, c10::ScalarType from, c10::ScalarType to,
                       c10::Device device);

}  // namespace fluxmpi
