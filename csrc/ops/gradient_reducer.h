// The fused gradient allreduce behind DistributedOptimizer and allreduce_gradients.
//
// Per step: a cheap agreement (same parameter plan on every rank), then one collective per
// bucket in plan order, each launched on the engine thread as soon as its gradients are ready
// and every earlier bucket has been launched (so all ranks issue the same sequence even when
// some rank lacks a gradient), then at finalize() the rest, and one small allreduce of which
// parameters had gradients anywhere, so that a gradient missing on some ranks reduces with
// zeros and a gradient missing on every rank stays None.
//
// Zero copy: a large gradient (a direct bucket) is reduced in its own storage; small gradients
// live as views of their fused bucket's flat buffer (p.grad is re-pointed there the first time
// and stays there while the user zeroes in place; after zero_grad(set_to_none=True) the new
// gradient is copied in once).
//
// A fused bucket moves its data with one pack and, when compressed, one unpack, both driven by
// the bucket's pack plan (fusion/pack_plan.h): pack copies the fresh gradients in, applies a
// 16-bit wire's 1/world ("average") and the cast to the wire dtype in one pass (one kernel
// launch on a GPU, on the stream that produced the gradients); unpack casts the reduced values
// back into the slots. A float or double bucket's "average" is the backend's, with no pass of
// its own (the ring divides in its last step).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "fusion/bucket_plan.h"
#include "fusion/pack_plan.h"
#include "ops/bucket_reduce.h"
#include "ops/consensus.h"
#include "ops/stream_order.h"
#include "runtime/engine.h"
#include "runtime/group.h"

namespace fluxmpi {

struct ReducerOptions {
  PlanOptions plan;
  ReduceOp op = ReduceOp::Average;
  Compression compression = Compression::None;
  std::int64_t plan_hash = 0;  // identity of the parameter list, checked per step
};

class GradientReducer {
 public:
  GradientReducer(std::vector<at::Tensor> params, ReducerOptions opts);

  // The gradient of params[i] is final for this step (a post-accumulate hook calls this).
  // `local_error`: the hook's own error on this rank. Such an error, or a gradient this rank
  // cannot reduce (see gradient_mismatch), never raises here, in backward, on this rank alone:
  // the parameter reduces as zeros, every rank issues the same collectives, and finalize()
  // raises the error on every rank, naming this rank and the parameter.
  void mark_ready(std::int64_t i, const std::string& local_error = "");
  // Finish the step: launch what is left (zeros for missing grads), wait for everything,
  // settle which grads exist. Blocks; the caller releases the GIL. Rethrows the first error.
  // `flag` rides along in the step's last allreduce (a byte, "max"): returns whether any
  // rank passed true (the caller's "my plan changed"), at no extra collective. An empty
  // plan makes no collective at all and returns `flag` as is. `local_error`: this rank's
  // error in the call (a bad argument of step()), raised on every rank as the noted ones,
  // as an exception of `error_class`.
  bool finalize(bool flag = false, const std::string& local_error = "",
                ErrorClass error_class = ErrorClass::Runtime);

  // Remember these tensors (a caller's candidates for the plan, frozen ones included) and
  // their requires_grad now; requires_grad_changed() then tells, at C speed (the Python
  // attribute costs ~0.2 us a tensor), whether any flipped since.
  void watch_requires_grad(std::vector<at::Tensor> tensors);
  bool requires_grad_changed() const;

  // Name the parameters (same order as the constructor's) for stall reports: each bucket's
  // collective is then labelled "gradient bucket 2 of 5: fc.weight, fc.bias".
  void name_parameters(const std::vector<std::string>& names);

  std::int64_t num_buckets() const { return static_cast<std::int64_t>(buckets_.size()); }
  const std::vector<Bucket>& plan() const { return buckets_; }
  // Buckets launched before finalize() in the last step: the overlap with backward.
  std::int64_t launched_early() const { return launched_early_; }

 private:
  // The group current at construction (runtime/group.h): every step reduces over it.
  std::shared_ptr<const Group> group_ = current_group_ptr();
  struct BucketState {
    at::Tensor flat;                // fused buckets: the flat buffer that grads view
    std::vector<at::Tensor> slots;  // fused: a view per member, shaped like the param
    // Fused: what pack reads this step, one per member: a fresh gradient, or undefined for
    // the member's slot, where the gradient accumulated (pack then scales it in place).
    std::vector<at::Tensor> sources;
    // Fused: member k's gradient was fresh this step; p.grad keeps the local gradient until
    // finalize() points it at its slot, which then holds the reduced value.
    std::vector<std::uint8_t> fresh;
    at::Tensor wire;         // fused, compressed: the 16-bit buffer that travels
    PackPlan pack;           // fused: members -> flat (or wire), with the average's 1/world
    bool prescaled = false;  // fused: pack scales by 1/world (a 16-bit wire's "average")
    std::shared_ptr<StreamHandOff> order;  // GPU: the bucket's producer and end (stream marks)
    int pending = 0;                       // members not yet ready this step
    bool launched = false;
    std::shared_ptr<Work> work;
  };

  void open_step();   // reset_step, then the agreement
  void reset_step();  // a new step's bookkeeping, no collective
  // The step's agreement (engine work): `unclear` is its soft flag, `local_error` this
  // rank's error (raised on every rank); *all_clear_ tells whether no rank raised the flag.
  void agree_step(bool unclear, const std::string& local_error);
  // finalize(): params_[i]'s gradient is final; returns whether this rank has one.
  bool settle(std::size_t i);
  // Put params_[i]'s grad where its bucket reduces it; returns whether this rank has one.
  // A gradient that cannot be reduced, or a `hook_error`, is noted (note_error) and reduces
  // as zeros of the planned size.
  bool prepare(std::int64_t i, const std::string& hook_error = "");
  void note_error(std::int64_t i, const std::string& why);
  // params_[i] for messages: its name where it has one (the user's, or param_groups[g][i]),
  // else its index (the plan's order, which a user does not see).
  std::string param_label(std::int64_t i) const;
  // Every rank, after this step's collectives: raises where some rank noted an error.
  void raise_noted_errors(bool some_rank_failed);
  void launch(std::int64_t b);
  void launch_ready();
  // Engine work of this step: submitted, or run now on this thread when run_inline_.
  std::shared_ptr<Work> start(std::string label, std::function<void()> fn);
  at::Tensor bucket_tensor(std::int64_t b);

  std::vector<at::Tensor> params_;
  ReducerOptions opts_;
  std::vector<Bucket> buckets_;
  std::vector<std::int64_t> bucket_of_;  // param index -> bucket index
  std::vector<std::int64_t> slot_of_;    // param index -> its place among the bucket's members
  std::vector<BucketState> state_;
  std::vector<std::string> labels_;               // per bucket, the engine work's label
  std::vector<std::string> names_;                // per parameter, for messages (may be empty)
  std::string local_error_;                       // this step's first noted error on this rank
  ErrorClass local_class_ = ErrorClass::Runtime;  // the class it is raised as
  std::vector<std::uint8_t> present_;             // this rank had a gradient for param i this step
  std::vector<std::uint8_t> ready_;               // mark_ready seen for param i this step
  std::vector<at::Tensor> zeros_;                 // direct params missing here: reduced from zeros
  std::vector<at::Tensor> watched_;               // see watch_requires_grad
  std::vector<std::uint8_t> watched_flags_;
  std::int64_t next_launch_ = 0;
  std::int64_t launched_early_ = 0;
  bool step_open_ = false;
  bool all_host_ = false;    // every bucket on the host (see finalize: the inline step)
  bool run_inline_ = false;  // this step's collectives run on the calling thread (start)
  std::shared_ptr<Work> agree_work_;
  std::shared_ptr<bool> all_clear_;  // set by the agreement's work (see agree_step)
  std::shared_ptr<std::atomic<bool>> failed_;
  std::mutex mu_;
};

}  // namespace fluxmpi
