// A stop that the ranks agree on: a signal (SIGUSR1 from Slurm's --signal or scancel
// --signal, SIGTERM at preemption) or a call marks a stop on the rank it reached, and the
// next agreement on the world (ops/consensus.h: every collective's first step, so the
// DistributedOptimizer's step carries it without a collective of its own) tells every rank
// at once. The handler stores one atomic flag (async-signal-safe). Until the program has
// asked whether to stop (arm_stop_signals' `armed`), a signal keeps its old action: a program
// that never asks ends on SIGTERM as before.
#pragma once

#include <cstdint>
#include <vector>

namespace fluxmpi {

// Mark a stop on this rank (what the signal handler does).
void request_stop() noexcept;
// Whether this rank has marked a stop (not yet agreed).
bool stop_requested_here() noexcept;

// The agreement's part: this rank's mark as a lane value, and the lanes' maximum over the
// world (non-zero: some rank marked a stop), which every rank records at the same agreement.
std::int64_t stop_lane() noexcept;
void note_stop_lane(std::int64_t agreed) noexcept;

// Whether the ranks have agreed on a stop; the same on every rank at the same point of the
// program (between collectives, none in flight).
bool stop_agreed() noexcept;
// The world agreement (ops/consensus.h world_agreements()) that carried it; -1 before.
std::int64_t stop_agreed_at() noexcept;

// Install the handlers for `signals` (once each; the old handler is kept and chained to while
// not armed). `armed`: from now on a signal marks a stop instead of its old action; a second
// SIGTERM or SIGINT after a marked stop takes its old action (a user who insists). In a
// process forked from this one (a DataLoader worker) SIGUSR1 does nothing and SIGTERM keeps
// its old action.
void install_stop_signals(const std::vector<int>& signals);
void arm_stop_signals(bool armed) noexcept;
bool stop_signals_armed() noexcept;

// Forget the stop (tests, and a program that goes on after it).
void clear_stop() noexcept;

}  // namespace fluxmpi
