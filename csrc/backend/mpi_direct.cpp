#include "backend/mpi_direct.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/mpi_check.h"

namespace fluxmpi {

namespace {

// On fluxmpi's own communicator (never the user's: c10d point-to-point has its own), beside
// the ring's 0x464d.
constexpr int kHeadTag = 0x464e;
constexpr int kDataTag = 0x464f;

constexpr std::int64_t kInlineWords = kDirectInlineBytes / 8;

bool same_head(const DirectHead& a, const DirectHead& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.bytes == b.bytes &&
         a.root == b.root;
}

bool inline_payload(const DirectHead& h) { return h.bytes <= kDirectInlineBytes; }

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

void mpi_exchange_direct(DirectExchange& x, MPI_Comm comm, int rank, int size) {
  TORCH_INTERNAL_ASSERT(size > 1 && size <= kDirectMaxRanks, "a direct agreement of ", size,
                        " ranks");
  x.delivered = false;
  Buffers& b = t_buf;
  const std::int64_t words = kDirectHeadWords + x.nlanes;  // a message without its payload
  const std::int64_t slot = words + kInlineWords;
  bool sends_any = false;
  for (int p = 0; p < size; ++p) sends_any = sends_any || direct_sends(x.head, rank, p);
  const bool sends_inline = sends_any && inline_payload(x.head);
  b.mine.resize(static_cast<std::size_t>(slot));
  std::memcpy(b.mine.data(), &x.head, sizeof x.head);
  std::memcpy(b.mine.data() + kDirectHeadWords, x.lanes, sizeof(std::int64_t) * x.nlanes);
  if (sends_inline && x.head.bytes > 0) {
    std::memcpy(b.mine.data() + words, x.data, static_cast<std::size_t>(x.head.bytes));
  }
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
    const auto count = static_cast<int>(data && sends_inline ? slot : words);
    MPI_Request r;
    mpi_check(MPI_Isend(b.mine.data(), count, MPI_INT64_T, p, kHeadTag, comm, &r), "MPI_Isend");
    b.sends.push_back(r);
    if (data && !sends_inline) {
      mpi_check(MPI_Isend(const_cast<void*>(x.data), static_cast<int>(x.head.bytes), MPI_BYTE, p,
                          kDataTag, comm, &r),
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
  const bool take = same && x.passed && x.passed(x.lanes);
  // The data sent to this rank, from each peer whose header says so: where it is not inline,
  // a message of the sender's announced size, into scratch or (a broadcast taken) the caller's.
  b.scratch.resize(static_cast<std::size_t>(size));
  std::vector<const void*>& from = b.from;
  from.assign(static_cast<std::size_t>(size), nullptr);
  for (int p = 0; p < size; ++p) {
    const DirectHead& h = heads[p];
    if (!direct_sends(h, p, rank)) continue;
    if (inline_payload(h)) {
      from[p] = b.slots.data() + slot * p + words;
      continue;
    }
    void* into = nullptr;
    if (take && h.kind == kEnvelopeTake) {
      into = x.dest;
    } else {
      b.scratch[p].resize(static_cast<std::size_t>((h.bytes + 7) / 8));
      into = b.scratch[p].data();
    }
    mpi_check(
        MPI_Recv(into, static_cast<int>(h.bytes), MPI_BYTE, p, kDataTag, comm, MPI_STATUS_IGNORE),
        "MPI_Recv");
    from[p] = into;
  }
  wait_all(b.sends);  // `data` may be `dest`: sent before it changes
  if (!take) return;
  const DirectHead& h = x.head;
  for (int p = 0; p < size; ++p) {
    if (from[p] == nullptr || from[p] == x.dest) continue;
    if (h.kind == kEnvelopeTake) {
      std::memcpy(x.dest, from[p], static_cast<std::size_t>(h.bytes));
    } else {
      const bool ok =
          combine_elements(from[p], x.dest, h.bytes, static_cast<c10::ScalarType>(h.dtype),
                           static_cast<ReduceOp>(h.op));
      TORCH_INTERNAL_ASSERT(ok, "fluxmpi_py: a direct reduction the envelope refuses");
    }
  }
  x.delivered = true;
}

}  // namespace fluxmpi
