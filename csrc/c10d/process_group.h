// fluxmpi_py as a torch.distributed backend ("fluxmpi"): a c10d::Backend whose collectives run
// on our engine (runtime/engine.h, FIFO, so every rank issues them in the same order), pass
// the agreement check (ops/consensus.h) before data moves, and move data through our
// backends (MPI for host tensors, NCCL for CUDA tensors where compiled in). Registered from
// Python by fluxmpi_py/c10d.py.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/group.h"

namespace fluxmpi {

// A collective queued on the engine, as torch sees it. Its future's value is the list of
// output tensors (what DDP's communication hooks read); it completes on the engine thread.
class C10dWork : public c10d::Work {
 public:
  C10dWork(int rank, c10d::OpType type, std::shared_ptr<fluxmpi::Work> work,
           std::vector<at::Tensor> outputs, c10::intrusive_ptr<c10::ivalue::Future> future);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // Blocks until the engine has run the collective; raises its error, or a RuntimeError
  // once `timeout` has passed (the collective stays queued). Without a timeout, the job's
  // stall report and timeout (Init(timeout=...)) cover a stuck collective.
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::shared_ptr<fluxmpi::Work> work_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The communication of one process group, over the fluxmpi group it holds (runtime/group.h):
// the world for the default group, or the sub-group made for torch's new_group (ranks and
// roots are then ranks in the group, as torch passes them). Every collective is queued with
// that group current, so it agrees and moves data on the group's communicator only.
class C10dBackend : public c10d::Backend {
 public:
  // Raises unless `rank`/`size` are this process's rank in `group` and its size (Init must
  // have run); `group` null is the world. A collective over the group's members: it makes the
  // group's point-to-point communicator the first time.
  C10dBackend(int rank, int size, std::shared_ptr<const Group> group);

  const std::string getBackendName() const override { return "fluxmpi"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  // Queue `body` on the engine under the user-call name `call`; the returned Work's future
  // completes with `outputs` once `body` has run on every rank's engine.
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, const char* call,
                                        std::vector<at::Tensor> outputs,
                                        std::function<void()> body);

  std::shared_ptr<const Group> group_;
  MPI_Comm p2p_ = MPI_COMM_NULL;  // the group's point-to-point communicator
};

}  // namespace fluxmpi
