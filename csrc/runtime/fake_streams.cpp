#include "runtime/fake_streams.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>

#include "runtime/comm_stream_order.h"

namespace fluxmpi {

FakeStreams::~FakeStreams() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w->thread.join();
}

FakeStreams::Stream FakeStreams::new_stream() {
  std::lock_guard<std::mutex> lk(mu_);
  const auto s = static_cast<Stream>(workers_.size());
  workers_.push_back(std::make_unique<Worker>());
  workers_.back()->thread = std::thread([this, s] { run(s); });
  return s;
}

void FakeStreams::enqueue(Stream s, std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& w = *workers_.at(s);
    w.queue.push_back(std::move(work));
    ++w.queued;
  }
  cv_.notify_all();
}

FakeStreams::Event FakeStreams::record(Stream s) {
  std::lock_guard<std::mutex> lk(mu_);
  return Event{s, workers_.at(s)->queued};
}

void FakeStreams::wait(Stream s, const Event& e) {
  enqueue(s, [this, s, e] {
    std::unique_lock<std::mutex> lk(mu_);
    auto& me = *workers_[s];
    auto& other = *workers_[e.stream];
    me.blocked = true;
    cv_.notify_all();  // quiet() may now be true
    cv_.wait(lk, [&] { return other.done >= e.count || stopping_; });
    me.blocked = false;
  });
}

bool FakeStreams::quiet(Stream s) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto& w = *workers_.at(s);
  return w.done == w.queued || w.blocked;
}

bool FakeStreams::synchronize(Stream s, double timeout_s) {
  std::unique_lock<std::mutex> lk(mu_);
  const auto& w = *workers_.at(s);
  return cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                      [&] { return w.done == w.queued; });
}

void FakeStreams::run(Stream s) {
  std::unique_lock<std::mutex> lk(mu_);
  auto& w = *workers_[s];
  for (;;) {
    cv_.wait(lk, [&] { return !w.queue.empty() || stopping_; });
    if (w.queue.empty()) return;  // stopping, nothing left
    auto work = std::move(w.queue.front());
    w.queue.pop_front();
    lk.unlock();
    work();
    lk.lock();
    ++w.done;
    cv_.notify_all();
  }
}

int stream_order_probe(bool producer_wait, bool consumer_wait, double timeout_s) {
  std::atomic<int> data{0}, out{-1}, seen{-2};
  std::atomic<bool> gate{false};
  FakeStreams dev;
  struct OpenOnExit {  // an error below must not leave the producer's worker held forever
    std::atomic<bool>& gate;
    ~OpenOnExit() { gate = true; }
  } open_on_exit{gate};
  const auto producer = dev.new_stream(), comm = dev.new_stream(), consumer = dev.new_stream();
  // The producer's write is held back until the host opens the gate.
  dev.enqueue(producer, [&] {
    while (!gate.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    data = 7;
  });
  auto collective = [&](FakeStreams::Stream s) { dev.enqueue(s, [&] { out = 2 * data; }); };
  FakeStreams::Event done{};
  if (producer_wait) {
    done = run_ordered(dev, producer, comm, collective);
  } else {
    collective(comm);
    done = leave_stream(dev, comm);
  }
  if (consumer_wait) consume_after(dev, consumer, done);
  dev.enqueue(consumer, [&] { seen = out.load(); });
  // Open the gate only once neither stream can move by itself: a stream that should have
  // waited has run by then, reading what was there before the write.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!(dev.quiet(comm) && dev.quiet(consumer))) {
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline,
                "stream_order_probe: the streams never settled");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  gate = true;
  TORCH_CHECK(dev.synchronize(consumer, timeout_s) && dev.synchronize(comm, timeout_s),
              "stream_order_probe: the streams did not finish within ", timeout_s, " s");
  return seen.load();
}

}  // namespace fluxmpi
