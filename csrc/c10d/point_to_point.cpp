#include "c10d/point_to_point.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <mpi.h>

#include <chrono>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/call_watch.h"
#include "runtime/engine.h"
#include "runtime/environment.h"

namespace fluxmpi {

namespace {

// Each group's point-to-point communicator, by group index; freed at shutdown.
std::mutex g_p2p_mu;
std::map<int, MPI_Comm> g_p2p;

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  TORCH_CHECK(false, "fluxmpi: ", what, " failed: ", std::string(text, len));
}

// One send or receive in flight. The staging buffer is the tensor itself when it is a
// contiguous host tensor, else a copy that a receive writes back when it completes.
class P2PWork : public c10d::Work {
 public:
  P2PWork(MPI_Comm comm, int rank, c10d::OpType type, at::Tensor target, at::Tensor buffer)
      : c10d::Work(rank, type),
        comm_(comm),
        target_(std::move(target)),
        buffer_(std::move(buffer)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  void start(int peer, int tag) {
    const auto bytes = buffer_.numel() * static_cast<std::int64_t>(buffer_.element_size());
    TORCH_CHECK_VALUE(bytes <= std::numeric_limits<int>::max(), "fluxmpi: a message of ", bytes,
                      " bytes is past MPI's int counts; send it in parts");
    const int count = static_cast<int>(bytes);
    const int src = peer == kAnySource ? MPI_ANY_SOURCE : peer;
    Engine::get().run_inline([&] {
      if (retrieveOpType() == c10d::OpType::SEND) {
        check_mpi(MPI_Isend(buffer_.data_ptr(), count, MPI_BYTE, peer, tag, comm_, &request_),
                  "MPI_Isend");
      } else {
        check_mpi(MPI_Irecv(buffer_.data_ptr(), count, MPI_BYTE, src, tag, comm_, &request_),
                  "MPI_Irecv");
      }
    });
  }

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(mu_);
    return poll_locked();
  }

  bool isSuccess() const override { return true; }

  int sourceRank() const override {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK(done_, "fluxmpi: sourceRank() is known once the receive has completed");
    return source_;
  }

  std::vector<at::Tensor> result() override { return {target_}; }

  bool wait(std::chrono::milliseconds /*timeout*/) override {
    // Polled, so that the engine stays free for the collectives this message may depend on.
    auto pause = std::chrono::microseconds(20);
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (poll_locked()) return true;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  bool poll_locked() {
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    Engine::get().run_inline([&] { check_mpi(MPI_Test(&request_, &flag, &status), "MPI_Test"); });
    if (!flag) return false;
    source_ = status.MPI_SOURCE;
    if (retrieveOpType() != c10d::OpType::SEND) {
      if (buffer_.is_same(target_)) {
        target_.unsafeGetTensorImpl()->bump_version();  // written through data_ptr()
      } else {
        target_.copy_(buffer_);
      }
    }
    done_ = true;
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{target_}));
    return true;
  }

  MPI_Comm comm_;
  at::Tensor target_;
  at::Tensor buffer_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  mutable std::mutex mu_;
  bool done_ = false;
  int source_ = -1;
};

void check_peer(int peer, int size, bool any_allowed) {
  if (any_allowed && peer == kAnySource) return;
  TORCH_CHECK_VALUE(peer >= 0 && peer < size, "fluxmpi: rank ", peer,
                    " is not a rank of this group of ", size);
}

void check_host_tensor(const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.defined() && t.is_cpu() && t.layout() == c10::kStrided,
                   "fluxmpi: send and recv take dense CPU tensors");
}

}  // namespace

MPI_Comm ensure_p2p_comm(const Group& g) {
  std::lock_guard<std::mutex> lock(g_p2p_mu);
  if (auto it = g_p2p.find(g.index()); it != g_p2p.end()) return it->second;
  MPI_Comm comm = MPI_COMM_NULL;
  Engine::get().run_inline([&] {
    BlockingCall guard("point-to-point communicator", g.index());
    check_mpi(MPI_Comm_dup(g.comm(), &comm), "MPI_Comm_dup");
  });
  if (g_p2p.empty()) {
    add_shutdown_hook([] {
      std::lock_guard<std::mutex> lock(g_p2p_mu);
      // A sub-group's is left to MPI_Finalize, like the group's own communicator
      // (runtime/group.h): its members may not all reach this hook.
      auto world = g_p2p.find(0);
      if (world != g_p2p.end() && world->second != MPI_COMM_NULL) MPI_Comm_free(&world->second);
      g_p2p.clear();
    });
  }
  g_p2p[g.index()] = comm;
  return comm;
}

c10::intrusive_ptr<c10d::Work> start_send(MPI_Comm comm, int rank, int size, const at::Tensor& t,
                                          int dst, int tag) {
  check_host_tensor(t);
  check_peer(dst, size, false);
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  auto work = c10::make_intrusive<P2PWork>(comm, rank, c10d::OpType::SEND, t, buf);
  work->start(dst, tag);
  return work;
}

c10::intrusive_ptr<c10d::Work> start_recv(MPI_Comm comm, int rank, int size, const at::Tensor& t,
                                          int src, int tag) {
  check_host_tensor(t);
  check_peer(src, size, true);
  at::Tensor buf = t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
  auto work = c10::make_intrusive<P2PWork>(
      comm, rank, src == kAnySource ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV, t, buf);
  work->start(src, tag);
  return work;
}

}  // namespace fluxmpi
