#include "cuda/nccl_comm.h"

#include <c10/cuda/CUDAGuard.h>
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#include "cuda/nccl_check.h"
#include "runtime/call_watch.h"
#include "runtime/environment.h"
#include "runtime/stall_watch.h"

namespace fluxmpi::nccl {
namespace {

// Owns one ncclComm_t. Destroying is collective in spirit (NCCL flushes work the peers take
// part in), so it happens only through destroy_all_comms(), on every rank alike.
class Communicator {
 public:
  explicit Communicator(ncclComm_t comm) : comm_(comm) {}
  ~Communicator() {
    if (comm_ != nullptr) ncclCommDestroy(comm_);  // nothing to report to at teardown
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  ncclComm_t get() const { return comm_; }

  // After an asynchronous error the communicator cannot be flushed: abort it (local, never
  // waits for peers) so that the destructor has nothing left to do.
  void abort() {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  ncclComm_t comm_;
};

// A communicator's key: (the group's index, the CUDA device). Group indices are never reused
// on a rank, so a communicator of a group that is gone is never handed to another.
using CommKey = std::pair<int, int>;

struct Registry {
  std::mutex mu;
  std::map<CommKey, std::unique_ptr<Communicator>> comms;
};

Registry& registry() {
  // Deliberately never destroyed: a static destructor would run after Python's atexit has
  // finalized MPI and possibly while the CUDA runtime unloads, where ncclCommDestroy can
  // hang or crash. The operating system reclaims leftover communicators at exit;
  // destroy_all_comms() is the orderly way.
  static Registry& r = *std::make_unique<Registry>().release();
  return r;
}

// Rank 0's unique id together with the status of making it, so that a failure on rank 0
// becomes the same exception on every rank instead of leaving the others in MPI_Bcast.
struct IdMessage {
  ncclResult_t status;
  ncclUniqueId id;
};
static_assert(std::is_trivially_copyable_v<IdMessage>, "IdMessage travels as bytes");

ncclComm_t create_comm(int device, const Group& group) {
  IdMessage msg{};
  msg.status = ncclSuccess;
  if (group.rank() == 0) msg.status = ncclGetUniqueId(&msg.id);
  {
    BlockingCall guard("NCCL communicator setup (MPI_Bcast of the unique id)", group.index());
    int rc = MPI_Bcast(&msg, static_cast<int>(sizeof(msg)), MPI_BYTE, 0, group.comm());
    TORCH_CHECK(rc == MPI_SUCCESS, "fluxmpi_py: MPI_Bcast of the NCCL unique id failed on rank ",
                env().rank, " with MPI error code ", rc);
  }
  check_nccl(msg.status, "ncclGetUniqueId on the group's rank 0");
  c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device));
  ncclComm_t comm = nullptr;
  {
    BlockingCall guard("ncclCommInitRank", group.index());
    check_nccl(ncclCommInitRank(&comm, group.size(), msg.id, group.rank()), "ncclCommInitRank",
               comm);
  }
  return comm;
}

// A cudaEvent_t without timing, recorded once, polled until done.
class DoneEvent {
 public:
  DoneEvent() { FLUXMPI_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~DoneEvent() { cudaEventDestroy(event_); }
  DoneEvent(const DoneEvent&) = delete;
  DoneEvent& operator=(const DoneEvent&) = delete;

  void record(cudaStream_t stream) { FLUXMPI_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  bool done() const {
    cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    check_cuda(rc, "cudaEventQuery after an NCCL collective");
    return true;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// An asynchronous NCCL error (a peer's connection broke, a remote rank failed) would leave the
// kernel spinning forever; NCCL reports it here instead.
void check_async(const char* what, ncclComm_t comm, int device) {
  ncclResult_t async = ncclSuccess;
  check_nccl(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", comm);
  if (async == ncclSuccess || async == ncclInProgress) return;
  std::string message;
  try {
    check_nccl(async, what, comm);
  } catch (const c10::Error& err) {
    message = err.what_without_backtrace();
  }
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    for (auto it = r.comms.begin(); it != r.comms.end(); ++it) {
      if (it->second->get() == comm) {
        it->second->abort();
        r.comms.erase(it);
        break;
      }
    }
  }
  // Fatal for the job, as torch's NCCL async error handling is: the other ranks still hold the
  // old communicator, so a new one made here alone would hang this rank's next collective.
  abort_job(message + "; the NCCL communicator of cuda:" + std::to_string(device) +
            " was aborted and the job ends (the ranks' NCCL state can no longer agree)");
}

}  // namespace

ncclComm_t comm_for(int device, const Group& group) {
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  const CommKey key{group.index(), device};
  auto it = r.comms.find(key);
  if (it != r.comms.end()) return it->second->get();
  auto owned = std::make_unique<Communicator>(create_comm(device, group));
  ncclComm_t comm = owned->get();
  r.comms.emplace(key, std::move(owned));
  return comm;
}

void destroy_all_comms() {
  drain_watched();
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  // std::map iterates in (group, device) order, the same on every rank that made the same
  // calls.
  BlockingCall guard("ncclCommDestroy");
  r.comms.clear();
}

int abort_all_comms() {
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  const int n = static_cast<int>(r.comms.size());
  for (auto& kv : r.comms) kv.second->abort();
  r.comms.clear();
  return n;
}

void wait_for(const char* what, ncclComm_t comm, int device, const c10::cuda::CUDAStream& stream,
              int group) {
  DoneEvent done;
  done.record(stream.stream());
  BlockingCall guard(what, group);
  // Small collectives finish within microseconds: spin (yielding) first, then sleep in short
  // steps so that a long wait does not hold a core. NCCL's async error state is read about
  // once a millisecond; it is a cheap atomic read inside NCCL.
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto last_check = start;
  while (!done.done()) {
    const auto now = clock::now();
    if (comm != nullptr && now - last_check >= std::chrono::milliseconds(1)) {
      last_check = now;
      check_async(what, comm, device);
    }
    if (now - start < std::chrono::microseconds(100)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace fluxmpi::nccl

namespace fluxmpi::nccl {
namespace {

constexpr std::size_t kMaxWatched = 4096;

struct Watched {
  std::string what;
  ncclComm_t comm;
  int device;
  std::unique_ptr<DoneEvent> done;
  std::chrono::steady_clock::time_point since;
};

// The calls the host did not wait for, oldest first, and the thread that polls them. Leaked
// on purpose, as the registry is: the thread is detached and outlives static destruction.
struct Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Watched> pending;
  bool started = false;
};

Watchdog& watchdog() {
  static Watchdog& w = *std::make_unique<Watchdog>().release();
  return w;
}

void watchdog_loop() {
  auto& w = watchdog();
  std::unique_lock<std::mutex> lk(w.mu);
  while (true) {
    w.cv.wait(lk, [&] { return !w.pending.empty(); });
    // Done calls leave from the front; a call still running is checked for NCCL's errors and
    // its age. Calls complete in the order of their streams, so the front is the oldest.
    bool popped = false;
    while (!w.pending.empty() && w.pending.front().done->done()) {
      w.pending.pop_front();
      popped = true;
    }
    if (popped) w.cv.notify_all();  // drain_watched(), and watch() under back-pressure
    if (w.pending.empty()) continue;
    Watched& front = w.pending.front();
    const double timeout = stall_timeout_s();
    const auto age = std::chrono::steady_clock::now() - front.since;
    const std::string what = front.what;
    const ncclComm_t comm = front.comm;
    const int device = front.device;
    lk.unlock();
    if (comm != nullptr) check_async(what.c_str(), comm, device);  // ends the job on an error
    if (timeout > 0 && age > std::chrono::duration<double>(timeout)) {
      abort_job(
          "fluxmpi_py: " + what + " on cuda:" + std::to_string(device) +
          " has not completed on the GPU after " + std::to_string(static_cast<int>(timeout)) +
          " s (the stall timeout, Init(timeout=)): a peer rank never joined it, or this GPU's "
          "stream is held by earlier work; the job ends");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500));
    lk.lock();
  }
}

}  // namespace

void watch(const char* what, ncclComm_t comm, int device, const c10::cuda::CUDAStream& stream) {
  auto done = std::make_unique<DoneEvent>();
  done->record(stream.stream());
  auto& w = watchdog();
  std::unique_lock<std::mutex> lk(w.mu);
  if (!w.started) {
    w.started = true;
    std::thread(watchdog_loop).detach();
  }
  // Back-pressure: wait for the oldest (no BlockingCall: those count collectives, entered by
  // every rank alike; a hang here is the watchdog's to end).
  w.cv.wait(lk, [&] { return w.pending.size() < kMaxWatched; });
  w.pending.push_back(
      Watched{what, comm, device, std::move(done), std::chrono::steady_clock::now()});
  w.cv.notify_all();
}

void drain_watched() {
  auto& w = watchdog();
  std::unique_lock<std::mutex> lk(w.mu);
  w.cv.wait(lk, [&] { return w.pending.empty(); });
}

}  // namespace fluxmpi::nccl
