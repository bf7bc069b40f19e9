#include "fusion/broadcast_plan.h"

#include <c10/core/TensorImpl.h>

#include <map>

#include "runtime/hash.h"

namespace fluxmpi {

std::vector<BroadcastStep> plan_broadcast(const std::vector<at::Tensor>& tensors,
                                          const BroadcastPlanOptions& opts) {
  std::vector<BroadcastStep> steps;
  std::map<c10::DeviceType, std::size_t> open;  // the bucket still filling, per device type
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    std::int64_t n = nbytes_of(t);
    if (n == 0) continue;
    auto dev = t.device().type();
    bool large = n >= opts.direct_bytes && !(opts.pack_cpu && dev == c10::DeviceType::CPU);
    if (large || align_up(n) > opts.bucket_bytes) {
      steps.push_back({true, dev, {i}, n});
      continue;
    }
    auto it = open.find(dev);
    if (it == open.end() || steps[it->second].bytes + align_up(n) > opts.bucket_bytes) {
      steps.push_back({false, dev, {}, 0});
      it = open.insert_or_assign(dev, steps.size() - 1).first;
    }
    auto& s = steps[it->second];
    s.members.push_back(i);
    s.bytes += align_up(n);
  }
  return steps;
}

std::int64_t tensors_hash(const std::vector<at::Tensor>& tensors, std::int64_t seed,
                          std::vector<Probe>* probes) {
  // Word by word (hash_bytes goes byte by byte: ~35 us for a thousand tensors' shapes).
  std::uint64_t h = static_cast<std::uint64_t>(hash_bytes(nullptr, 0, seed));
  auto mix = [&h](std::uint64_t w) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  };
  // Each TensorImpl (176 bytes, 3 or 4 cache lines) is read from memory when the model is
  // cold in cache (a thousand of them took ~40 us); fetching a few ahead overlaps the misses.
  constexpr std::size_t kAhead = 8;
  auto prefetch = [&](std::size_t i) {
    if (i < tensors.size() && tensors[i].defined()) {
      const char* p = reinterpret_cast<const char*>(tensors[i].unsafeGetTensorImpl());
      constexpr std::size_t last = sizeof(c10::TensorImpl) - 1;
      __builtin_prefetch(p);
      __builtin_prefetch(p + 64);
      __builtin_prefetch(p + 128);
      __builtin_prefetch(p + last);
    }
  };
  if (probes != nullptr) probes->assign(tensors.size(), Probe{});
  for (std::size_t i = 0; i < kAhead; ++i) prefetch(i);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    prefetch(i + kAhead);
    const auto& t = tensors[i];
    if (!t.defined()) {
      mix(~std::uint64_t(0));
      continue;
    }
    mix(static_cast<std::uint64_t>(t.dim()));
    for (auto d : t.sizes()) mix(static_cast<std::uint64_t>(d));
    mix(static_cast<std::uint64_t>(t.scalar_type()) << 8 |
        static_cast<std::uint64_t>(t.device().type()));
    if (probes != nullptr) {
      Probe& p = (*probes)[i];
      p.nbytes = nbytes_of(t);
      const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
      if (impl->is_cpu() && impl->has_storage() && impl->is_contiguous()) {
        const c10::StorageImpl* st = impl->unsafe_storage().unsafeGetStorageImpl();
        p.storage = st;
        p.data = static_cast<const char*>(st->data()) + impl->storage_offset() * impl->itemsize();
      }
    }
  }
  return static_cast<std::int64_t>(h >> 1);
}

std::int64_t plan_options_hash(const BroadcastPlanOptions& opts, std::int64_t seed) {
  const std::int64_t o[2] = {opts.bucket_bytes, opts.direct_bytes};
  return hash_bytes(o, sizeof(o), seed);
}

}  // namespace fluxmpi
