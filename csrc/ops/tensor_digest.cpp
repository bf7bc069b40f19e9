#include "ops/tensor_digest.h"

#include <ATen/ATen.h>

#include "runtime/hash.h"

namespace fluxmpi {

namespace {

std::int64_t digest_of(const at::Tensor& t) {
  // Dtype and shape seed the hash: equal bytes under another shape are another tensor.
  std::vector<std::int64_t> head{static_cast<std::int64_t>(t.scalar_type())};
  for (auto s : t.sizes()) head.push_back(s);
  const std::int64_t seed = hash_bytes(head.data(), head.size() * sizeof(std::int64_t));
  if (t.numel() == 0) return seed;
  at::Tensor host = t.is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
  return hash_bulk(host.data_ptr(), static_cast<std::size_t>(host.nbytes()), seed);
}

}  // namespace

std::vector<std::int64_t> tensor_digests(const std::vector<at::Tensor>& tensors) {
  std::vector<std::int64_t> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(digest_of(t));
  return out;
}

}  // namespace fluxmpi
