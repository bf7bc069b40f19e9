// synchronize_'s first stage, for every call: agree on the call and compare every rank's
// structure hash in the same allreduce. When all are equal and no rank needs the root's
// non-tensor values, the tensors move right away (no skeleton travels, ops/bytes_broadcast.h);
// otherwise every rank learns it together and goes on to the skeleton stage.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fusion/broadcast_plan.h"
#include "ops/coalesced_broadcast.h"
#include "ops/consensus.h"

namespace fluxmpi {

// The broadcast plans kept with a tensor list between calls, valid for the hash they were made
// for (shapes, dtypes, options).
struct SyncPlanCache {
  std::int64_t key = 0;
  bool valid = false;
  std::vector<BroadcastStep> plan;    // large CPU tensors alone
  std::vector<BroadcastStep> packed;  // every CPU tensor packed (pack_cpu)
  bool has_packed = false;            // packed differs from plan
  std::vector<Probe> probes;          // this call's, kept only to reuse the allocation
};

// The fast path for `tensors` (this rank's, in the order of its walk, whose paths and kinds
// `structure_hash` covers). `needs_skeleton`: this rank holds values that only the root's
// skeleton can give it. `err` / `err_text`: this rank's local error, raised on every rank.
// Returns true when the tensors moved; false when every rank must go on to the skeleton.
// Must run inline on the engine or on its thread.
bool sync_fast_path(const std::vector<at::Tensor>& tensors, std::int64_t root,
                    std::int64_t structure_hash, bool needs_skeleton, ErrorClass err,
                    const std::string& err_text, const CoalescedOptions& opts,
                    SyncPlanCache& cache);

}  // namespace fluxmpi
