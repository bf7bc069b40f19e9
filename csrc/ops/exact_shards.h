// One bucket of the sharded exact sum (training/_exact_shards.py), as one item of engine work:
// the ranks agree on the bucket, an alltoall gives each rank every rank's values of its shard,
// the owner sums them exactly (exact_sum_rows, per parameter segment) and an allgather brings
// every owner's result back into the bucket. Queued as soon as the bucket's gradients are in,
// so the owner's pass and the allgather run during the rest of backward; the engine runs its
// work in submission order, so every rank moves the buckets in the same order.
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

// Start bucket `index` on the current group (its world size W, this rank r): `flat` holds this
// rank's gradients, W shards of `flat.numel() / W` values; `rows`, of flat's size and dtype,
// receives the ranks' values of shard r (row j from rank j); the owner's result goes to row r,
// then into every rank's `flat`. `most[k]` (float64) receives the largest |x| that segment k
// read (NaN for a NaN). All three stay untouched by the caller until the Work is done. The
// ranks first agree on the bucket's dtype, size and `plan` (the caller's hash of the bucket's
// index and parameter shapes): a mismatch raises on every rank from wait().
std::shared_ptr<Work> start_exact_shard_bucket(std::int64_t index, std::int64_t plan,
                                               at::Tensor flat, at::Tensor rows, at::Tensor most,
                                               std::vector<ShardSegment> segments,
                                               std::string label);

}  // namespace fluxmpi
