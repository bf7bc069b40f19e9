// synchronize_'s data movement: many tensors go from the root to every rank in the few
// broadcasts that the broadcast planner (fusion/broadcast_plan.h) lays out. Large contiguous
// tensors travel from and into their own memory (no copy on any rank); small ones are packed
// into flat byte buffers. Parameters relocated into flat storage (ops/flat_storage.h) are
// packed whatever their size, when every rank holds them in place (synchronize_'s fast path,
// ops/sync_fast_path.h, votes on it).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fusion/broadcast_plan.h"
#include "ops/consensus.h"

namespace fluxmpi {

struct CoalescedOptions {
  BroadcastPlanOptions plan;  // how the tensors are laid out in broadcasts
  // Move parameters that nothing else references into flat storage laid out like their
  // packed buffer, so that later broadcasts read and write them in place
  // (ops/flat_storage.h).
  bool relocate = false;
};

// Bytes this process copied into or out of packed buffers, and bytes of packed buffers it
// broadcast in place (a relocated home), since it started. For tests and benchmarks.
struct CopyCounters {
  std::int64_t copied = 0;
  std::int64_t in_place = 0;
};
CopyCounters copy_counters();

// This rank's part of the agreement on `opts` (a caller's Signature): unless `s` carries an
// error already, a ValueError when bucket_bytes or direct_bytes is not positive.
void check_plan_options(const BroadcastPlanOptions& opts, Signature& s, std::string& msg);

// Data movement only: the root's tensors' bytes into every rank's tensors of the same
// position, in place. Callers have agreed that all ranks hold the same shapes and dtypes.
// Must run inline on the engine or on its thread.
// `plan`, when given, is plan_broadcast(tensors, opts.plan), computed by the caller (a cache);
// `probes`, when given, come from tensors_hash on these tensors, since which nothing changed.
void coalesced_broadcast_data(const std::vector<at::Tensor>& tensors, int root,
                              const CoalescedOptions& opts,
                              const std::vector<BroadcastStep>* plan = nullptr,
                              const std::vector<Probe>* probes = nullptr);

// Agree first (kind CoalescedBroadcast: root, tensor count, shapes, and this rank's error
// `err` with message `err_text`, which raises on every rank), then move the data.
void coalesced_broadcast_checked(const std::vector<at::Tensor>& tensors, std::int64_t root,
                                 ErrorClass err, const std::string& err_text,
                                 const CoalescedOptions& opts);

}  // namespace fluxmpi
