#include "ops/gradient_reducer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <optional>

#include "backend/select.h"
#include "ops/bucket_pack.h"
#include "ops/bucket_reduce.h"
#include "ops/collectives.h"
#include "ops/consensus.h"
#include "ops/grad_prefetch.h"
#include "runtime/environment.h"
#include "runtime/group.h"
#include "runtime/user_call.h"

namespace fluxmpi {

// The user call that the reduction belongs to, for messages: backward's hooks run outside any
// named call, and the reduction they start is DistributedOptimizer.step()'s (allreduce_gradients
// names itself first).
constexpr const char* kUserCall = "DistributedOptimizer.step()";

GradientReducer::GradientReducer(std::vector<at::Tensor> params, ReducerOptions opts)
    : params_(std::move(params)), opts_(opts) {
  current_group();  // "call Init first"
  std::vector<TensorMeta> metas;
  metas.reserve(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    std::string msg;
    // Complex parameters reduce as pairs of reals (their sum and average are the pairs').
    auto err = validate_tensor(as_pairs(p), msg);
    if (err != ErrorClass::None) raise_error(err, "parameter " + std::to_string(i) + ": " + msg);
    TORCH_CHECK_TYPE(!p.is_complex() || opts_.op == ReduceOp::Sum || opts_.op == ReduceOp::Average,
                     "parameter ", i, " is ", p.scalar_type(),
                     ": complex gradients reduce with sum or average only, not ",
                     op_name(opts_.op));
    metas.push_back({p.scalar_type(), p.device(), p.numel()});
  }
  buckets_ = plan_buckets(metas, opts_.plan);
  bucket_of_.assign(params_.size(), -1);
  slot_of_.assign(params_.size(), -1);
  state_.resize(buckets_.size());
  const int world = current_group().size();
  const bool average = opts_.op == ReduceOp::Average && world > 1;
  const auto comp = compressed_dtype(opts_.compression);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const auto& bk = buckets_[b];
    for (std::size_t k = 0; k < bk.members.size(); ++k) {
      bucket_of_[bk.members[k]] = static_cast<std::int64_t>(b);
      slot_of_[bk.members[k]] = static_cast<std::int64_t>(k);
    }
    if (bk.direct) continue;
    auto& st = state_[b];
    st.flat = at::zeros({bk.numel}, at::TensorOptions().dtype(bk.dtype).device(bk.device));
    for (std::size_t k = 0; k < bk.members.size(); ++k) {
      const auto& p = params_[bk.members[k]];
      st.slots.push_back(st.flat.narrow(0, bk.offsets[k], p.numel()).view(p.sizes()));
    }
    st.sources.resize(bk.members.size());
    st.fresh.assign(bk.members.size(), 0);
    const auto real = c10::toRealValueType(bk.dtype);
    const std::int64_t per = c10::isComplexType(bk.dtype) ? 2 : 1;
    std::vector<PackSource> sources;
    for (auto i : bk.members) sources.push_back({real, params_[i].numel() * per, 1.0});
    const auto wire = comp && *comp != real ? *comp : real;
    // "average" of a 16-bit wire pre-scales every contribution by 1/world in the pack (so the
    // sum cannot overflow), on every rank alike; a float or double bucket is averaged by the
    // backend instead (the ring divides in its last step), which saves a pass over the bucket.
    // (On CUDA the pack kernel keeps scaling every bucket: the backend's average of a fused
    // CUDA bucket has not run on a GPU.)
    st.prescaled =
        average && (bk.device.is_cuda() || (wire != c10::kFloat && wire != c10::kDouble));
    if (st.prescaled) {
      for (auto& src : sources) src.scale = 1.0 / world;
    }
    st.pack = plan_pack(sources, wire);
    if (wire != real) st.wire = at::zeros({st.pack.numel}, st.flat.options().dtype(wire));
  }
  all_host_ = std::all_of(buckets_.begin(), buckets_.end(),
                          [](const Bucket& bk) { return bk.device.is_cpu(); });
  present_.assign(params_.size(), 0);
  ready_.assign(params_.size(), 0);
  zeros_.resize(params_.size());
  name_parameters({});
}

void GradientReducer::open_step() {
  reset_step();
  agree_step(false, "");
}

void GradientReducer::reset_step() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    state_[b].pending = static_cast<int>(buckets_[b].members.size());
    state_[b].launched = false;
    state_[b].work.reset();
  }
  std::fill(present_.begin(), present_.end(), 0);
  std::fill(ready_.begin(), ready_.end(), 0);
  for (auto& z : zeros_) z.reset();
  local_error_.clear();
  local_class_ = ErrorClass::Runtime;
  next_launch_ = 0;
  launched_early_ = 0;
  failed_ = std::make_shared<std::atomic<bool>>(false);
  all_clear_ = std::make_shared<bool>(false);
  step_open_ = true;
}

void GradientReducer::agree_step(bool unclear, const std::string& local_error) {
  // Before any bucket moves, the ranks agree that they reduce the same parameter list with
  // the same op: a rank that diverged (a different model, or another collective) fails here.
  // `unclear` rides as the soft flag: where no rank raised it, every rank had every gradient
  // and no caller's flag was set, so finalize() needs no "which gradients exist" allreduce.
  Signature s;
  s.kind = CallKind::GradientBuckets;
  s.op = static_cast<std::int64_t>(opts_.op);
  s.numel = static_cast<std::int64_t>(params_.size());
  s.detail = opts_.plan_hash;
  s.soft_flag = unclear ? 1 : 0;
  if (!local_error.empty()) s.error = local_class_;
  auto failed = failed_;
  auto clear = all_clear_;
  std::string text = local_error.empty() ? std::to_string(params_.size()) + " parameters in " +
                                               std::to_string(buckets_.size()) + " buckets"
                                         : local_error;
  agree_work_ = start("gradient agreement", [s, failed, clear, text] {
    try {
      *clear = agree(s, "DistributedOptimizer.step()", text);
    } catch (...) {
      failed->store(true);
      throw;
    }
  });
}

std::shared_ptr<Work> GradientReducer::start(std::string label, std::function<void()> fn) {
  return run_inline_ ? Engine::get().run_now(std::move(label), fn)
                     : Engine::get().submit(std::move(label), std::move(fn));
}

bool GradientReducer::prepare(std::int64_t i, const std::string& hook_error) {
  auto& p = params_[i];
  const auto& bk = buckets_[bucket_of_[i]];
  // The impl's own read: TensorBase::grad() also asks autograd whether p is a leaf (a virtual
  // call and another cache line a parameter, for a warning that never concerns a parameter).
  const at::Tensor& g = p.unsafeGetTensorImpl()->grad();
  if (!bk.direct && g.defined() && hook_error.empty()) {
    // The common case of a fused bucket: the gradient is its slot, as finalize() left it and
    // the user zeroed it in place. One read of one TensorImpl (a 1000-parameter plan paid
    // ~0.2 ms in the general checks below, mostly cache misses), and no reference taken: an
    // undefined source is the slot itself (see launch).
    auto& st = state_[bucket_of_[i]];
    const auto k = static_cast<std::size_t>(slot_of_[i]);
    if (g.unsafeGetTensorImpl() == st.slots[k].unsafeGetTensorImpl() && g.sizes() == p.sizes() &&
        p.scalar_type() == bk.dtype && g.is_contiguous()) {
      st.fresh[k] = 0;
      st.sources[k].reset();
      return true;
    }
  }
  // The plan's caches (the slots, the bucket sizes) hold for the parameters' sizes when it was
  // made: a parameter resized since (p.data = ...) is this rank's error, and so is a gradient
  // of another dtype, device or layout. Noted, not raised: its zeros of the planned size keep
  // this rank in the step's collectives, and finalize() raises it on every rank.
  const std::int64_t planned =
      bk.direct ? bk.numel : state_[bucket_of_[i]].slots[slot_of_[i]].numel();
  const std::string why = hook_error.empty() ? gradient_mismatch(p, g, bk, planned) : hook_error;
  if (!why.empty()) note_error(i, why);
  const bool usable = why.empty() && g.defined();
  if (bk.direct) {
    if (!usable) {
      zeros_[i] = why.empty()
                      ? at::zeros_like(p, at::MemoryFormat::Contiguous)
                      : at::zeros({bk.numel}, at::TensorOptions(bk.dtype).device(bk.device));
      return false;
    }
    // Reduced in its own storage; "average" divides inside the reduction (allreduce_data).
    if (!g.is_contiguous()) p.mutable_grad() = g.contiguous();
    return true;
  }
  auto& st = state_[bucket_of_[i]];
  const auto k = static_cast<std::size_t>(slot_of_[i]);  // a search here made a step O(n^2)
  at::Tensor& slot = st.slots[k];
  st.fresh[k] = 0;
  st.sources[k].reset();  // the slot itself, unless a fresh gradient replaces it below
  if (!usable) {
    slot.zero_();  // missing here (or unusable): contribute zeros
    return false;
  }
  if (g.data_ptr() != slot.data_ptr() || !g.is_contiguous()) {
    // A fresh gradient: the bucket's pack copies it in (scaled) at launch; from finalize() on,
    // it lives in its slot.
    st.sources[k] = g.contiguous();
    st.fresh[k] = 1;
  }
  return true;  // else accumulated in place in its slot: pack scales it where it lives
}

void GradientReducer::note_error(std::int64_t i, const std::string& why) {
  if (!local_error_.empty()) return;  // the first one names the cause
  local_error_ = "parameter " + param_label(i) + ": " + why;
}

void GradientReducer::raise_noted_errors(bool some_rank_failed) {
  if (!some_rank_failed) return;
  // One more agreement, on the error path only: every rank raises the noted error(s).
  Signature s;
  s.kind = CallKind::GradientBuckets;
  s.op = static_cast<std::int64_t>(opts_.op);
  s.numel = static_cast<std::int64_t>(params_.size());
  s.detail = opts_.plan_hash;
  std::string text = "no error in this step's gradients";
  if (!local_error_.empty()) {
    s.error = local_class_;
    text = local_error_;
  }
  local_error_.clear();
  local_class_ = ErrorClass::Runtime;
  Engine::get().run_inline([&] { agree(s, kUserCall, text); });
  raise_on_every_rank(ErrorClass::Runtime,
                      "DistributedOptimizer.step(): a rank's gradient "
                      "could not be reduced");  // (agree raised already)
}

at::Tensor GradientReducer::bucket_tensor(std::int64_t b) {
  const auto& bk = buckets_[b];
  if (!bk.direct) return state_[b].flat;
  auto i = bk.members[0];
  return zeros_[i].defined() ? zeros_[i] : params_[i].grad();
}

void GradientReducer::launch(std::int64_t b) {
  at::Tensor t = as_pairs(bucket_tensor(b));  // what the backend moves: complex as pairs
  const auto& bk = buckets_[b];
  auto& st = state_[b];
  // A fused bucket's one pack, on this thread (backward's, whose current stream produced the
  // gradients): fresh gradients in, 1/world, and the cast when its wire is 16-bit.
  at::Tensor wire = st.wire;
  std::vector<at::Tensor> unpack_into;
  PackPlan unpack_plan;
  // Every member accumulated in its slot, no scale and no cast: the pack has nothing to do.
  // (An average must scale in the pack on every rank alike: whether a rank's gradients are in
  // place is its own affair, so it may not decide how the ranks reduce.)
  const bool nothing_to_pack =
      !wire.defined() && !st.prescaled &&
      std::none_of(st.fresh.begin(), st.fresh.end(), [](auto f) { return f; });
  if (!bk.direct && !nothing_to_pack) {
    std::vector<at::Tensor> from;  // what pack reads: the fresh gradients, else the slots
    from.reserve(st.slots.size());
    for (std::size_t k = 0; k < st.slots.size(); ++k) {
      from.push_back(as_pairs(st.sources[k].defined() ? st.sources[k] : st.slots[k]));
    }
    pack(st.pack, from, wire.defined() ? wire : as_pairs(st.flat));
  }
  if (!bk.direct) {
    std::fill(st.sources.begin(), st.sources.end(), at::Tensor());
    if (wire.defined()) {
      unpack_into = real_views(st.slots);
      unpack_plan = st.pack;
    }
  }
  // On a GPU, no host wait (ops/stream_order.h): the stream the collective runs on (the
  // communication stream, when there is one) waits for this thread's, backward's, which
  // produced the gradients and ran the pack; finalize() makes step()'s stream wait for the end.
  auto order = std::make_shared<StreamHandOff>(std::vector<at::Tensor>{t});
  st.order = order;
  auto op = opts_.op;
  auto comp = compressed_dtype(opts_.compression);
  int world = current_group().size();
  auto failed = failed_;
  state_[b].launched = true;
  const bool prescaled = st.prescaled;
  state_[b].work = start(
      labels_[b], [t, op, comp, world, failed, prescaled, wire, unpack_plan, unpack_into, order] {
        if (failed->load()) return;  // the step's agreement failed: move no data
        try {
          order->run([&] {
            reduce_bucket(t, op, comp, world, prescaled, wire, unpack_plan, unpack_into);
          });
        } catch (...) {
          failed->store(true);
          throw;
        }
      });
}

void GradientReducer::launch_ready() {
  while (next_launch_ < num_buckets() && state_[next_launch_].pending == 0) launch(next_launch_++);
}

bool GradientReducer::settle(std::size_t i) {
  ready_[i] = 1;
  const bool here = prepare(static_cast<std::int64_t>(i));
  present_[i] = here ? 1 : 0;
  --state_[bucket_of_[i]].pending;
  return here;
}

void GradientReducer::mark_ready(std::int64_t i, const std::string& local_error) {
  UserCall named(kUserCall);
  GroupScope in_group(group_);
  std::lock_guard<std::mutex> lk(mu_);
  TORCH_CHECK_INDEX(i >= 0 && i < static_cast<std::int64_t>(params_.size()), "parameter index ", i,
                    " out of range");
  if (!step_open_) open_step();
  TORCH_CHECK(!ready_[i], "DistributedOptimizer: the gradient of parameter ", param_label(i),
              " was produced twice before step(); run the extra backward passes inside "
              "no_sync(), or set backward_passes_per_step");
  ready_[i] = 1;
  present_[i] = prepare(i, local_error) ? 1 : 0;
  auto b = bucket_of_[i];
  if (--state_[b].pending == 0) {
    auto before = next_launch_;
    launch_ready();
    launched_early_ += next_launch_ - before;
  }
}

bool GradientReducer::finalize(bool flag, const std::string& call_error, ErrorClass error_class) {
  UserCall named(kUserCall);
  GroupScope in_group(group_);
  std::lock_guard<std::mutex> lk(mu_);
  if (params_.empty()) return flag;
  // No backward hook opened this step (allreduce_gradients, or a step with no gradients):
  // nothing can overlap, so a host plan's collectives run here, on this thread.
  struct InlineStep {
    bool& on;
    ~InlineStep() { on = false; }
  } inline_step{run_inline_};
  bool settled_in_agreement = false;
  if (!step_open_) {
    // Every gradient is final already, so the agreement can carry whether some rank lacks
    // one (or passed `flag`): in the common case that saves the step's last allreduce. A
    // gradient this rank cannot reduce becomes its error in that agreement, on every rank.
    run_inline_ = all_host_;
    reset_step();
    bool unclear = flag;
    std::string local_error;
    try {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        prefetch_grad_path(params_, i);
        unclear |= !settle(i);
      }
    } catch (const c10::Error& e) {
      local_error = e.what_without_backtrace();
    }
    if (!call_error.empty()) {  // the call's own error names the cause
      local_error = call_error;
      local_class_ = error_class;
    } else if (local_error.empty()) {
      local_error = local_error_;
    }
    local_error_.clear();
    agree_step(unclear, local_error);
    settled_in_agreement = true;
    if (!local_error.empty()) {
      step_open_ = false;
      agree_work_->wait();  // raises this error on every rank
      TORCH_INTERNAL_ASSERT(false, "the agreement passed a rank's local error");
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!ready_[i]) settle(i);
  }
  launch_ready();
  TORCH_INTERNAL_ASSERT(next_launch_ == num_buckets(), "every bucket must be launched");
  step_open_ = false;
  // Wait for everything, even after an error, so no work still uses these tensors.
  std::exception_ptr first;
  auto wait = [&](const std::shared_ptr<Work>& w) {
    try {
      if (w) w->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  };
  // The host waits here for the engine's work: on a GPU only until each collective is queued
  // (unless FLUXMPI_NCCL_HOST_WAIT=1).
  wait(agree_work_);
  for (auto& st : state_) wait(st.work);
  if (first) std::rethrow_exception(first);
  // On a GPU (no host wait): step()'s current stream waits for the end of each bucket's
  // collective and unpack, before the optimizer reads the gradients.
  for (auto& st : state_) {
    if (st.order) st.order->consume();
    st.order.reset();
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    auto& st = state_[b];
    for (std::size_t k = 0; k < st.fresh.size(); ++k) {
      if (st.fresh[k]) params_[buckets_[b].members[k]].mutable_grad() = st.slots[k];
    }
  }
  // Which gradients exist anywhere: missing on some ranks -> the reduced zeros-padded value;
  // missing on all -> None, as in one process (the optimizer then skips the parameter).
  if (settled_in_agreement && *all_clear_) return false;  // every gradient, on every rank
  if (!call_error.empty()) {                              // the call's own error names the cause
    local_error_ = call_error;
    local_class_ = error_class;
  }
  std::vector<std::uint8_t> anywhere = present_;
  anywhere.push_back(flag ? 1 : 0);
  anywhere.push_back(local_error_.empty() ? 0 : 1);  // some rank noted an error (backward's)
  if (current_group().size() > 1) {
    Engine::get().run_inline([&] {
      mpi_backend().allreduce(anywhere.data(), static_cast<std::int64_t>(anywhere.size()),
                              c10::kByte, ReduceOp::Max);
    });
  }
  raise_noted_errors(anywhere.back() != 0);
  anywhere.pop_back();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    const auto& bk = buckets_[bucket_of_[i]];
    if (!anywhere[i]) {
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
      continue;
    }
    if (present_[i]) continue;
    if (bk.direct) {
      p.mutable_grad() = zeros_[i];
    } else {
      p.mutable_grad() = state_[bucket_of_[i]].slots[slot_of_[i]];
    }
  }
  for (auto& z : zeros_) z.reset();
  return anywhere.back() != 0;
}

}  // namespace fluxmpi
