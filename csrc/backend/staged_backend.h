// A backend for device memory that stages every buffer through host memory and runs the
// collective on the MPI backend of the current group (mpi_backend()): copy in, collect, copy
// out. CUDA tensors take it for the collectives NCCL lacks (variable-size gather, scatter,
// alltoall, uneven reduce-scatter) when the MPI library is not CUDA-aware or
// disable_cudampi_support() is set, and for every collective on a group (group=), which has
// no NCCL communicator of its own. Roots, ranks and sizes are the current group's. The staging
// logic is device-neutral: a DeviceCopier does the copies, and the CPU build tests it with a
// host copier that stages host buffers through a second host buffer (staged_host_backend()).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace fluxmpi {

// Copies between the device and staging buffers; bytes, not elements.
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // A host staging buffer of `bytes` bytes (pinned memory for CUDA).
  virtual at::Tensor host_buffer(std::int64_t bytes) = 0;
  virtual void to_host(void* host, const void* device, std::int64_t bytes) = 0;
  virtual void to_device(void* device, const void* host, std::int64_t bytes) = 0;
};

class StagedBackend final : public Backend {
 public:
  // `copier` moves bytes and outlives this backend; the current group's MPI backend runs the
  // collectives.
  StagedBackend(DeviceCopier& copier, std::string name) : copier_(copier), name_(std::move(name)) {}
  const char* name() const override { return name_.c_str(); }

  void allreduce(void* buf, std::int64_t count, c10::ScalarType dtype, ReduceOp op) override;
  bool fuses_division() const override { return mpi_backend().fuses_division(); }
  void allreduce_divided(void* buf, std::int64_t count, c10::ScalarType dtype,
                         int divisor) override;
  void broadcast(void* buf, std::int64_t count, c10::ScalarType dtype, int root) override;
  void reduce(const void* send, void* recv, std::int64_t count, c10::ScalarType dtype, ReduceOp op,
              int root) override;
  void allgather(const void* send, void* recv, std::int64_t count, c10::ScalarType dtype) override;
  void barrier() override { mpi_backend().barrier(); }
  void allgatherv(const void* send, std::int64_t send_bytes, void* recv,
                  const std::vector<std::int64_t>& recv_bytes) override;
  void gatherv(const void* send, std::int64_t send_bytes, void* recv,
               const std::vector<std::int64_t>& recv_bytes, int root) override;
  void scatterv(const void* send, const std::vector<std::int64_t>& send_bytes, void* recv,
                std::int64_t recv_bytes, int root) override;
  void alltoallv(const void* send, const std::vector<std::int64_t>& send_bytes, void* recv,
                 const std::vector<std::int64_t>& recv_bytes) override;
  void alltoall_equal(const void* send, void* recv, std::int64_t part_bytes, int size) override;
  void reduce_scatter(const void* send, void* recv, const std::vector<std::int64_t>& counts,
                      c10::ScalarType dtype, ReduceOp op) override;

 private:
  // A staging buffer holding a copy of `bytes` device bytes at `device` (none copied if null).
  at::Tensor stage_in(const void* device, std::int64_t bytes);
  void stage_out(void* device, const at::Tensor& host, std::int64_t bytes);

  DeviceCopier& copier_;
  std::string name_;
};

// The CPU twin: MPI collectives on host buffers staged through second host buffers, so the
// CPU tests run the staging logic over real MPI (tests/test_staged_backend.py). For tests only:
// set_stage_host(true) makes backend_for() pick it for CPU tensors.
Backend& staged_host_backend();
void set_stage_host(bool on);
bool stage_host();
// Bytes the host twin has copied in and out so far.
std::int64_t staged_host_bytes();

}  // namespace fluxmpi
