#include "runtime/user_call.h"

#include "runtime/flight.h"

#include <memory>
#include <mutex>
#include <unordered_map>

namespace fluxmpi {
namespace {

thread_local const char* t_user_call = "";
thread_local bool t_checked = false;
thread_local std::int64_t t_since_us = 0;

}  // namespace

const char* user_call() { return t_user_call; }

const char* user_call_or(const char* fallback) { return *t_user_call ? t_user_call : fallback; }

bool user_call_checked() { return t_checked; }

std::int64_t user_call_since_us() { return t_since_us; }

const char* intern_call_name(const std::string& name) {
  // Leaked on purpose: engine work and the watchdog may read a name during interpreter exit.
  static auto* mu = new std::mutex();
  static auto* names = new std::unordered_map<std::string, std::unique_ptr<std::string>>();
  std::lock_guard<std::mutex> lk(*mu);
  auto& slot = (*names)[name];
  if (!slot) slot = std::make_unique<std::string>(name);
  return slot->c_str();
}

UserCall::UserCall(const char* name, bool checked, std::int64_t since_us) {
  if (*t_user_call || name == nullptr || !*name) return;
  t_user_call = name;
  t_checked = checked;
  t_since_us = since_us > 0 ? since_us : flight_now_us();
  set_ = true;
}

UserCall::~UserCall() {
  if (!set_) return;
  t_user_call = "";
  t_checked = false;
  t_since_us = 0;
}

bool enter_user_call(const std::string& name, bool checked) {
  if (*t_user_call || name.empty()) return false;
  t_user_call = intern_call_name(name);
  t_checked = checked;
  t_since_us = flight_now_us();
  return true;
}

void leave_user_call(bool entered) {
  if (!entered) return;
  t_user_call = "";
  t_checked = false;
  t_since_us = 0;
}

}  // namespace fluxmpi
