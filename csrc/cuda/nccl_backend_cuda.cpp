// The NCCL backend: the Backend interface over CUDA buffers. Each call enqueues its work on the
// device's communication stream after the calling thread's current stream (the data's
// producer), or on that current stream itself with nccl_comm_stream() off. By default it then
// returns once queued, the caller's stream waiting for the call on the device; with
// nccl_host_wait() on it blocks the host until done, as the MPI backend blocks.
// docs/design.md (CUDA and NCCL) says where each wait is.
#include "backend/nccl_backend.h"

#include "backend/mpi_cuda_support.h"
#include "backend/select.h"
#include "backend/staged_backend.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>  // before nccl.h: declares the bf16 type that enables ncclBfloat16
#include <nccl.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "cuda/nccl_check.h"
#include "cuda/nccl_comm.h"
#include "cuda/nccl_lowering.h"
#include "runtime/comm_stream_order.h"
#include "runtime/environment.h"
#include "runtime/group.h"

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
    case ReduceOp::Average:
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor: break;
  }
  TORCH_INTERNAL_ASSERT(false,
                        "average is lowered to sum and bitwise ops refused on CUDA by the "
                        "ops layer");
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

// A communication stream per device (torch's pool, high priority), made on first use; taken
// when nccl_comm_stream() is on (backend/select.h).
c10::cuda::CUDAStream comm_stream_for(int device) {
  static std::mutex mu;
  static auto* streams = new std::map<int, c10::cuda::CUDAStream>();
  std::lock_guard<std::mutex> lk(mu);
  auto it = streams->find(device);
  if (it == streams->end()) {
    auto s = c10::cuda::getStreamFromPool(/*isHighPriority=*/true,
                                          static_cast<c10::DeviceIndex>(device));
    it = streams->emplace(device, s).first;
  }
  return it->second;
}

// CUDA streams and events as runtime/comm_stream_order.h's Device: the ordering written there, and
// tested on CPU over a fake device, is the one the calls below keep.
struct CudaStreams {
  using Stream = c10::cuda::CUDAStream;
  // A timing-free event, destroyed with this object (CUDA frees it once it has completed, so
  // a stream may still be waiting for it then).
  class Event {
   public:
    Event() {
      check_cuda(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming), "cudaEventCreate");
    }
    ~Event() {
      if (ev_ != nullptr) cudaEventDestroy(ev_);
    }
    Event(Event&& o) noexcept : ev_(std::exchange(o.ev_, nullptr)) {}
    Event& operator=(Event&&) = delete;
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    cudaEvent_t get() const { return ev_; }

   private:
    cudaEvent_t ev_ = nullptr;
  };

  Event record(const Stream& s) {
    Event e;
    check_cuda(cudaEventRecord(e.get(), s.stream()), "cudaEventRecord");
    return e;
  }
  void wait(const Stream& s, const Event& e) {
    check_cuda(cudaStreamWaitEvent(s.stream(), e.get(), 0), "cudaStreamWaitEvent");
  }
};

// The context every call shares: the backend's device made current (before any CUDA call, so
// that a thread that never chose a device does not create a context on GPU 0), the stream the
// call runs on, and the communicator (created on first use, which is collective; hence the
// world-of-one paths below return before asking for it). The stream is the calling thread's
// current one; with nccl_comm_stream() on, the device's communication stream instead, made to
// wait for the caller's stream first and made current for the call, so that ATen's conversions
// and copies inside the call run on it too. finish() ends the call (see there).
struct Call {
  explicit Call(int device_index)
      : device(device_index),
        guard(static_cast<c10::DeviceIndex>(device)),
        caller(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device))),
        stream(nccl_comm_stream() ? comm_stream_for(device) : caller),
        on_stream(stream) {
    CudaStreams dev;
    // the communication stream waits for the caller's (left out only by the GPU checks'
    // negative control, set_stream_waits(false))
    if (stream_waits()) enter_stream(dev, caller, stream);
  }

  // The current group's communicator on this device (the world's, or with nccl_groups() a
  // sub-group's): the ops layer calls the backend inside the group's scope.
  ncclComm_t comm() {
    if (comm_ == nullptr) comm_ = nccl::comm_for(device, current_group());
    return comm_;
  }
  // The end of the call. With nccl_host_wait() on, block the host until everything this call
  // enqueued has completed. Off (the default), return at once: the caller's stream waits for
  // the communication stream on the device (nothing to do when they are one stream), and the
  // watchdog (cuda/nccl_comm.h) polls the call's completion for NCCL's asynchronous errors and
  // the stall timeout.
  void finish(const char* what) {
    if (nccl_host_wait()) {
      nccl::wait_for(what, comm_, device, stream, current_group().index());
      return;
    }
    CudaStreams dev;
    if (!(stream == caller)) consume_after(dev, caller, leave_stream(dev, stream));
    nccl::watch(what, comm_, device, stream);
  }

  int device;
  c10::cuda::CUDAGuard guard;
  c10::cuda::CUDAStream caller;
  c10::cuda::CUDAStream stream;
  c10::cuda::CUDAStreamGuard on_stream;

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

// Staging for MPI: pinned host buffers, copies on the device's current stream. The wait is a
// plain stream synchronize, not a BlockingCall: a copy involves no peer, and not every rank
// copies (only the root's bytes enter a broadcast).
class CudaCopier final : public DeviceCopier {
 public:
  explicit CudaCopier(int device) : device_(device) {}
  at::Tensor host_buffer(std::int64_t bytes) override {
    return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  }
  void to_host(void* host, const void* device, std::int64_t bytes) override {
    copy(host, device, bytes, cudaMemcpyDeviceToHost);
  }
  void to_device(void* device, const void* host, std::int64_t bytes) override {
    copy(device, host, bytes, cudaMemcpyHostToDevice);
  }

 private:
  void copy(void* dst, const void* src, std::int64_t bytes, cudaMemcpyKind kind) {
    Call call(device_);
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, call.stream.stream()),
               "cudaMemcpyAsync (staging for MPI)");
    check_cuda(cudaStreamSynchronize(call.stream.stream()), "cudaStreamSynchronize (staging)");
  }
  int device_;
};

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(int device)
      : device_(device), copier_(device), staged_(copier_, "mpi (staged from cuda)") {}

  // A group's collectives (group=): staged through host memory, over the group's MPI
  // communicator (a group has no NCCL communicator).
  Backend& staged() { return staged_; }

  // The collectives NCCL has no call for go over MPI (see mpi_route()).
  void allgatherv(const void* send, std::int64_t send_bytes, void* recv,
                  const std::vector<std::int64_t>& recv_bytes) override {
    mpi_route(true).allgatherv(send, send_bytes, recv, recv_bytes);
  }
  void gatherv(const void* send, std::int64_t send_bytes, void* recv,
               const std::vector<std::int64_t>& recv_bytes, int root) override {
    mpi_route(true).gatherv(send, send_bytes, recv, recv_bytes, root);
  }
  void scatterv(const void* send, const std::vector<std::int64_t>& send_bytes, void* recv,
                std::int64_t recv_bytes, int root) override {
    mpi_route(true).scatterv(send, send_bytes, recv, recv_bytes, root);
  }
  void alltoallv(const void* send, const std::vector<std::int64_t>& send_bytes, void* recv,
                 const std::vector<std::int64_t>& recv_bytes) override {
    mpi_route(true).alltoallv(send, send_bytes, recv, recv_bytes);
  }
  void alltoall_equal(const void* send, void* recv, std::int64_t part_bytes, int size) override {
    mpi_route(true).alltoall_equal(send, recv, part_bytes, size);
  }
  void reduce_scatter(const void* send, void* recv, const std::vector<std::int64_t>& counts,
                      c10::ScalarType dt, ReduceOp op) override {
    mpi_route(false).reduce_scatter(send, recv, counts, dt, op);
  }
  const char* name() const override { return "nccl"; }

  void allreduce(void* buf, std::int64_t count, c10::ScalarType dt, ReduceOp op) override {
    allreduce_by(plan_or_throw(dt, op), buf, count, dt);
  }

  void allreduce_wire16(void* buf, std::int64_t count, c10::ScalarType dt, ReduceOp op) override {
    plan_or_throw(dt, op);  // the same errors as allreduce
    allreduce_by(*nccl::wire16_plan(dt, op), buf, count, dt);
  }

  // The division inside the reduction: ncclAvg when dividing by the world size, else a
  // pre-multiplied sum (each rank's values times 1/divisor, then summed), both NCCL >= 2.11.
  bool fuses_division() const override { return true; }
  void allreduce_divided(void* buf, std::int64_t count, c10::ScalarType dt, int divisor) override {
    TORCH_CHECK(dt == c10::kFloat || dt == c10::kDouble,
                "fluxmpi_py: allreduce_divided takes float or double, got ", dt);
    TORCH_CHECK(divisor >= 1, "fluxmpi_py: allreduce_divided by ", divisor);
    if (count == 0) return;
    Call call(device_);
    if (current_group().size() == 1) {
      if (divisor != 1) view_of(buf, count, dt, call.device).div_(divisor);
      call.finish("allreduce_divided");
      return;
    }
    ncclComm_t comm = call.comm();
    ncclRedOp_t op = ncclAvg;
    const bool premul = divisor != current_group().size();
    if (premul) {
      const float f = 1.0f / static_cast<float>(divisor);
      const double d = 1.0 / static_cast<double>(divisor);
      const void* scalar = dt == c10::kFloat ? static_cast<const void*>(&f) : &d;
      check_nccl(ncclRedOpCreatePreMulSum(&op, const_cast<void*>(scalar), nccl_type(dt),
                                          ncclScalarHostImmediate, comm),
                 "ncclRedOpCreatePreMulSum", comm);
    }
    const ncclResult_t rc = ncclAllReduce(buf, buf, static_cast<size_t>(count), nccl_type(dt), op,
                                          comm, call.stream.stream());
    // An operator may be destroyed once the last call given it has returned (NCCL docs).
    if (premul) ncclRedOpDestroy(op, comm);
    check_nccl(rc, "ncclAllReduce (average)", comm);
    call.finish("ncclAllReduce");
  }

  void broadcast(void* buf, std::int64_t count, c10::ScalarType dt, int root) override {
    if (count == 0 || current_group().size() == 1) return;
    Call call(device_);
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
    const bool is_root = current_group().rank() == root;
    Call call(device_);
    if (current_group().size() == 1) {
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
    Call call(device_);
    std::int64_t bytes = bytes_of(count, dt);
    if (current_group().size() == 1) {
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

 private:
  void allreduce_by(const nccl::WirePlan& plan, void* buf, std::int64_t count, c10::ScalarType dt) {
    if (count == 0 || current_group().size() == 1) return;  // the reduction of one buffer is itself
    Call call(device_);
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

  // Straight from device memory when the MPI library is CUDA-aware, disable_cudampi_support()
  // is not set and the call only moves bytes (MPI's reductions of device memory and our 16-bit
  // reduction ops are host code); staged through pinned host buffers otherwise. Either way the
  // data's stream is finished first, since MPI knows nothing of streams.
  Backend& mpi_route(bool moves_bytes_only) {
    if (moves_bytes_only && cuda_mpi_allowed() && mpi_cuda_support() == "yes") {
      Call call(device_);
      check_cuda(cudaStreamSynchronize(call.stream.stream()),
                 "cudaStreamSynchronize (CUDA-aware MPI)");
      return mpi_backend();
    }
    return staged_;
  }

  int device_;
  CudaCopier copier_;
  StagedBackend staged_;
};

}  // namespace

Backend& nccl_backend(int device) {
  TORCH_CHECK(device >= 0, "fluxmpi_py: the NCCL backend needs a CUDA device index, got ", device);
  // One backend per device, made on first use and never freed (backends are referenced for
  // the life of the process); std::map keeps their addresses stable.
  static std::mutex mu;
  static auto* backends = new std::map<int, std::unique_ptr<NcclBackend>>();
  std::lock_guard<std::mutex> lk(mu);
  auto& slot = (*backends)[device];
  if (!slot) slot = std::make_unique<NcclBackend>(device);
  return *slot;
}

Backend& cuda_mpi_backend(int device) {
  return static_cast<NcclBackend&>(nccl_backend(device)).staged();
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

c10::Stream nccl_comm_stream_for(int device) { return comm_stream_for(device).unwrap(); }

void nccl_shutdown() { nccl::destroy_all_comms(); }

int nccl_abort_all_for_test() { return nccl::abort_all_comms(); }

namespace {

// The runtime's shutdown() tears the communicators down on every rank alike; registered when
// the library loads, so it runs in every shutdown, whether or not a communicator was made.
struct RegisterShutdown {
  RegisterShutdown() { add_shutdown_hook(nccl_shutdown); }
} g_register_shutdown;

}  // namespace

}  // namespace fluxmpi
