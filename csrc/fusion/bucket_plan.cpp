#include "fusion/bucket_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace fluxmpi {

void check_bucket_options(const PlanOptions& opts) {
  // The messages name the Python arguments too: this is their only check.
  TORCH_CHECK_VALUE(opts.cap_bytes > 0, "bucket cap must be positive (bucket_cap_mb > 0), got ",
                    opts.cap_bytes, " bytes");
  TORCH_CHECK_VALUE(opts.first_cap_bytes >= 0,
                    "first bucket cap must be positive, or 0 for none (first_bucket_cap_mb > 0, "
                    "or None), got ",
                    opts.first_cap_bytes, " bytes");
  TORCH_CHECK_VALUE(opts.direct_min_bytes > 0 && opts.cuda_direct_min_bytes > 0,
                    "direct_min_bytes must be positive, got ", opts.direct_min_bytes,
                    " (host) and ", opts.cuda_direct_min_bytes, " (CUDA: cuda_direct_min_bytes)");
}

std::vector<Bucket> plan_buckets(const std::vector<TensorMeta>& tensors, const PlanOptions& opts,
                                 std::int64_t element_bytes, bool direct) {
  check_bucket_options(opts);
  TORCH_CHECK_VALUE(element_bytes >= 0,
                    "element_bytes must be positive, or 0 for each dtype's own size, got ",
                    element_bytes);
  std::vector<Bucket> out;
  // One open fused bucket per (dtype, device); it is closed into `out` when full. `closed`
  // counts each key's closed buckets: the first closes at first_cap_bytes when that is set.
  std::map<std::pair<int, std::string>, Bucket> open;
  std::map<std::pair<int, std::string>, int> closed;
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(tensors.size()); ++i) {
    const auto& t = tensors[i];
    const auto esz =
        element_bytes > 0 ? element_bytes : static_cast<std::int64_t>(c10::elementSize(t.dtype));
    const auto direct_min = t.device.is_cuda() ? opts.cuda_direct_min_bytes : opts.direct_min_bytes;
    if (direct && t.numel * esz >= direct_min) {
      out.push_back(Bucket{{i}, {0}, t.dtype, t.device, t.numel, true});
      continue;
    }
    auto key = std::make_pair(static_cast<int>(t.dtype), t.device.str());
    auto it = open.find(key);
    if (it == open.end()) it = open.emplace(key, Bucket{{}, {}, t.dtype, t.device, 0, false}).first;
    Bucket& b = it->second;
    int& done = closed[key];
    const auto cap = done == 0 && opts.first_cap_bytes > 0 ? opts.first_cap_bytes : opts.cap_bytes;
    if (!b.members.empty() && (b.numel + t.numel) * esz > cap) {
      out.push_back(std::move(b));
      b = Bucket{{}, {}, t.dtype, t.device, 0, false};
      ++done;
    }
    b.members.push_back(i);
    b.offsets.push_back(b.numel);
    b.numel += t.numel;
  }
  // Flush the still-open buckets in the order of their first member, for a stable plan.
  std::vector<Bucket*> rest;
  for (auto& kv : open)
    if (!kv.second.members.empty()) rest.push_back(&kv.second);
  std::sort(rest.begin(), rest.end(),
            [](const Bucket* a, const Bucket* b) { return a->members[0] < b->members[0]; });
  for (auto* b : rest) out.push_back(std::move(*b));
  return out;
}

}  // namespace fluxmpi
