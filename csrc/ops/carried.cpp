#include "ops/carried.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/backend.h"

namespace fluxmpi {

namespace {

// The room per communicator. Communicators are never freed while the process runs
// (runtime/group.h, runtime/world_change.h), so a handle is never reused for another.
struct Room {
  MPI_Comm comm;
  std::int64_t bytes;
};
std::mutex g_mutex;
std::vector<Room> g_rooms;

std::int64_t room_of(MPI_Comm comm) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const Room& r : g_rooms) {
    if (r.comm == comm) return r.bytes;
  }
  return 0;
}

void set_room(MPI_Comm comm, std::int64_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (Room& r : g_rooms) {
    if (r.comm == comm) {
      r.bytes = bytes;
      return;
    }
  }
  if (bytes != 0) g_rooms.push_back({comm, bytes});
}

std::atomic<std::int64_t> g_carried{0};
std::atomic<std::int64_t> g_direct{0};

// This thread's envelope, kept between calls (a loop of one size allocates once).
thread_local std::vector<std::int64_t> t_envelope;

}  // namespace

void set_carry_room(const Group& e, std::int64_t bytes) {
  if (e.size() <= kDirectMaxRanks) return;  // a small group agrees point to point: no room
  set_room(e.comm(), bytes);
}

namespace {

void exchange_direct(std::int64_t* v, int lanes, Carry* carry,
                     const std::function<bool(const std::int64_t*)>& passed) {
  DirectExchange x;
  x.lanes = v;
  x.nlanes = lanes;
  if (carry != nullptr && carry->kind != kEnvelopeNone) {
    x.head.kind = carry->kind;
    x.head.dtype = carry->kind == kEnvelopeReduce ? static_cast<std::int64_t>(carry->dtype) : -1;
    x.head.op = carry->kind == kEnvelopeReduce ? static_cast<std::int64_t>(carry->op) : -1;
    x.head.bytes = carry->bytes;
    x.head.root = carry->root;
    x.data = carry->data;
    x.dest = carry->dest;
  }
  x.passed = passed;
  mpi_backend().exchange_direct(x);
  g_direct.fetch_add(1, std::memory_order_relaxed);
  if (x.delivered) {
    carry->carried = true;
    carry->result = carry->dest;
  }
}

}  // namespace

void exchange_lanes(std::int64_t* v, int lanes, const Group& e, Carry* carry,
                    const std::function<bool(const std::int64_t*)>& passed) {
  if (carry != nullptr) {
    carry->carried = false;
    carry->result = nullptr;
  }
  if (e.size() <= kDirectMaxRanks) return exchange_direct(v, lanes, carry, passed);
  const MPI_Comm comm = e.comm();
  const std::int64_t room = room_of(comm);
  if (room == 0) {
    mpi_backend().allreduce(v, lanes, c10::kLong, ReduceOp::Max);
    return;
  }
  const std::int64_t total = envelope_bytes(lanes, room);
  if (t_envelope.size() < static_cast<std::size_t>(total / 8)) t_envelope.resize(total / 8);
  std::int64_t* buf = t_envelope.data();
  std::int64_t* payload = buf + kEnvelopeHeadWords + lanes;
  EnvelopeHead head;
  head.lanes = lanes;
  const bool fits = carry != nullptr && carry->kind != kEnvelopeNone && carry->bytes <= room;
  if (fits) {
    head.kind = carry->kind;
    head.dtype = static_cast<std::int64_t>(carry->dtype);
    head.op = static_cast<std::int64_t>(carry->op);
    head.bytes = carry->bytes;
    head.present = carry->present ? 1 : 0;
    if (carry->kind == kEnvelopeReduce || carry->present) {
      std::memcpy(payload, carry->data, static_cast<std::size_t>(carry->bytes));
    }
  }
  std::memcpy(static_cast<void*>(buf), static_cast<const void*>(&head), sizeof head);
  std::memcpy(buf + kEnvelopeHeadWords, v, sizeof(std::int64_t) * lanes);
  try {
    mpi_backend().allreduce_envelope(buf, total);
  } catch (...) {
    set_room(comm, 0);  // whatever the other ranks saw, this communicator is done with
    throw;
  }
  std::memcpy(v, buf + kEnvelopeHeadWords, sizeof(std::int64_t) * lanes);
  std::memcpy(static_cast<void*>(&head), static_cast<const void*>(buf), sizeof head);
  if (fits && head.kind == carry->kind && (head.kind != kEnvelopeTake || head.present != 0)) {
    carry->carried = true;
    carry->result = payload;
  }
}

}  // namespace fluxmpi

namespace fluxmpi {
void note_carried() { g_carried.fetch_add(1, std::memory_order_relaxed); }
std::int64_t carried_calls() { return g_carried.load(std::memory_order_relaxed); }
std::int64_t direct_agreements() { return g_direct.load(std::memory_order_relaxed); }
}  // namespace fluxmpi
