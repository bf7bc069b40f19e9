#include "runtime/engine.h"

#include <c10/util/Exception.h>

namespace fluxmpi {

namespace {
// True on the engine thread, so that run_inline() from inside submitted work does not wait
// for the very work it is part of.
thread_local bool t_on_engine_thread = false;
thread_local const char* t_work_label = "";
SubmitContext g_submit_context = nullptr;

std::exception_ptr run_catching(const std::function<void()>& fn) {
  try {
    fn();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}
}  // namespace

void set_submit_context(SubmitContext wrap) { g_submit_context = wrap; }

const char* running_work_label() { return t_work_label; }

void Work::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  // Work still queued runs after whatever the engine thread is doing now (a future's callback,
  // say a DDP communication hook's then()): waiting for it there would wait forever.
  TORCH_CHECK(done_ || !t_on_engine_thread, "fluxmpi_py: waiting for ", what_,
              " on the communication engine's thread (inside a future callback such as a "
              "communication hook's then()) would wait forever, since that work runs after the "
              "callback returns; chain it with then() instead of waiting");
  cv_.wait(lk, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
  lk.unlock();
  if (after_wait_) after_wait_();
}

bool Work::test() {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

Engine& Engine::get() {
  // Leaked on purpose: it must outlive Python's atexit handlers, which stop it first.
  static Engine* engine = new Engine();
  return *engine;
}

Engine::~Engine() { stop(); }

void Engine::ensure_thread() {
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { loop(); });
}

std::shared_ptr<Work> Engine::submit(std::string what, std::function<void()> fn) {
  if (g_submit_context != nullptr) fn = g_submit_context(std::move(fn));
  // Submitted from the engine thread itself: by a future's callback (a communication hook's
  // then(), which runs on this thread as the future completes), or by work that calls
  // another collective. Queued, it would run only after that callback returns, so a callback
  // that waits for it (torch's PowerSGD hook waits on the future of the allreduce it starts)
  // would wait forever. It runs now instead, right after the work whose completion called the
  // callback, before anything queued: the same place on every rank.
  if (t_on_engine_thread) return run_now(std::move(what), fn);
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (!stopping_ && !synchronous_) {
      auto work = std::make_shared<Work>(std::move(what));
      ensure_thread();
      queue_.emplace_back(work, std::move(fn));
      lk.unlock();
      work_cv_.notify_one();
      return work;
    }
  }
  // Stopped (at exit) or synchronous: run now, in order after everything queued before.
  return run_now(std::move(what), fn);
}

std::shared_ptr<Work> Engine::run_now(std::string what, const std::function<void()>& fn) {
  auto work = std::make_shared<Work>(std::move(what));
  run_inline([&] {
    const char* outer = t_work_label;
    t_work_label = work->what().c_str();
    auto err = run_catching(fn);
    t_work_label = outer;
    work->finish(err);
  });
  return work;
}

void Engine::run_inline(const std::function<void()>& fn) {
  if (t_on_engine_thread) {
    fn();
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [this] { return queue_.empty() && !busy_; });
  busy_ = true;
  lk.unlock();
  try {
    fn();
  } catch (...) {
    lk.lock();
    busy_ = false;
    lk.unlock();
    work_cv_.notify_one();
    idle_cv_.notify_all();
    throw;
  }
  lk.lock();
  busy_ = false;
  bool more = !queue_.empty();
  lk.unlock();
  if (more) work_cv_.notify_one();
  idle_cv_.notify_all();
}

void Engine::loop() {
  t_on_engine_thread = true;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [this] { return !busy_ && (stopping_ || !queue_.empty()); });
    if (queue_.empty()) return;  // stopping, and nothing left to do
    auto item = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    std::exception_ptr err;
    {
      UserCall named(item.first->user_call_name(), item.first->user_call_checked(),
                     item.first->user_call_since_us());
      t_work_label = item.first->what().c_str();
      err = run_catching(item.second);
      t_work_label = "";
    }
    item.second = nullptr;  // drop captured tensors on this thread, before waking waiters
    item.first->finish(err);
    lk.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void Engine::set_synchronous(bool on) {
  std::lock_guard<std::mutex> lk(mu_);
  synchronous_ = on;
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace fluxmpi
