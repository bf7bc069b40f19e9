#include "c10d/point_to_point.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <mpi.h>

#include <chrono>
#include <limits>
#include <mutex>
#include <thread>

#include "runtime/engine.h"
#include "runtime/environment.h"

namespace fluxmpi {

namespace {

MPI_Comm g_p2p = MPI_COMM_NULL;

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
  P2PWork(c10d::OpType type, at::Tensor target, at::Tensor buffer)
      : c10d::Work(env().rank, type),
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
        check_mpi(MPI_Isend(buffer_.data_ptr(), count, MPI_BYTE, peer, tag, g_p2p, &request_),
                  "MPI_Isend");
      } else {
        check_mpi(MPI_Irecv(buffer_.data_ptr(), count, MPI_BYTE, src, tag, g_p2p, &request_),
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

  at::Tensor target_;
  at::Tensor buffer_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  mutable std::mutex mu_;
  bool done_ = false;
  int source_ = -1;
};

void check_peer(int peer, bool any_allowed) {
  const auto& e = env();
  if (any_allowed && peer == kAnySource) return;
  TORCH_CHECK_VALUE(peer >= 0 && peer < e.size, "fluxmpi: rank ", peer,
                    " is not a rank of this group of ", e.size);
}

void check_host_tensor(const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.defined() && t.is_cpu() && t.layout() == c10::kStrided,
                   "fluxmpi: send and recv take dense CPU tensors");
}

}  // namespace

void ensure_p2p_comm() {
  if (g_p2p != MPI_COMM_NULL) return;
  Engine::get().run_inline([] {
    BlockingCall guard("point-to-point communicator");
    check_mpi(MPI_Comm_dup(env().comm, &g_p2p), "MPI_Comm_dup");
  });
  add_shutdown_hook([] {
    if (g_p2p != MPI_COMM_NULL) MPI_Comm_free(&g_p2p);
  });
}

c10::intrusive_ptr<c10d::Work> start_send(const at::Tensor& t, int dst, int tag) {
  check_host_tensor(t);
  check_peer(dst, false);
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  auto work = c10::make_intrusive<P2PWork>(c10d::OpType::SEND, t, buf);
  work->start(dst, tag);
  return work;
}

c10::intrusive_ptr<c10d::Work> start_recv(const at::Tensor& t, int src, int tag) {
  check_host_tensor(t);
  check_peer(src, true);
  at::Tensor buf = t.is_contiguous() ? t : at::empty_like(t, at::MemoryFormat::Contiguous);
  auto work = c10::make_intrusive<P2PWork>(
      src == kAnySource ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV, t, buf);
  work->start(src, tag);
  return work;
}

}  // namespace fluxmpi
