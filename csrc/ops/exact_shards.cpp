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
                                               std::string label, int passes) {
  const int world = current_group().size();
  const int rank = current_group().rank();
  // The Python caller builds all of these from its plan: a failure is our bug, not the user's.
  TORCH_INTERNAL_ASSERT(passes >= 1 && flat.device().is_cpu() && flat.is_contiguous() &&
                        flat.dim() == 1 && flat.numel() % (world * passes) == 0);
  TORCH_INTERNAL_ASSERT(rows.device().is_cpu() && rows.is_contiguous() &&
                        rows.numel() == flat.numel() && rows.scalar_type() == flat.scalar_type());
  TORCH_INTERNAL_ASSERT(most.scalar_type() == c10::kDouble && most.is_contiguous() &&
                        most.numel() == static_cast<std::int64_t>(segments.size()));
  const std::int64_t bucket = flat.numel() / passes;  // one pass's values
  const std::int64_t shard = bucket / world;
  for (const auto& s : segments)
    TORCH_INTERNAL_ASSERT(0 <= s.start && s.start < s.end && s.end <= shard);
  std::int64_t total = 0;
  for (const auto& t : pieces) {
    TORCH_INTERNAL_ASSERT(t.device().is_cpu() && t.is_contiguous() &&
                          t.scalar_type() == flat.scalar_type());
    total += t.numel();
  }
  TORCH_INTERNAL_ASSERT(total == flat.numel());
  auto fn = [index, plan, pieces = std::move(pieces), flat, rows, most,
             segments = std::move(segments), world, rank, shard, bucket, passes] {
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
    std::fill(out, out + segments.size(), 0.0);
    // Elements [at, at + count) of this rank's shard: each segment's part of them summed on
    // its grid over every row (every rank's values of every pass); the padding after the last
    // segment (no parameter's) set to 0.
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
        const double found = exact_sum_parts(from, static_cast<char*>(sum) + skip, hi - lo, dtype,
                                             s.scale, s.bound, s.divisor);
        if (!std::isnan(out[k]) && (std::isnan(found) || found > out[k])) out[k] = found;
        covered = hi;
      }
      if (covered < at + count) {
        std::memset(static_cast<char*>(sum) + (covered - at) * elem, 0,
                    static_cast<std::size_t>((at + count - covered) * elem));
      }
    };
    std::vector<BufferPiece> parts_of_bucket;  // the gradients where they lie, in order
    for (const auto& t : pieces) {
      if (t.numel() > 0) parts_of_bucket.push_back({t.data_ptr(), t.numel() * elem});
    }
    if (b.reduce_parts_by_owner(parts_of_bucket, shard, dtype, pass, passes)) return;
    // No memory that all the ranks share: the same pass between an alltoall per pass and an
    // allgather, through `flat` (the pieces that are not views of it copied in, and the last
    // pass's out).
    auto* base = static_cast<char*>(flat.data_ptr());
    const std::int64_t last = (passes - 1) * bucket * elem;  // the last pass's bytes of flat
    auto each_apart = [&](bool last_pass_only, auto f) {
      std::int64_t at = 0;
      for (const auto& p : parts_of_bucket) {
        if (p.ptr != base + at && (!last_pass_only || at >= last))
          f(base + at, static_cast<char*>(p.ptr), p.bytes);
        at += p.bytes;
      }
    };
    each_apart(false, [](char* in_flat, char* piece, std::int64_t n) {
      std::memcpy(in_flat, piece, static_cast<std::size_t>(n));
    });
    auto* got = static_cast<char*>(rows.data_ptr());
    std::vector<const void*> parts;
    for (int s = 0; s < passes; ++s) {
      b.alltoall_equal(base + s * bucket * elem, got + s * bucket * elem, elem * shard, world);
      for (int j = 0; j < world; ++j) parts.push_back(got + (s * bucket + j * shard) * elem);
    }
    void* mine = got + (last + rank * shard * elem);
    pass(parts, mine, 0, shard);
    b.allgather(mine, base + last, shard, dtype);
    each_apart(true, [](char* in_flat, char* piece, std::int64_t n) {
      std::memcpy(piece, in_flat, static_cast<std::size_t>(n));
    });
  };
  return Engine::get().submit(std::move(label), std::move(fn));
}

}  // namespace fluxmpi
