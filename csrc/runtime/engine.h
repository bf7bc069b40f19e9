// The communication engine: one background thread that owns asynchronous communication.
// Work runs strictly in submission order (FIFO), which is what keeps every rank's sequence
// of collectives identical. An idle engine sleeps on a condition variable; it never polls.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/user_call.h"

namespace fluxmpi {

// A future-like handle to one item of engine work.
class Work {
 public:
  explicit Work(std::string what) : what_(std::move(what)) {}
  // Block until the work is done; rethrow its exception, if any. The caller releases the GIL.
  void wait();
  // True once done (an exception is raised by wait(), not here).
  bool test();
  const std::string& what() const { return what_; }
  // The user call that submitted this work (runtime/user_call.h): the engine thread runs
  // the work under that name, so that its messages name it too.
  const char* user_call_name() const { return call_; }
  bool user_call_checked() const { return checked_; }
  std::int64_t user_call_since_us() const { return since_us_; }
  void finish(std::exception_ptr error);
  // Run `fn` on the waiting thread after each successful wait() (set before the work is
  // submitted): for device work, the waiter's current stream waits for the work's end there.
  void set_after_wait(std::function<void()> fn) { after_wait_ = std::move(fn); }

 private:
  std::function<void()> after_wait_;
  std::string what_;
  const char* call_ = user_call();  // made on the submitting thread
  bool checked_ = fluxmpi::user_call_checked();
  std::int64_t since_us_ = fluxmpi::user_call_since_us();
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// The label of the engine work running on this thread ("gradient bucket 3 of 9: fc.weight"),
// or "" outside engine work: the stall report names the collective by it.
const char* running_work_label();

// Wraps work when it is submitted, on the submitting thread, so that it runs in the submitter's
// context: runtime/group.cpp registers one that makes the submitter's group current (the
// engine does not name groups). Set once while the library loads.
using SubmitContext = std::function<void()> (*)(std::function<void()>);
void set_submit_context(SubmitContext wrap);

class Engine {
 public:
  static Engine& get();

  // Queue `fn` to run on the engine thread after everything queued before it.
  std::shared_ptr<Work> submit(std::string what, std::function<void()> fn);

  // Run `fn` on the calling thread once all earlier work has finished, holding the engine so
  // that nothing else communicates meanwhile. Lowest latency for blocking collectives.
  // Called from work already running on the engine thread, it simply runs `fn` (waiting for
  // the engine there would wait for itself).
  void run_inline(const std::function<void()>& fn);

  // submit()'s work run as run_inline() runs it: now, on the calling thread, labelled `what`
  // for stall reports; returns it finished (an error it threw is rethrown by wait()). For a
  // caller that would only wait for submitted work: it saves the hand-off to the engine
  // thread and back.
  std::shared_ptr<Work> run_now(std::string what, const std::function<void()>& fn);

  // Finish queued work and join the thread (at exit). submit() after stop() runs inline.
  void stop();

  // With `on`, submit() runs its work at once on the calling thread (as run_inline does) and
  // returns a finished Work: for MPI libraries that allow calls from one thread only.
  void set_synchronous(bool on);

  ~Engine();

 private:
  Engine() = default;
  void loop();
  void ensure_thread();  // the thread starts on first submit(), so a world of one pays nothing

  std::mutex mu_;
  std::condition_variable work_cv_;  // work arrived or stop requested
  std::condition_variable idle_cv_;  // queue drained and nothing running
  std::deque<std::pair<std::shared_ptr<Work>, std::function<void()>>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool synchronous_ = false;
  std::thread thread_;
};

}  // namespace fluxmpi
