#include "ops/exact_shards.h"

#include <c10/util/Exception.h>

#include <utility>

#include "backend/select.h"
#include "ops/consensus.h"
#include "ops/exact_sum.h"
#include "runtime/group.h"

namespace fluxmpi {

std::shared_ptr<Work> start_exact_shard_bucket(std::int64_t index, std::int64_t plan,
                                               at::Tensor flat, at::Tensor rows, at::Tensor most,
                                               std::vector<ShardSegment> segments,
                                               std::string label) {
  const int world = current_group().size();
  const int rank = current_group().rank();
  // The Python caller builds all of these from its plan: a failure is our bug, not the user's.
  TORCH_INTERNAL_ASSERT(flat.device().is_cpu() && flat.is_contiguous() && flat.dim() == 1 &&
                        flat.numel() % world == 0);
  TORCH_INTERNAL_ASSERT(rows.device().is_cpu() && rows.is_contiguous() &&
                        rows.numel() == flat.numel() && rows.scalar_type() == flat.scalar_type());
  TORCH_INTERNAL_ASSERT(most.scalar_type() == c10::kDouble && most.is_contiguous() &&
                        most.numel() == static_cast<std::int64_t>(segments.size()));
  const std::int64_t shard = flat.numel() / world;
  for (const auto& s : segments)
    TORCH_INTERNAL_ASSERT(0 <= s.start && s.start < s.end && s.end <= shard);
  auto fn = [index, plan, flat, rows, most, segments = std::move(segments), world, rank, shard] {
    Signature sig;
    sig.kind = CallKind::ExactShardBucket;
    sig.dtype = static_cast<std::int64_t>(flat.scalar_type());
    sig.numel = flat.numel();
    sig.detail = plan;
    agree(sig, "DistributedOptimizer(deterministic=True)", "", [&] {
      return "bucket " + std::to_string(index + 1) + ": " + std::to_string(flat.numel()) + " " +
             std::string(c10::toString(flat.scalar_type())) + " values";
    });
    Backend& b = backend_for(flat);
    const auto bytes = static_cast<std::int64_t>(flat.element_size()) * shard;
    b.alltoall_equal(flat.const_data_ptr(), rows.data_ptr(), bytes, world);
    const at::Tensor all = rows.view({world, shard});
    const at::Tensor mine = all[rank];
    double* out = most.data_ptr<double>();
    for (std::size_t k = 0; k < segments.size(); ++k) {
      const auto& s = segments[k];
      out[k] = exact_sum_rows(all.slice(1, s.start, s.end), mine.slice(0, s.start, s.end), s.scale,
                              s.bound, s.divisor);
    }
    b.allgather(mine.const_data_ptr(), flat.data_ptr(), shard, flat.scalar_type());
  };
  return Engine::get().submit(std::move(label), std::move(fn));
}

}  // namespace fluxmpi
