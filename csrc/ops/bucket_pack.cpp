#include "ops/bucket_pack.h"

#include <c10/util/Exception.h>

#include <map>
#include <utility>

#include "fusion/pack_cpu.h"

#ifdef FLUXMPI_WITH_CUDA
#include "cuda/pack_kernels.h"
#endif

namespace fluxmpi {

namespace {

#ifdef FLUXMPI_WITH_CUDA
// The plan's entries as kernel spans, one launch per (from, to) pair: a gradient bucket has one
// dtype, so one launch; `into` packs (member -> flat), else unpacks.
void run_on_gpu(const PackPlan& plan, const std::vector<at::Tensor>& members,
                const at::Tensor& flat, bool into) {
  auto* base = static_cast<char*>(flat.data_ptr());
  const auto wsz = static_cast<std::int64_t>(c10::elementSize(plan.wire));
  std::map<c10::ScalarType, std::vector<CopySpan>> by_dtype;
  for (const auto& e : plan.entries) {
    void* slot = base + e.offset * wsz;
    void* t = members[e.member].data_ptr();
    auto& spans = by_dtype[e.dtype];
    if (into) {
      spans.push_back({t, slot, e.numel, e.scale});
    } else {
      spans.push_back({slot, t, e.numel, e.unscale});
    }
  }
  for (const auto& [dtype, spans] : by_dtype) {
    launch_copy_spans(spans, into ? dtype : plan.wire, into ? plan.wire : dtype, flat.device());
  }
}
#endif

void run(const PackPlan& plan, const std::vector<at::Tensor>& members, const at::Tensor& flat,
         bool into) {
  const char* what = into ? "pack" : "unpack";
  check_pack_tensors(plan, members, flat, what);
  if (flat.is_cpu()) {
    if (into) {
      pack_cpu(plan, members, flat);
    } else {
      unpack_cpu(plan, flat, members);
    }
    return;
  }
#ifdef FLUXMPI_WITH_CUDA
  if (flat.is_cuda()) {
    run_on_gpu(plan, members, flat, into);
    return;
  }
#endif
  TORCH_CHECK_VALUE(false, what, ": no kernels for tensors on ", flat.device(),
                    " in this build (CPU, and CUDA when built with it)");
}

}  // namespace

void pack(const PackPlan& plan, const std::vector<at::Tensor>& members, const at::Tensor& flat) {
  run(plan, members, flat, true);
}

void unpack(const PackPlan& plan, const at::Tensor& flat, const std::vector<at::Tensor>& members) {
  run(plan, members, flat, false);
}

}  // namespace fluxmpi
