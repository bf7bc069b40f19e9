// Prefetching the metadata that a pass over many parameters' gradients reads (the gradient
// reducer's per-step pass): per parameter its TensorImpl, its autograd metadata and its
// gradient's TensorImpl, three dependent loads, each a cache miss where 1000 small parameters
// lie scattered over the heap (docs/measurements.md, "Gradient reduction alone").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace fluxmpi {

// Called before visiting params[i]: starts loading what the visits of the next few parameters
// read, each stage from what an earlier call prefetched (a pipeline, so the misses overlap).
inline void prefetch_grad_path(const std::vector<at::Tensor>& params, std::size_t i) {
  constexpr std::size_t kImpl = 12, kMeta = 8, kGrad = 4;  // parameters ahead
  auto lines = [](const void* p, std::size_t bytes) {
    for (std::size_t off = 0; off < bytes; off += 64) {
      __builtin_prefetch(static_cast<const char*>(p) + off);
    }
  };
  const std::size_t n = params.size();
  if (i + kImpl < n) lines(params[i + kImpl].unsafeGetTensorImpl(), sizeof(c10::TensorImpl));
  if (i + kMeta < n) {
    if (const auto* meta = params[i + kMeta].unsafeGetTensorImpl()->autograd_meta()) {
      lines(meta, 128);
    }
  }
  if (i + kGrad < n) {
    const at::Tensor& g = params[i + kGrad].unsafeGetTensorImpl()->grad();
    if (g.defined()) lines(g.unsafeGetTensorImpl(), sizeof(c10::TensorImpl));
  }
}

}  // namespace fluxmpi
