// What a rank's watchdog answers to a stall report's status request, and its wire format: a
// string of fields (runtime/stall_watch.cpp sends it over the control communicator).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/call_status.h"

namespace fluxmpi {

// One rank's answer to a status request.
struct Answer {
  std::int64_t round = -1;
  CallStatus status;
  std::string stack;  // its main thread's Python stack, or "" when it could not be taken
  std::string site;   // the innermost frame outside fluxmpi_py: "train.py:42 in main"
};

std::string serialize_answer(const Answer& a);
// std::nullopt for a message that is not an Answer (a field missing or not a number).
std::optional<Answer> parse_answer(const std::string& in);

}  // namespace fluxmpi
