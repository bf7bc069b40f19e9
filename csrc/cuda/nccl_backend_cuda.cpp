// The NCCL backend: the Backend interface over CUDA buffers. Each call enqueues its work on
// the calling thread's current CUDA stream for the buffer's device (so it is ordered after the
// kernels that produced the data), then blocks the host until that stream has reached the end
// of the call, as the MPI backend blocks. See docs/sections/60-cuda.md for the cost of that.
#include "backend/nccl_backend.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>  // before nccl.h: declares the bf16 type that enables ncclBfloat16
#include <nccl.h>

#include "cuda/nccl_check.h"
#include "cuda/nccl_comm.h"
#include "cuda/nccl_lowering.h"
#include "runtime/environment.h"

namespace fluxmpi {
namespace {

using nccl::check_cuda;
using nccl::check_nccl;

ncclDataType_t nccl_type(c10::ScalarType t) {
  switch (t) {
    case c10::kChar: return ncclInt8;
    case c10::kByte: return ncclUint8;
    case c10::kInt: return ncclInt32;
    case c10::kLong: return ncclInt64;
    case c10::kHalf: return ncclFloat16;
    case c10::kBFloat16: return ncclBfloat16;
    case c10::kFloat: return ncclFloat32;
    case c10::kDouble: return ncclFloat64;
    default:
      TORCH_INTERNAL_ASSERT(false, "no NCCL type for ", t, "; nccl_lowering.h should convert it");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Prod: return ncclProd;
    case ReduceOp::Average: break;
  }
  TORCH_INTERNAL_ASSERT(false, "average must be lowered to sum by the ops layer");
}

nccl::WirePlan plan_or_throw(c10::ScalarType dt, ReduceOp op) {
  TORCH_INTERNAL_ASSERT(op != ReduceOp::Average, "average must be lowered to sum by the caller");
  auto plan = nccl::reduction_plan(dt, op);
  TORCH_CHECK_TYPE(plan.has_value(), "fluxmpi_py: dtype ", dt,
                   " is not supported by the NCCL backend (rank ", nccl::rank_for_message(), ")");
  return *plan;
}

// A 1-d view of the caller's buffer (no copy, no ownership) so ATen can convert it on the
// current stream. `data` is only read when the caller passed a const buffer.
at::Tensor view_of(const void* data, std::int64_t count, c10::ScalarType dt, int device) {
  return at::from_blob(const_cast<void*>(data), {count},
                       at::TensorOptions().dtype(dt).device(at::kCUDA, device));
}

std::int64_t bytes_of(std::int64_t count, c10::ScalarType dt) {
  return count * static_cast<std::int64_t>(c10::elementSize(dt));
}

// The context every call shares: the buffer's device made current, its current stream, and
// the communicator (created on first use, which is collective; hence the world-of-one paths
// below return before asking for it).
struct Call {
  explicit Call(const void* buf)
      : device(nccl::device_of(buf)),
        guard(static_cast<c10::DeviceIndex>(device)),
        stream(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device))) {}

  ncclComm_t comm() {
    if (comm_ == nullptr) comm_ = nccl::comm_for(device);
    return comm_;
  }
  // Block until everything this call enqueued has completed.
  void finish(const char* what) { nccl::wait_for(what, comm_, device, stream); }

  int device;
  c10::cuda::CUDAGuard guard;
  c10::cuda::CUDAStream stream;

 private:
  ncclComm_t comm_ = nullptr;
};

// Copy `bytes` from `src` to `dst` on the call's stream (world-of-one paths).
void copy_on_stream(Call& call, void* dst, const void* src, std::int64_t bytes) {
  if (dst == src || bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                             call.stream.stream()),
             "cudaMemcpyAsync");
  call.finish("cudaMemcpyAsync");
}

class NcclBackend final : public Backend {
 public:
  const char* name() const override { return "nccl"; }

  void allreduce(void* buf, std::int64_t count, c10::ScalarType dt, ReduceOp op) override {
    auto plan = plan_or_throw(dt, op);
    if (count == 0 || env().size == 1) return;  // the reduction of one buffer is itself
    Call call(buf);
    at::Tensor user = view_of(buf, count, dt, call.device);
    // Native and Reinterpret reduce the caller's bytes in place; Convert goes through a
    // temporary that lives until after finish(), so the caching allocator cannot reuse it early.
    at::Tensor wire = plan.move == nccl::Move::Convert ? user.to(plan.wire) : user;
    ncclComm_t comm = call.comm();
    check_nccl(ncclAllReduce(wire.data_ptr(), wire.data_ptr(), static_cast<size_t>(count),
                             nccl_type(plan.wire), nccl_op(plan.op), comm, call.stream.stream()),
               "ncclAllReduce", comm);
    if (plan.move == nccl::Move::Convert) user.copy_(wire);
    call.finish("ncclAllReduce");
  }

  void broadcast(void* buf, std::int64_t count, c10::ScalarType dt, int root) override {
    if (count == 0 || env().size == 1) return;
    Call call(buf);
    // Bytes travel as bytes: any dtype, nothing to convert.
    ncclComm_t comm = call.comm();
    check_nccl(ncclBroadcast(buf, buf, static_cast<size_t>(bytes_of(count, dt)), ncclUint8, root,
                             comm, call.stream.stream()),
               "ncclBroadcast", comm);
    call.finish("ncclBroadcast");
  }

  void reduce(const void* send, void* recv, std::int64_t count, c10::ScalarType dt, ReduceOp op,
              int root) override {
    auto plan = plan_or_throw(dt, op);
    if (count == 0) return;
    const bool is_root = env().rank == root;
    Call call(send);
    if (env().size == 1) {
      copy_on_stream(call, recv, send, bytes_of(count, dt));
      return;
    }
    const void* wire_send = send;
    void* wire_recv = is_root ? recv : nullptr;
    at::Tensor temp;  // Convert: the send data in the wire dtype, reduced in place on the root
    if (plan.move == nccl::Move::Convert) {
      temp = view_of(send, count, dt, call.device).to(plan.wire);
      wire_send = temp.data_ptr();
      wire_recv = is_root ? temp.data_ptr() : nullptr;
    }
    ncclComm_t comm = call.comm();
    check_nccl(ncclReduce(wire_send, wire_recv, static_cast<size_t>(count), nccl_type(plan.wire),
                          nccl_op(plan.op), root, comm, call.stream.stream()),
               "ncclReduce", comm);
    if (is_root && temp.defined()) view_of(recv, count, dt, call.device).copy_(temp);
    call.finish("ncclReduce");
  }

  void allgather(const void* send, void* recv, std::int64_t count, c10::ScalarType dt) override {
    if (count == 0) return;
    Call call(send);
    std::int64_t bytes = bytes_of(count, dt);
    if (env().size == 1) {
      copy_on_stream(call, recv, send, bytes);
      return;
    }
    ncclComm_t comm = call.comm();
    check_nccl(ncclAllGather(send, recv, static_cast<size_t>(bytes), ncclUint8, comm,
                             call.stream.stream()),
               "ncclAllGather", comm);
    call.finish("ncclAllGather");
  }

  // NCCL has no barrier and a barrier is about ranks, not devices: the MPI one is exact and
  // needs no device buffer.
  void barrier() override { mpi_backend().barrier(); }
};

}  // namespace

Backend& nccl_backend() {
  static NcclBackend backend;
  return backend;
}

std::string nccl_version_string() {
  int v = 0;
  FLUXMPI_NCCL_CHECK(ncclGetVersion(&v), nullptr);  // needs no GPU and no communicator
  // Since NCCL 2.9 the code is major*10000 + minor*100 + patch; before, major*1000 + ...
  int major = v >= 10000 ? v / 10000 : v / 1000;
  int minor = v >= 10000 ? (v % 10000) / 100 : (v % 1000) / 100;
  int patch = v % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

void nccl_shutdown() { nccl::destroy_all_comms(); }

namespace {

// The runtime's shutdown() tears the communicators down on every rank alike; registered when
// the library loads, so it runs in every shutdown, whether or not a communicator was made.
struct RegisterShutdown {
  RegisterShutdown() { add_shutdown_hook(nccl_shutdown); }
} g_register_shutdown;

}  // namespace

}  // namespace fluxmpi
