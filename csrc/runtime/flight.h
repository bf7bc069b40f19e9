// The flight recorder: each rank keeps its last N blocking collectives (kind, the user call
// with its site under FLUXMPI_DEBUG=detail, bytes, group, enter/start/end times) in a ring.
// BlockingCall (runtime/call_watch.h) writes it: one slot per call, no lock (an atomic
// counter and plain stores). When a directory is named, the ring is written to
// <dir>/fluxmpi_flight.<rank>.json on an abort (abort_job: the stall timeout, a rank that
// exited, an uncaught exception) and on SIGTERM or SIGINT (chained to the handler before).
// The dump allocates nothing and uses only async-signal-safe calls, so that a signal handler
// may run it; `python -m fluxmpi_py.flight DIR` reads the dumps.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace fluxmpi {

struct FlightRecord {
  std::int64_t seq = 0;       // this rank's record number, from 1
  int group = 0;              // 0: the world, else the group's index (runtime/group.h)
  std::int64_t number = 0;    // the call's number among its group's calls, from 1
  std::int64_t bytes = -1;    // what this rank moves, -1 when not known
  const char* kind = "";      // "allreduce" (a literal)
  const char* call = "";      // the user call ("allreduce_() at train.py:42"), interned, or ""
  std::int64_t enter_us = 0;  // wall clock, microseconds: the user call began
  std::int64_t start_us = 0;  // this rank reached the collective
  std::int64_t end_us = 0;    // it returned; 0 while in flight
};

// Slots kept (default 256); 0 turns the recorder off. Forgets what was recorded.
void set_flight_capacity(int slots);
int flight_capacity();

// Where the dumps go ("" for nowhere, the default) and this rank's number for the file's name.
// The first non-empty directory installs the SIGTERM and SIGINT handlers.
void set_flight_dir(const std::string& dir, int rank, int size);
std::string flight_dir();

// Microseconds of the wall clock (CLOCK_REALTIME; async-signal-safe).
std::int64_t flight_now_us();

// Open a record (BlockingCall's constructor); returns its handle for flight_end, or 0 when the
// recorder is off. `number` <= 0 takes the record's own sequence number.
std::int64_t flight_begin(const char* kind, int group, std::int64_t number, std::int64_t bytes,
                          const char* call, std::int64_t enter_us);
void flight_end(std::int64_t handle);

// The records kept, oldest first.
std::vector<FlightRecord> flight_records();

// Write the dump when a directory is named; returns whether it wrote one. `why` (may be "")
// goes into it. Once per process: the first event's dump stays (the stall timeout's, not the
// abort's or the launcher's SIGTERM that follow it). Async-signal-safe; a dump in progress
// on another thread wins.
bool flight_dump(const char* reason, const char* why);

}  // namespace fluxmpi
