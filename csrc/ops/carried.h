// A small call's data carried in its agreement's own message (backend/envelope.h), so that the
// cross-rank check (ops/consensus.h) costs no round trip of its own.
//
// MPI collectives whose counts differ between ranks are undefined, so the message's size must
// be the same on every rank whatever their arguments. It is a function of what every rank of
// the group already agreed on: the previous agreement on the group said how many bytes its call
// offered to carry (Signature::carry_bytes), the same on every rank or else nothing; this
// agreement's message makes room for that many. A loop of calls of one size is then one message
// each; a call that does not fit sends its check alone and moves its data after it, as before.
// The reduced payload reaches the caller only after the agreement passed: a bad call leaves
// every tensor as it was.
//
// A group of at most kDirectMaxRanks ranks agrees point to point instead (backend/direct.h):
// each rank's header and its data travel at once, to the ranks that need them, and a message's
// size is its sender's own, announced in its header; so no room is needed, and a broadcast or
// reduce moves its data once, not as an allreduce.
#pragma once

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <functional>

#include "backend/direct.h"
#include "backend/envelope.h"
#include "backend/reduce_op.h"
#include "runtime/group.h"

namespace fluxmpi {

// The most bytes a call's data may carry in an envelope: past this the second round trip costs
// little beside the data, and the copies into and out of the message would cost more.
constexpr std::int64_t kMaxCarryBytes = std::int64_t(64) << 10;
// The direct path (backend/direct.h) carries larger calls. A broadcast goes straight from the
// root's buffer into the others' (one single-copy message each), as MPI_Bcast's own would: up to
// 1 MiB the check's own round trip was 5-12% of a bcast_ (docs/measurements.md), past it the
// data's time hides it. A reduction past kMaxCarryBytes rides only where its group's payloads go
// through shared memory (`slot_bytes`: Backend::direct_slot_bytes): there MPI's reduction, which
// overlaps the copy and the combine in segments, beat the direct path's scratch and combine.
// Through shared slots the three take 0.55-0.86x mpi4py's time at 256 KiB-1 MiB on 2 ranks.
constexpr std::int64_t kMaxDirectBroadcastBytes = std::int64_t(1) << 20;

// The most bytes a reduction on group `e` carries.
inline std::int64_t max_reduction_carry_bytes(const Group& e, std::int64_t slot_bytes) {
  return e.size() <= kDirectMaxRanks ? std::max(kMaxCarryBytes, slot_bytes) : kMaxCarryBytes;
}

// The most bytes a broadcast on group `e` carries.
inline std::int64_t max_broadcast_carry_bytes(const Group& e) {
  return e.size() <= kDirectMaxRanks ? kMaxDirectBroadcastBytes : kMaxCarryBytes;
}

// What a call offers to carry in its agreement (ops/consensus.h agree).
struct Carry {
  std::int64_t kind = kEnvelopeNone;   // kEnvelopeReduce, or kEnvelopeTake (a broadcast)
  c10::ScalarType dtype = c10::kByte;  // kEnvelopeReduce: the payload's elements
  ReduceOp op = ReduceOp::Sum;         // kEnvelopeReduce: how they combine
  const void* data = nullptr;          // this rank's payload (kEnvelopeTake: read on the root only)
  std::int64_t bytes = 0;
  bool present = false;  // kEnvelopeTake: this rank is the root
  // The direct path (backend/direct.h): kEnvelopeTake: the root; kEnvelopeReduce: the rank
  // that takes the result, -1 for every rank. `dest`: where this rank's result goes (a
  // reduction's holds this rank's payload already).
  std::int64_t root = -1;
  void* dest = nullptr;
  // Set by the agreement: whether the payload travelled, and the result (valid until this
  // thread's next agreement). Read only once agree() has returned.
  bool carried = false;
  const void* result = nullptr;
};

// The agreement's exchange of `lanes` int64 words `v` (max) over group `e`: on a small group the
// direct path; else a plain allreduce while the group's room is 0, or one envelope that also
// carries `carry` where it fits. `passed`, told the lanes' max, says whether the call passed:
// the direct path moves the data into carry->dest only then.
void exchange_lanes(std::int64_t* v, int lanes, const Group& e, Carry* carry,
                    const std::function<bool(const std::int64_t*)>& passed);

// The room the group's next agreement makes (bytes, 0 for none); every rank sets the same,
// from the lanes they just agreed on. A new communicator (a group, the world after a shrink)
// starts at 0.
void set_carry_room(const Group& e, std::int64_t bytes);

// Count a call whose agreement passed with its data carried (agree() calls it).
void note_carried();
// How many calls of this process carried their data in their agreement (for tests).
std::int64_t carried_calls();
// How many agreements of this process went point to point (backend/direct.h) (for tests).
std::int64_t direct_agreements();

}  // namespace fluxmpi
