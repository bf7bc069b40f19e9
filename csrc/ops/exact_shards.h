// One bucket of the sharded exact sum (training/_exact_shards.py), as one item of engine work:
// the ranks agree on the bucket, then each shard's owner gets every rank's values of it, sums
// them exactly (exact_sum_parts, per parameter segment) and every rank gets every owner's
// result back into the bucket. On one host that goes through a shared-memory window
// (Backend::reduce_parts_by_owner: one copy in, one out); elsewhere an alltoall brings the
// values and an allgather the results, with the same owner's pass, hence the same bits.
// Queued as soon as the bucket's gradients are in, so it runs during the rest of backward;
// the engine runs its work in submission order, so every rank moves the buckets in the same
// order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace fluxmpi {

// The part of one parameter in this rank's shard, in shard coordinates [start, end), with that
// parameter's grid (exact_sum_rows' scale, bound and divisor).
struct ShardSegment {
  std::int64_t start;
  std::int64_t end;
  double scale;
  double bound;
  double divisor;
};

// Start bucket `index` on the current group (its world size W, this rank r): `pieces` (CPU,
// contiguous, of flat's dtype, not overlapping) hold this rank's gradients in order, W shards
// of `flat.numel() / W` values in all, and are reduced where they lie; `flat`, of that size,
// may hold some of them (a piece that is a view of flat at its place) and carries the others
// where no shared memory is used; `rows`, of flat's size and dtype,
// receives the ranks' values of shard r (row j from rank j) where no shared memory is used;
// every owner's result goes into every rank's pieces (the padding after the last segment: 0).
// `most[k]` (float64) receives the largest |x| that segment k read (NaN for a NaN). All of
// them stay untouched by the caller until the Work is done. The ranks first agree on the bucket's
// dtype, size and `plan` (the caller's hash of the bucket's index and parameter shapes): a
// mismatch raises on every rank from wait().
//
// Several backward passes a step (`passes` = k > 1): `pieces` hold the k passes' gradients,
// pass after pass (k * flat.numel() / k values: `flat` and `rows` are k times a pass's bucket,
// pass j's in their j-th k-th), moved in one exchange at the step's last pass; each owner sums
// the k * W values of each element of its shard in one pass (the sum is exact, so the bits
// are those of any other grouping), and the results land in the last pass's pieces alone.
std::shared_ptr<Work> start_exact_shard_bucket(std::int64_t index, std::int64_t plan,
                                               std::vector<at::Tensor> pieces, at::Tensor flat,
                                               at::Tensor rows, at::Tensor most,
                                               std::vector<ShardSegment> segments,
                                               std::string label, int passes = 1);

}  // namespace fluxmpi
