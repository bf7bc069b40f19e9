#include "c10d/process_group.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <chrono>
#include <sstream>
#include <thread>

#include "c10d/list_collectives.h"
#include "c10d/point_to_point.h"
#include "c10d/reduction.h"
#include "ops/collectives.h"
#include "ops/gather_collectives.h"
#include "ops/stream_order.h"
#include "runtime/environment.h"
#include "runtime/user_call.h"

namespace fluxmpi {

C10dWork::C10dWork(int rank, c10d::OpType type, std::shared_ptr<fluxmpi::Work> work,
                   std::vector<at::Tensor> outputs, c10::intrusive_ptr<c10::ivalue::Future> future)
    : c10d::Work(rank, type),
      work_(std::move(work)),
      outputs_(std::move(outputs)),
      future_(std::move(future)) {}

bool C10dWork::isCompleted() { return work_->test(); }

bool C10dWork::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr C10dWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
}

bool C10dWork::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) {  // 0 is torch's kNoTimeout
    // A bounded wait polls (the engine's Work has no timed wait); it is not the hot path.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!work_->test()) {
      TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "fluxmpi: ", work_->what(),
                  " did not complete within ", timeout.count(),
                  " ms; it stays queued and completes once every rank has joined it");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  work_->wait();
  // The future completed with the work: on a device, this makes the caller's current streams
  // wait for the events it recorded after the collective (no host wait); on the host, nothing.
  if (future_->completed() && !future_->hasError()) future_->wait();
  return true;
}

namespace {

// What the engine runs for one collective. The future completes on the engine thread, right
// after the data moved, so that a communication hook's continuation can start before the
// next queued collective.
void run_then_complete(const std::function<void()>& body,
                       const c10::intrusive_ptr<c10::ivalue::Future>& future,
                       const std::vector<at::Tensor>& outputs) {
  try {
    body();
  } catch (...) {
    future->setError(std::current_exception());
    throw;
  }
  future->markCompleted(c10::IValue(outputs));
}

std::string one_tensor_error(const std::vector<at::Tensor>& ts) {
  if (ts.size() == 1) return {};
  return "the fluxmpi backend takes one tensor per call, got a list of " +
         std::to_string(ts.size());
}

at::Tensor first_or_none(const std::vector<at::Tensor>& ts) {
  return ts.size() == 1 ? ts[0] : at::Tensor();
}

// Complex tensors: the ops layer moves them where only bytes move or it sums them (as pairs of
// reals, ops/collectives.h), as gloo and NCCL take them (DDP broadcasts complex parameters as
// it starts); other reductions refuse them on every rank.

// reduce_scatter_tensors with `r`: PREMUL_SUM scales copies of the inputs, then sums.
void reduce_scatter_scaled(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& ins,
                           const C10dReduction& r, const std::string& err) {
  if (!r.premul) return reduce_scatter_tensors(outs, ins, r.op, err);
  std::vector<at::Tensor> scaled;
  for (const auto& t : ins) scaled.push_back(premultiplied(r, t));
  PremulSumScope premul;
  reduce_scatter_tensors(outs, scaled, "sum", err);
}

}  // namespace

C10dBackend::C10dBackend(int rank, int size, std::shared_ptr<const Group> group)
    : c10d::Backend(rank, size), group_(group ? std::move(group) : world_group()) {
  const Group& g = *group_;
  TORCH_CHECK(rank == g.rank() && size == g.size(),
              "fluxmpi_py: the fluxmpi backend was asked for rank ", rank, " of ", size,
              " in the group of ranks ", g.describe(), ", but this process is rank ", g.rank(),
              " of ", g.size(), " there (world rank ", env().rank,
              "); let init_process_group take rank and world_size from MPI");
  p2p_ = ensure_p2p_comm(g);
}

c10::intrusive_ptr<c10d::Work> C10dBackend::launch(c10d::OpType type, const char* call,
                                                   std::vector<at::Tensor> outputs,
                                                   std::function<void()> body) {
  UserCall named(call);
  // The engine runs the job in the group current here (runtime/group.h).
  GroupScope in_group(group_->is_world() ? nullptr : group_);
  std::vector<c10::Device> devices;
  for (const auto& t : outputs) {
    if (t.defined() && !t.is_cpu() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  auto future = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), devices);
  // Device tensors: the engine's stream waits for this thread's current stream (the
  // producer's), and the future's events, recorded as it completes, mark the stream the
  // collective ran on; wait() and then() make their streams wait for those (ops/stream_order.h).
  auto order = std::make_shared<StreamHandOff>(outputs);
  auto work = Engine::get().submit(call, [body = std::move(body), future, outputs, order] {
    order->run([&] { run_then_complete(body, future, outputs); });
  });
  return c10::make_intrusive<C10dWork>(getRank(), type, std::move(work), std::move(outputs),
                                       std::move(future));
}

c10::intrusive_ptr<c10d::Work> C10dBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  at::Tensor t = first_or_none(tensors);
  std::string err = one_tensor_error(tensors);
  const std::int64_t root = opts.rootRank;
  return launch(c10d::OpType::BROADCAST, "torch.distributed.broadcast()", tensors,
                [t, root, err] { broadcast_checked(t, root, err); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  at::Tensor t = first_or_none(tensors);
  std::string err = one_tensor_error(tensors);
  const C10dReduction r = parse_reduction(opts.reduceOp, tensors, err);
  return launch(c10d::OpType::ALLREDUCE, "torch.distributed.all_reduce()", tensors, [t, r, err] {
    if (!r.premul) return allreduce_checked(t, r.op, err);
    at::Tensor scaled = premultiplied(r, t);
    PremulSumScope premul;
    allreduce_checked(scaled, "sum", err);
    t.copy_(scaled);
  });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  std::string err;
  const C10dReduction r = parse_reduction(opts.reduceOp, tensors, err);
  std::vector<at::Tensor> ts = tensors;
  return launch(c10d::OpType::ALLREDUCE_COALESCED, "torch.distributed.all_reduce_coalesced()",
                tensors, [ts, r, err] {
                  if (!r.premul) return grouped_allreduce_checked(ts, r.op, err);
                  std::vector<at::Tensor> scaled;
                  for (const auto& t : ts) scaled.push_back(premultiplied(r, t));
                  PremulSumScope premul;
                  grouped_allreduce_checked(scaled, "sum", err);
                  for (std::size_t i = 0; i < ts.size(); ++i) ts[i].copy_(scaled[i]);
                });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  at::Tensor t = first_or_none(tensors);
  std::string err = one_tensor_error(tensors);
  const C10dReduction r = parse_reduction(opts.reduceOp, tensors, err);
  const std::int64_t root = opts.rootRank;
  const bool is_root = root == getRank();
  return launch(c10d::OpType::REDUCE, "torch.distributed.reduce()", tensors,
                [t, r, root, is_root, err] {
                  if (!r.premul) return reduce_checked(t, r.op, root, err);
                  at::Tensor scaled = premultiplied(r, t);  // other ranks' tensors stay as they are
                  PremulSumScope premul;
                  reduce_checked(scaled, "sum", root, err);
                  if (is_root) t.copy_(scaled);
                });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions&) {
  auto outs = outputs;
  auto ins = inputs;
  std::vector<at::Tensor> flat;
  for (const auto& list : outputs) flat.insert(flat.end(), list.begin(), list.end());
  return launch(c10d::OpType::ALLGATHER, "torch.distributed.all_gather()", flat,
                [outs, ins] { allgather_lists(outs, ins); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  auto outs = outputs;
  auto ins = inputs;
  std::vector<at::Tensor> flat;
  for (const auto& list : outputs) flat.insert(flat.end(), list.begin(), list.end());
  return launch(c10d::OpType::ALLGATHER_COALESCED, "torch.distributed.all_gather_coalesced()", flat,
                [outs, ins] { allgather_lists(outs, ins); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions&) {
  std::vector<at::Tensor> outs{output};
  std::vector<at::Tensor> ins{input};
  return launch(c10d::OpType::_ALLGATHER_BASE, "torch.distributed.all_gather_into_tensor()",
                {output}, [outs, ins] { allgather_into_tensors(outs, ins); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions&) {
  auto outs = outputs;
  auto ins = inputs;
  return launch(c10d::OpType::COALESCED, "torch.distributed.all_gather_into_tensor()", outputs,
                [outs, ins] { allgather_into_tensors(outs, ins); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  auto outs = outputs;
  auto ins = inputs;
  const std::int64_t root = opts.rootRank;
  std::vector<at::Tensor> flat;
  for (const auto& list : outputs) flat.insert(flat.end(), list.begin(), list.end());
  return launch(c10d::OpType::GATHER, "torch.distributed.gather()", flat,
                [outs, ins, root] { gather_lists(outs, ins, root); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  auto outs = outputs;
  auto ins = inputs;
  const std::int64_t root = opts.rootRank;
  return launch(c10d::OpType::SCATTER, "torch.distributed.scatter()", outputs,
                [outs, ins, root] { scatter_lists(outs, ins, root); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  std::string err;
  const C10dReduction r = parse_reduction(opts.reduceOp, inputs.empty() ? outputs : inputs[0], err);
  auto outs = outputs;
  auto ins = inputs;
  return launch(c10d::OpType::REDUCE_SCATTER, "torch.distributed.reduce_scatter()", outputs,
                [outs, ins, r, err] {
                  if (!r.premul) return reduce_scatter_lists(outs, ins, r.op, err);
                  auto scaled = ins;
                  for (auto& list : scaled) {
                    for (auto& t : list) t = premultiplied(r, t);
                  }
                  PremulSumScope premul;
                  reduce_scatter_lists(outs, scaled, "sum", err);
                });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::string err;
  std::vector<at::Tensor> outs{output};
  std::vector<at::Tensor> ins{input};
  const C10dReduction r = parse_reduction(opts.reduceOp, ins, err);
  return launch(c10d::OpType::_REDUCE_SCATTER_BASE, "torch.distributed.reduce_scatter_tensor()",
                {output}, [outs, ins, r, err] { reduce_scatter_scaled(outs, ins, r, err); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  std::string err;
  const C10dReduction r = parse_reduction(opts.reduceOp, inputs, err);
  auto outs = outputs;
  auto ins = inputs;
  return launch(c10d::OpType::COALESCED, "torch.distributed.reduce_scatter_tensor()", outputs,
                [outs, ins, r, err] { reduce_scatter_scaled(outs, ins, r, err); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_splits,
                                                          std::vector<int64_t>& input_splits,
                                                          const c10d::AllToAllOptions&) {
  at::Tensor out = output;
  at::Tensor in = input;
  std::vector<std::int64_t> osp = output_splits;
  std::vector<std::int64_t> isp = input_splits;
  return launch(c10d::OpType::ALLTOALL_BASE, "torch.distributed.all_to_all_single()", {output},
                [out, in, osp, isp] { alltoall_single(out, in, osp, isp); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions&) {
  auto outs = outputs;
  auto ins = inputs;
  return launch(c10d::OpType::ALLTOALL, "torch.distributed.all_to_all()", outputs,
                [outs, ins] { alltoall_lists(outs, ins); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::barrier(const c10d::BarrierOptions&) {
  return launch(c10d::OpType::BARRIER, "torch.distributed.barrier()", {},
                [] { barrier_checked(); });
}

c10::intrusive_ptr<c10d::Work> C10dBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                 int tag) {
  TORCH_CHECK_VALUE(tensors.size() == 1, one_tensor_error(tensors));
  return start_send(p2p_, getRank(), getSize(), tensors[0], dst, tag);
}

c10::intrusive_ptr<c10d::Work> C10dBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                 int tag) {
  TORCH_CHECK_VALUE(tensors.size() == 1, one_tensor_error(tensors));
  return start_recv(p2p_, getRank(), getSize(), tensors[0], src, tag);
}

c10::intrusive_ptr<c10d::Work> C10dBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                          int tag) {
  TORCH_CHECK_VALUE(tensors.size() == 1, one_tensor_error(tensors));
  return start_recv(p2p_, getRank(), getSize(), tensors[0], kAnySource, tag);
}

}  // namespace fluxmpi
