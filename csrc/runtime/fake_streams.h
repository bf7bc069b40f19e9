// A fake asynchronous device for the CPU tests of runtime/comm_stream_order.h: each stream is a
// worker thread that runs queued closures in order, and an event is a count of a stream's
// closures (complete once that many have run). A stream that waits for an event blocks its
// worker, not the host, as cudaStreamWaitEvent does. Nothing in the library uses it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace fluxmpi {

class FakeStreams {
 public:
  using Stream = int;
  struct Event {
    Stream stream;
    std::uint64_t count;  // complete once `stream` has run this many closures
  };

  FakeStreams() = default;
  ~FakeStreams();
  FakeStreams(const FakeStreams&) = delete;
  FakeStreams& operator=(const FakeStreams&) = delete;

  Stream new_stream();
  void enqueue(Stream s, std::function<void()> work);
  Event record(Stream s);
  void wait(Stream s, const Event& e);
  // True while `s` can make no progress by itself: nothing queued, or its worker blocked in a
  // wait. The tests open their gates only then, so that a missing wait shows deterministically.
  bool quiet(Stream s);
  // The host waits until `s` has run everything queued on it (false after `timeout_s`).
  bool synchronize(Stream s, double timeout_s);

 private:
  struct Worker {
    std::deque<std::function<void()>> queue;
    std::uint64_t queued = 0;
    std::uint64_t done = 0;
    bool blocked = false;  // inside a wait for another stream's event
    std::thread thread;
  };
  void run(Stream s);

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
};

// The ordering of run_ordered over FakeStreams with a producer whose write is held back until
// the communication and consumer streams are quiet: returns what the consumer read, 2 * 7 = 14
// when every wait is there. `producer_wait` false leaves out enter_stream's wait (the
// collective reads the value before the write: 0), `consumer_wait` false leaves out
// consume_after (the consumer reads before the collective wrote: -1). A hang past `timeout_s`
// raises.
int stream_order_probe(bool producer_wait, bool consumer_wait, double timeout_s);

}  // namespace fluxmpi
