#include "backend/mpi_direct.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "backend/mpi_check.h"
#include "runtime/call_watch.h"

namespace fluxmpi {

namespace {

// On fluxmpi's own communicator (never the user's: c10d point-to-point has its own), beside
// the ring's 0x464d.
constexpr int kHeadTag = 0x464e;
constexpr int kDataTag = 0x464f;

// A header's message is at most this many bytes: one shared-memory fragment below Open MPI's
// default eager limit (btl_sm_eager_limit, 4096 bytes with MPI's own header), so it goes
// eagerly, without the rendezvous a larger message takes (about 2 µs there).
constexpr std::int64_t kSlotWords = 4000 / 8;
// Payloads up to this many bytes fill the header's message and send only the rest apart
// (a 4 KiB payload: two eager messages); larger ones go whole as a second message, straight
// from the caller's buffer into the receiver's.
constexpr std::int64_t kSplitBytes = std::int64_t(8) << 10;

bool same_head(const DirectHead& a, const DirectHead& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.bytes == b.bytes &&
         a.root == b.root;
}

// The bytes of a payload that ride in its header's message of `words` words (a multiple of 8);
// the rest, if any, follows as one data message.
std::int64_t inline_bytes(const DirectHead& h, std::int64_t words) {
  const std::int64_t room = (kSlotWords - words) * 8;
  if (h.bytes <= room) return h.bytes;
  return h.bytes <= kSplitBytes ? room : 0;
}

// This thread's buffers, kept between calls (a loop of one size allocates once): its own
// message, one slot per peer for theirs, and scratch for the data of one peer each.
struct Buffers {
  std::vector<std::int64_t> mine;
  std::vector<std::int64_t> slots;
  std::vector<std::vector<std::int64_t>> scratch;
  std::vector<MPI_Request> sends;
  std::vector<MPI_Request> heads;
  std::vector<DirectHead> peer_heads;
  std::vector<const void*> from;
};
thread_local Buffers t_buf;

// One at a time, not MPI_Waitall: its error would be MPI_ERR_IN_STATUS, and a lost rank must
// read as one (mpi_check: RanksLost in the shrink mode).
void wait_all(std::vector<MPI_Request>& r) {
  for (MPI_Request& q : r) mpi_check(MPI_Wait(&q, MPI_STATUS_IGNORE), "MPI_Wait");
  r.clear();
}

}  // namespace

bool mpi_exchange_direct(DirectExchange& x, MPI_Comm comm, int rank, int size, int group,
                         DirectSlots* shm) {
  TORCH_INTERNAL_ASSERT(size > 1 && size <= kDirectMaxRanks, "a direct agreement of ", size,
                        " ranks");
  BlockingCall guard("allreduce", group, x.head.bytes);
  x.delivered = false;
  Buffers& b = t_buf;
  const std::int64_t words = kDirectHeadWords + x.nlanes;  // a message without its payload
  TORCH_INTERNAL_ASSERT(words < kSlotWords, "fluxmpi_py: ", x.nlanes, " lanes");
  const std::int64_t slot = kSlotWords;
  bool sends_any = false;
  for (int p = 0; p < size; ++p) sends_any = sends_any || direct_sends(x.head, rank, p);
  const std::int64_t inl = sends_any ? inline_bytes(x.head, words) : 0;
  std::int64_t rest = sends_any ? x.head.bytes - inl : 0;
  // A payload past one eager fragment goes through this rank's next slot where it fits.
  const bool in_shm = shm != nullptr && shm->shared();
  x.head.shared_slot = -1;
  if (in_shm && rest > 0 && inl == 0 && x.head.bytes <= kDirectSlotBytes) {
    x.head.shared_slot = shm->writes++ % 2;
    write_slot(shm->slot(rank, x.head.shared_slot), x.data, rest);  // before its header
    note_slot_write();
    rest = 0;
  }
  b.mine.resize(static_cast<std::size_t>(slot));
  std::memcpy(b.mine.data(), &x.head, sizeof x.head);
  std::memcpy(b.mine.data() + kDirectHeadWords, x.lanes, sizeof(std::int64_t) * x.nlanes);
  if (inl > 0) std::memcpy(b.mine.data() + words, x.data, static_cast<std::size_t>(inl));
  b.slots.resize(static_cast<std::size_t>(slot * size));
  b.sends.clear();
  b.heads.clear();
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    MPI_Request r;
    mpi_check(MPI_Irecv(b.slots.data() + slot * p, static_cast<int>(slot), MPI_INT64_T, p, kHeadTag,
                        comm, &r),
              "MPI_Irecv");
    b.heads.push_back(r);
  }
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const bool data = direct_sends(x.head, rank, p);
    const auto count = static_cast<int>(words + (data ? (inl + 7) / 8 : 0));
    MPI_Request r;
    mpi_check(MPI_Isend(b.mine.data(), count, MPI_INT64_T, p, kHeadTag, comm, &r), "MPI_Isend");
    b.sends.push_back(r);
    if (data && rest > 0) {
      mpi_check(MPI_Isend(static_cast<const char*>(x.data) + inl, static_cast<int>(rest), MPI_BYTE,
                          p, kDataTag, comm, &r),
                "MPI_Isend");
      b.sends.push_back(r);
    }
  }
  wait_all(b.heads);
  // Every rank's lanes and head: the lanes' max, and whether every call moves the same.
  bool same = x.head.kind != kEnvelopeNone;
  std::vector<DirectHead>& heads = b.peer_heads;
  heads.resize(static_cast<std::size_t>(size));
  for (int p = 0; p < size; ++p) {
    if (p == rank) {
      heads[p] = x.head;
      continue;
    }
    const std::int64_t* m = b.slots.data() + slot * p;
    std::memcpy(static_cast<void*>(&heads[p]), m, sizeof(DirectHead));
    for (int i = 0; i < x.nlanes; ++i) x.lanes[i] = std::max(x.lanes[i], m[kDirectHeadWords + i]);
    same = same && same_head(heads[p], x.head);
  }
  const bool passed = x.passed && x.passed(x.lanes);  // the same on every rank
  const bool take = same && passed;
  std::atomic_thread_fence(std::memory_order_acquire);  // the slots the headers announce
  // The data sent to this rank, from each peer whose header says so: its part in the header's
  // message, and the rest (the sender's announced size) into scratch or, for a broadcast
  // taken, straight into the caller's buffer.
  auto* dest = static_cast<char*>(x.dest);
  b.scratch.resize(static_cast<std::size_t>(size));
  b.from.assign(static_cast<std::size_t>(2 * size), nullptr);
  for (int p = 0; p < size; ++p) {
    const DirectHead& h = heads[p];
    if (!direct_sends(h, p, rank)) continue;
    const std::int64_t in_head = inline_bytes(h, words);
    const std::int64_t apart = h.bytes - in_head;
    b.from[2 * p] = b.slots.data() + slot * p + words;
    if (take && h.kind == kEnvelopeTake) {
      std::memcpy(dest, b.from[2 * p], static_cast<std::size_t>(in_head));
      b.from[2 * p] = nullptr;
    }
    if (apart == 0) continue;
    if (h.shared_slot >= 0) {  // in the sender's slot: read only where the call passed
      TORCH_INTERNAL_ASSERT(in_shm, "fluxmpi_py: a direct payload in a slot this rank lacks");
      const char* at = shm->slot(p, h.shared_slot);
      if (take && h.kind == kEnvelopeTake) {
        std::memcpy(dest, at, static_cast<std::size_t>(apart));
      } else {
        b.from[2 * p + 1] = at;
      }
      continue;
    }
    void* into = nullptr;
    if (take && h.kind == kEnvelopeTake) {
      into = dest + in_head;
    } else {
      b.scratch[p].resize(static_cast<std::size_t>((apart + 7) / 8));
      into = b.scratch[p].data();
      b.from[2 * p + 1] = into;
    }
    mpi_check(
        MPI_Recv(into, static_cast<int>(apart), MPI_BYTE, p, kDataTag, comm, MPI_STATUS_IGNORE),
        "MPI_Recv");
  }
  wait_all(b.sends);  // `data` may be `dest`: sent before it changes
  // A passed agreement while this communicator has no slots: the caller makes them now, on
  // every rank alike (every rank saw the same lanes).
  const bool wants_slots = passed && shm == nullptr;
  if (!take) return wants_slots;
  const DirectHead& h = x.head;
  if (h.kind == kEnvelopeReduce) {
    const std::int64_t in_head = inline_bytes(h, words);
    const auto dt = static_cast<c10::ScalarType>(h.dtype);
    const auto op = static_cast<ReduceOp>(h.op);
    for (int p = 0; p < size; ++p) {
      if (!direct_sends(h, p, rank)) continue;
      bool ok = combine_elements(b.from[2 * p], dest, in_head, dt, op);
      if (h.bytes > in_head) {
        ok = ok && combine_elements(b.from[2 * p + 1], dest + in_head, h.bytes - in_head, dt, op);
      }
      TORCH_INTERNAL_ASSERT(ok, "fluxmpi_py: a direct reduction the envelope refuses");
    }
  }
  x.delivered = true;
  return wants_slots;
}

}  // namespace fluxmpi
