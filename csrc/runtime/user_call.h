// The name of the user's call that is running ("DistributedOptimizer.step()"), so that error
// messages name what the user called instead of the internal collective inside it: agree()
// and the watchdog read it. Per thread; engine work carries the name of the call that
// submitted it (Engine::submit). Names are interned: the pointers stay valid for the process.
#pragma once

#include <cstdint>
#include <string>

namespace fluxmpi {

// The running user call's name on this thread, or "" when none is named.
const char* user_call();

// The name itself when one is set, else `fallback`.
const char* user_call_or(const char* fallback);

// Whether agree() checks the running call's name (ops/consensus.h): a call given a `name=`, or
// any public collective under FLUXMPI_DEBUG=detail, whose name then holds its call site. Ranks
// in calls of different checked names raise together instead of pairing by position.
bool user_call_checked();

// When this thread's user call began (wall clock, microseconds: runtime/flight.h), 0 when none
// is named: the flight recorder's "enter" time.
std::int64_t user_call_since_us();

// The interned copy of `name` (a lookup under a mutex; done once per user call).
const char* intern_call_name(const std::string& name);

// Names the user call for this thread while in scope, unless one is already named: the
// outermost call is the user's (synchronize_ inside save_checkpoint is save_checkpoint's).
// `name` must live as long as the process: a string literal or intern_call_name's result.
class UserCall {
 public:
  // `since_us`: when the call began, if on another thread (engine work); 0 for now.
  explicit UserCall(const char* name, bool checked = false, std::int64_t since_us = 0);
  ~UserCall();
  UserCall(const UserCall&) = delete;
  UserCall& operator=(const UserCall&) = delete;

 private:
  bool set_ = false;
};

// For Python's context manager: name the call unless one is named; returns whether it did.
// `checked`: see user_call_checked().
bool enter_user_call(const std::string& name, bool checked = false);
// Undo enter_user_call when it returned true.
void leave_user_call(bool entered);

}  // namespace fluxmpi
