#include "ops/sync_fast_path.h"

#include <algorithm>
#include <exception>

#include "ops/bytes_broadcast.h"
#include "ops/flat_storage.h"
#include "runtime/environment.h"
#include "runtime/group.h"

namespace fluxmpi {

namespace {

std::size_t direct_steps(const std::vector<BroadcastStep>& plan) {
  return static_cast<std::size_t>(
      std::count_if(plan.begin(), plan.end(), [](const BroadcastStep& s) { return s.direct; }));
}

}  // namespace

bool sync_fast_path(const std::vector<at::Tensor>& tensors, std::int64_t root,
                    std::int64_t structure_hash, bool needs_skeleton, ErrorClass err,
                    const std::string& err_text, const CoalescedOptions& opts,
                    SyncPlanCache& cache) {
  std::string msg = err_text;
  Signature s = object_signature(ObjectStage::Begin, root, err, msg);
  check_plan_options(opts.plan, s, msg);
  if (s.error == ErrorClass::None) msg = std::to_string(tensors.size()) + " tensors";
  // Shapes, dtypes, device types, paths and options in one number, compared in the same
  // allreduce as the call itself: equal everywhere means every rank's tensors line up with the
  // root's, so the data can move without a skeleton.
  const bool moves = current_group().size() > 1;  // a world of one moves no data: no probes
  try {
    s.soft = tensors_hash(tensors, plan_options_hash(opts.plan, structure_hash),
                          moves ? &cache.probes : nullptr);
  } catch (const std::exception& e) {
    // A tensor whose metadata cannot be read (a subclass, say): raised on every rank by the
    // agreement below, never on this rank alone, which would leave the others waiting.
    if (s.error == ErrorClass::None) {
      s.error = ErrorClass::Type;
      msg = std::string("reading the tensors failed: ") + e.what();
    }
  }
  s.soft_flag = needs_skeleton ? 1 : 0;
  if (s.error == ErrorClass::None && (!cache.valid || cache.key != s.soft)) {
    cache.plan = plan_broadcast(tensors, opts.plan);
    BroadcastPlanOptions packed_opts = opts.plan;
    packed_opts.pack_cpu = true;
    cache.packed = plan_broadcast(tensors, packed_opts);
    cache.has_packed = direct_steps(cache.packed) != direct_steps(cache.plan);
    cache.key = s.soft;
    cache.valid = true;
  }
  // With relocation, large CPU tensors may travel packed too, once relocated in place: fewer
  // broadcasts. Only if every rank holds every packed step in place (or can relocate it now);
  // a rank that cannot (someone holds one of its parameters' storage, say) vetoes, and all
  // take the plan that sends large tensors alone. Both plans come from the agreed shapes.
  // `relocate` is each rank's own argument, not part of the agreed hash: a rank that does not
  // pack (relocate=False) vetoes too, so that no rank takes the packed plan without it.
  const bool packing = opts.relocate && moves && s.error == ErrorClass::None;
  if (!packing || (cache.has_packed && !steps_in_place(tensors, cache.packed, cache.probes))) {
    s.veto = 1;
  }
  bool vetoed = false;
  if (!agree(s, kSyncWhat, msg, &vetoed)) return false;
  const bool packed = cache.has_packed && !vetoed;  // !vetoed: every rank is packing
  coalesced_broadcast_data(tensors, static_cast<int>(root), opts,
                           packed ? &cache.packed : &cache.plan, &cache.probes);
  return true;
}

}  // namespace fluxmpi
