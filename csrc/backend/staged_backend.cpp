#include "backend/staged_backend.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cstring>
#include <numeric>

#include "runtime/group.h"

namespace fluxmpi {

namespace {

std::int64_t bytes_of(std::int64_t count, c10::ScalarType dtype) {
  return count * static_cast<std::int64_t>(c10::elementSize(dtype));
}

std::int64_t total(const std::vector<std::int64_t>& parts) {
  return std::accumulate(parts.begin(), parts.end(), std::int64_t{0});
}

// Host memory standing in for a device: plain buffers and memcpy.
class HostCopier final : public DeviceCopier {
 public:
  at::Tensor host_buffer(std::int64_t bytes) override {
    return at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  }
  void to_host(void* host, const void* device, std::int64_t bytes) override {
    std::memcpy(host, device, static_cast<size_t>(bytes));
    copied += bytes;
  }
  void to_device(void* device, const void* host, std::int64_t bytes) override {
    std::memcpy(device, host, static_cast<size_t>(bytes));
    copied += bytes;
  }
  std::atomic<std::int64_t> copied{0};
};

std::atomic<bool> g_stage_host{false};

HostCopier& host_copier() {
  static HostCopier copier;
  return copier;
}

}  // namespace

at::Tensor StagedBackend::stage_in(const void* device, std::int64_t bytes) {
  at::Tensor host = copier_.host_buffer(bytes);
  if (device != nullptr && bytes > 0) copier_.to_host(host.data_ptr(), device, bytes);
  return host;
}

void StagedBackend::stage_out(void* device, const at::Tensor& host, std::int64_t bytes) {
  if (device != nullptr && bytes > 0) copier_.to_device(device, host.data_ptr(), bytes);
}

void StagedBackend::allreduce(void* buf, std::int64_t count, c10::ScalarType dtype, ReduceOp op) {
  const std::int64_t bytes = bytes_of(count, dtype);
  at::Tensor h = stage_in(buf, bytes);
  mpi_backend().allreduce(h.data_ptr(), count, dtype, op);
  stage_out(buf, h, bytes);
}

void StagedBackend::allreduce_divided(void* buf, std::int64_t count, c10::ScalarType dtype,
                                      int divisor) {
  const std::int64_t bytes = bytes_of(count, dtype);
  at::Tensor h = stage_in(buf, bytes);
  mpi_backend().allreduce_divided(h.data_ptr(), count, dtype, divisor);
  stage_out(buf, h, bytes);
}

void StagedBackend::broadcast(void* buf, std::int64_t count, c10::ScalarType dtype, int root) {
  const std::int64_t bytes = bytes_of(count, dtype);
  // Only the root's bytes matter on the way in.
  at::Tensor h = stage_in(current_group().rank() == root ? buf : nullptr, bytes);
  mpi_backend().broadcast(h.data_ptr(), count, dtype, root);
  if (current_group().rank() != root) stage_out(buf, h, bytes);
}

void StagedBackend::reduce(const void* send, void* recv, std::int64_t count, c10::ScalarType dtype,
                           ReduceOp op, int root) {
  const std::int64_t bytes = bytes_of(count, dtype);
  at::Tensor hs = stage_in(send, bytes);
  const bool is_root = current_group().rank() == root;
  at::Tensor hr = stage_in(nullptr, is_root ? bytes : 0);
  mpi_backend().reduce(hs.data_ptr(), is_root ? hr.data_ptr() : nullptr, count, dtype, op, root);
  if (is_root) stage_out(recv, hr, bytes);
}

void StagedBackend::allgather(const void* send, void* recv, std::int64_t count,
                              c10::ScalarType dtype) {
  const std::int64_t bytes = bytes_of(count, dtype);
  at::Tensor hs = stage_in(send, bytes);
  at::Tensor hr = stage_in(nullptr, bytes * current_group().size());
  mpi_backend().allgather(hs.data_ptr(), hr.data_ptr(), count, dtype);
  stage_out(recv, hr, bytes * current_group().size());
}

void StagedBackend::allgatherv(const void* send, std::int64_t send_bytes, void* recv,
                               const std::vector<std::int64_t>& recv_bytes) {
  at::Tensor hs = stage_in(send, send_bytes);
  at::Tensor hr = stage_in(nullptr, total(recv_bytes));
  mpi_backend().allgatherv(hs.data_ptr(), send_bytes, hr.data_ptr(), recv_bytes);
  stage_out(recv, hr, total(recv_bytes));
}

void StagedBackend::gatherv(const void* send, std::int64_t send_bytes, void* recv,
                            const std::vector<std::int64_t>& recv_bytes, int root) {
  const bool is_root = current_group().rank() == root;
  at::Tensor hs = stage_in(send, send_bytes);
  const std::int64_t received = is_root ? total(recv_bytes) : 0;
  at::Tensor hr = stage_in(nullptr, received);
  mpi_backend().gatherv(hs.data_ptr(), send_bytes, is_root ? hr.data_ptr() : nullptr, recv_bytes,
                        root);
  if (is_root) stage_out(recv, hr, received);
}

void StagedBackend::scatterv(const void* send, const std::vector<std::int64_t>& send_bytes,
                             void* recv, std::int64_t recv_bytes, int root) {
  const bool is_root = current_group().rank() == root;
  at::Tensor hs = stage_in(is_root ? send : nullptr, is_root ? total(send_bytes) : 0);
  at::Tensor hr = stage_in(nullptr, recv_bytes);
  mpi_backend().scatterv(is_root ? hs.data_ptr() : nullptr, send_bytes, hr.data_ptr(), recv_bytes,
                         root);
  stage_out(recv, hr, recv_bytes);
}

void StagedBackend::alltoallv(const void* send, const std::vector<std::int64_t>& send_bytes,
                              void* recv, const std::vector<std::int64_t>& recv_bytes) {
  at::Tensor hs = stage_in(send, total(send_bytes));
  at::Tensor hr = stage_in(nullptr, total(recv_bytes));
  mpi_backend().alltoallv(hs.data_ptr(), send_bytes, hr.data_ptr(), recv_bytes);
  stage_out(recv, hr, total(recv_bytes));
}

void StagedBackend::alltoall_equal(const void* send, void* recv, std::int64_t part_bytes,
                                   int size) {
  const std::int64_t bytes = part_bytes * size;
  at::Tensor hs = stage_in(send, bytes);
  at::Tensor hr = stage_in(nullptr, bytes);
  mpi_backend().alltoall_equal(hs.data_ptr(), hr.data_ptr(), part_bytes, size);
  stage_out(recv, hr, bytes);
}

void StagedBackend::reduce_scatter(const void* send, void* recv,
                                   const std::vector<std::int64_t>& counts, c10::ScalarType dtype,
                                   ReduceOp op) {
  at::Tensor hs = stage_in(send, bytes_of(total(counts), dtype));
  const std::int64_t mine = bytes_of(counts.at(static_cast<size_t>(current_group().rank())), dtype);
  at::Tensor hr = stage_in(nullptr, mine);
  mpi_backend().reduce_scatter(hs.data_ptr(), hr.data_ptr(), counts, dtype, op);
  stage_out(recv, hr, mine);
}

Backend& staged_host_backend() {
  static StagedBackend backend(host_copier(), "mpi");
  return backend;
}

std::int64_t staged_host_bytes() { return host_copier().copied; }

void set_stage_host(bool on) { g_stage_host = on; }
bool stage_host() { return g_stage_host; }

}  // namespace fluxmpi
