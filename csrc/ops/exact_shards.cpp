#include "ops/exact_shards.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/select.h"
#include "ops/consensus.h"
#include "ops/exact_sum.h"
#include "runtime/group.h"

namespace fluxmpi {

std::shared_ptr<Work> start_exact_shard_bucket(std::int64_t index, std::int64_t plan,
                                               std::vector<at::Tensor> pieces, at::Tensor flat,
                                               at::Tensor rows, at::Tensor most,
                                               std::vector<ShardSegment> segments,
                                               std::string label,
                                               std::optional<ShardPasses> passes) {
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
  std::int64_t total = 0;
  for (const auto& t : pieces) {
    TORCH_INTERNAL_ASSERT(t.device().is_cpu() && t.is_contiguous() &&
                          t.scalar_type() == flat.scalar_type());
    total += t.numel();
  }
  TORCH_INTERNAL_ASSERT(total == flat.numel());
  if (passes) {
    TORCH_INTERNAL_ASSERT(passes->acc.scalar_type() == c10::kLong && passes->acc.is_contiguous() &&
                          passes->acc.numel() == shard);
    TORCH_INTERNAL_ASSERT(passes->bounds.scalar_type() == c10::kDouble &&
                          passes->bounds.is_contiguous() &&
                          passes->bounds.numel() == exact_accumulator_blocks(shard));
  }
  auto fn = [index, plan, pieces = std::move(pieces), flat, rows, most,
             segments = std::move(segments), world, rank, shard, passes] {
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
    const auto dtype = flat.scalar_type();
    const auto elem = static_cast<std::int64_t>(flat.element_size());
    double* out = most.data_ptr<double>();
    std::int64_t* acc = passes ? passes->acc.data_ptr<std::int64_t>() : nullptr;
    double* bounds = passes ? passes->bounds.data_ptr<double>() : nullptr;
    const bool results_back = !passes || passes->last;
    if (!passes || passes->first) std::fill(out, out + segments.size(), 0.0);
    if (passes && passes->first) {
      std::fill(acc, acc + shard, std::int64_t(0));
      std::fill(bounds, bounds + passes->bounds.numel(), 0.0);
    }
    // Elements [at, at + count) of this rank's shard: each segment's part of them summed on
    // its grid; the padding after the last segment (no parameter's) set to 0.
    auto pass = [&](const std::vector<const void*>& parts, void* sum, std::int64_t at,
                    std::int64_t count) {
      std::vector<const void*> from(parts.size());
      std::int64_t covered = at;
      for (std::size_t k = 0; k < segments.size(); ++k) {
        const auto& s = segments[k];
        const std::int64_t lo = std::max(s.start, at), hi = std::min(s.end, at + count);
        if (lo >= hi) continue;
        const std::int64_t skip = (lo - at) * elem;
        for (std::size_t j = 0; j < parts.size(); ++j)
          from[j] = static_cast<const char*>(parts[j]) + skip;
        // one pass a step: sum and convert; several: add into the owner's sums, converted
        // (into `sum`) at the last
        const double found =
            acc == nullptr
                ? exact_sum_parts(from, static_cast<char*>(sum) + skip, hi - lo, dtype, s.scale,
                                  s.bound, s.divisor)
                : exact_accumulate_parts(from, acc, bounds, shard, lo, hi - lo,
                                         results_back ? static_cast<char*>(sum) + skip : nullptr,
                                         dtype, s.scale, s.bound, s.divisor);
        if (!std::isnan(out[k]) && (std::isnan(found) || found > out[k])) out[k] = found;
        covered = hi;
      }
      if (results_back && covered < at + count) {
        std::memset(static_cast<char*>(sum) + (covered - at) * elem, 0,
                    static_cast<std::size_t>((at + count - covered) * elem));
      }
    };
    std::vector<BufferPiece> parts_of_bucket;  // the gradients where they lie, in order
    for (const auto& t : pieces) {
      if (t.numel() > 0) parts_of_bucket.push_back({t.data_ptr(), t.numel() * elem});
    }
    if (b.reduce_parts_by_owner(parts_of_bucket, shard, dtype, pass, results_back)) return;
    // No memory that all the ranks share: the same pass between an alltoall and an allgather,
    // through `flat` (the pieces that are not views of it copied in, and the results out).
    auto* base = static_cast<char*>(flat.data_ptr());
    auto each_apart = [&](auto f) {
      std::int64_t at = 0;
      for (const auto& p : parts_of_bucket) {
        if (p.ptr != base + at) f(base + at, static_cast<char*>(p.ptr), p.bytes);
        at += p.bytes;
      }
    };
    each_apart([](char* in_flat, char* piece, std::int64_t n) {
      std::memcpy(in_flat, piece, static_cast<std::size_t>(n));
    });
    b.alltoall_equal(base, rows.data_ptr(), elem * shard, world);
    std::vector<const void*> parts;
    for (int j = 0; j < world; ++j)
      parts.push_back(static_cast<const char*>(rows.const_data_ptr()) + j * shard * elem);
    void* mine = static_cast<char*>(rows.data_ptr()) + rank * shard * elem;
    pass(parts, mine, 0, shard);
    if (!results_back) return;  // the owners keep their sums until the step's last pass
    b.allgather(mine, base, shard, dtype);
    each_apart([](char* in_flat, char* piece, std::int64_t n) {
      std::memcpy(piece, in_flat, static_cast<std::size_t>(n));
    });
  };
  return Engine::get().submit(std::move(label), std::move(fn));
}

}  // namespace fluxmpi
