#include "ops/join.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <vector>

#include "backend/select.h"
#include "ops/collectives.h"
#include "ops/consensus.h"
#include "ops/gather_collectives.h"
#include "runtime/group.h"

namespace fluxmpi {

namespace {

// The joined rank's part in an allreduce the active ranks agreed on: zeros of what they move.
void shadow_allreduce(const Signature& agreed, int world) {
  AllreduceParts p;
  share_with_joined(p, /*is_joined=*/true);
  // torch's PREMUL_SUM and a sum in gloo's order sign as their own ops; the active ranks
  // then sum (their scaled copies), in the agreed order.
  const ReduceOp op = signature_reduce_op(agreed.op);
  const SumOrder order = signature_sum_order(agreed.op);
  for (const auto& part : p.parts) {
    at::Tensor zeros =
        at::zeros({part.numel}, at::TensorOptions().dtype(part.dtype).device(p.device));
    if (part.list) {
      grouped_allreduce_zeros(backend_for(zeros), zeros, op, world);
    } else {
      allreduce_data(backend_for(zeros), zeros, op, world, HalfReduction::Fp32, order);
    }
  }
}

// Every rank has joined: the one that joined last (at the latest agreement; the highest rank
// on a tie).
std::int64_t last_to_join(std::int64_t joined_at, int size) {
  std::vector<std::int64_t> all(size);
  mpi_backend().allgather(&joined_at, all.data(), 1, c10::kLong);
  int last = 0;
  for (int r = 1; r < size; ++r) {
    if (all[r] >= all[last]) last = r;
  }
  return last;
}

}  // namespace

JoinRound join_round(std::int64_t index) {
  const Group& g = current_group();
  Signature s;
  s.kind = CallKind::JoinRound;
  s.joinable = Joinable::Round;
  s.soft = index;
  bool joined = false;
  JoinRound out;
  out.same_index = agree(s, "join round", "", nullptr, &joined);
  out.count = g.size();
  if (joined) {  // the joined ranks count 0
    std::int64_t active = 1;
    mpi_backend().allreduce(&active, 1, c10::kLong, ReduceOp::Sum);
    out.count = active;
  }
  return out;
}

JoinEvent join_wait(bool rigid, bool first) {
  const Group& g = current_group();
  static std::int64_t joined_at = 0;  // one join at a time per process
  if (first && g.is_world()) joined_at = world_agreements();
  JoinEvent out;
  if (g.size() == 1) {
    out.last_rank = g.world_ranks()[0];
    return out;
  }
  while (true) {
    JoinedView view;
    try {
      view = agree_as_joined(rigid);
    } catch (const RaisedOnEveryRank&) {
      if (rigid) throw;
      continue;  // the active ranks raised; this rank keeps waiting (Horovod's semantics)
    }
    if (view.all_joined) {  // on a process set: only its members have joined
      if (g.is_world()) out.last_rank = last_to_join(joined_at, g.size());
      return out;
    }
    if (view.sig.joinable == Joinable::Round) {
      std::int64_t active = 0;
      mpi_backend().allreduce(&active, 1, c10::kLong, ReduceOp::Sum);
      out.count = active;
      out.index = view.sig.soft;
      out.same_index = view.soft_same;
      return out;
    }
    shadow_allreduce(view.sig, g.size());
  }
}

}  // namespace fluxmpi
