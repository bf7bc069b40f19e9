// A small group's agreement as point-to-point messages, with a small call's data in the same go
// (ops/carried.h builds them; backend/mpi_direct.cpp sends them).
//
// Each rank sends its header (the agreement's lanes and what its call moves) to every other
// rank and, at once, its data to the ranks that take it: a broadcast's root to every other
// rank, a reduction's ranks to the rank that takes the result (every other rank, for an
// allreduce). The data travels while the headers do, so the check costs no round trip of its
// own. Once the headers are in, every rank holds every rank's lanes and head, so each decides
// alone, and alike, whether the call passed. Only then does a rank receive the data sent to it:
// into the caller's buffer when every head is the same and the call passed, else into scratch
// that is thrown away. A bad call leaves every tensor as it was, and no message outlives its call
// (a receiver learns each message's size from its sender's header: nothing is truncated).
// Every agreement of such a group goes this way on every rank, and messages between two ranks
// never overtake each other, so each call's messages meet.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/envelope.h"

namespace fluxmpi {

// Groups of at most this many ranks agree point to point: a header to every other rank costs
// no more than MPI's allreduce of the lanes there. Larger groups use envelopes (envelope.h).
constexpr int kDirectMaxRanks = 4;

// What a rank's call moves; equal on every rank for the data to be taken.
struct DirectHead {
  std::int64_t kind = kEnvelopeNone;  // kEnvelopeReduce, kEnvelopeTake (a broadcast), or none
  std::int64_t dtype = -1;            // kEnvelopeReduce: the elements' c10::ScalarType
  std::int64_t op = -1;               // kEnvelopeReduce: the ReduceOp they combine with
  std::int64_t bytes = 0;             // the payload's bytes
  // kEnvelopeTake: the rank that sends; kEnvelopeReduce: the rank that takes the result, or -1
  // for every rank (an allreduce).
  std::int64_t root = -1;
  // Where the sender put its payload, if not in messages: its shared slot 0 or 1 (the MPI
  // backend's, on one host: backend/mpi_direct_slots.h); -1: in messages. Not compared.
  std::int64_t shared_slot = -1;
};

constexpr int kDirectHeadWords = static_cast<int>(sizeof(DirectHead) / sizeof(std::int64_t));

// Whether a rank whose call is `h` sends its data from rank `from` to rank `to`.
inline bool direct_sends(const DirectHead& h, int from, int to) {
  if (from == to || h.kind == kEnvelopeNone) return false;
  if (h.kind == kEnvelopeTake) return from == h.root;
  return h.root == -1 ? true : to == h.root && from != h.root;
}

// One rank's part of a direct agreement.
struct DirectExchange {
  std::int64_t* lanes = nullptr;  // in: this rank's; out: their max over the group's ranks
  int nlanes = 0;
  DirectHead head;             // kind none: this rank's call carries nothing
  const void* data = nullptr;  // this rank's payload (head.bytes), read while it is sent
  // Where this rank's result goes, when it takes one: a reduction combines the others' data
  // into it (so it holds this rank's own payload already; it may be `data`), a broadcast
  // writes the root's bytes there.
  void* dest = nullptr;
  // Told the lanes' max: whether the call passed (then its data may reach `dest`).
  std::function<bool(const std::int64_t*)> passed;
  bool delivered = false;  // out: every head was the same, the call passed, `dest` holds it
};

}  // namespace fluxmpi
