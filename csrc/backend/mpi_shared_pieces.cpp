#include "backend/mpi_shared_pieces.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "backend/mpi_check.h"
#include "backend/pieces.h"
#include "backend/shm_segment.h"

namespace fluxmpi {

namespace {

std::atomic<std::int64_t> g_calls{0};
std::atomic<std::int64_t> g_scatter_calls{0};
std::atomic<std::int64_t> g_owner_calls{0};

// The communicator's shared memory (backend/shm_segment.h), made at its first call here (a
// collective: every rank reaches it at the same call), or nullptr where nothing is shared (the
// same on every rank): then the caller takes its messages.
const ShmSegment* segment_of(MPI_Comm comm) {
  const ShmSegment* s = find_shm_segment(comm, ShmUse::SharedPieces);
  if (s == nullptr) {
    s = &keep_shm_segment(comm, ShmUse::SharedPieces, std::make_unique<ShmSegment>(),
                          kSharedWindowBytes, /*one_host=*/true);
  }
  return s->mapped ? s : nullptr;
}

// The bytes of one slot of a window shared by p ranks, the same for every dtype and every
// call (round, scatter_reduce, owner_parts): the finished chunk, slot p - 1, then starts at the
// same byte for all of them. A call's first writes (into slots 0 to p - 2, with no meeting
// before them) so never reach the finished chunk of the call before it, which a slower rank
// may still be copying out. (Slots of `bytes / p / sizeof(T)` elements differed by dtype: at 3
// ranks a float32 call's slot 1 ended 8 bytes into a float64 call's finished chunk.)
std::int64_t slot_bytes(int p) { return kSharedWindowBytes / p / 64 * 64; }

// Every rank's writes to the windows are visible to every rank after this, and every rank's
// reads before it are done. The barrier orders the ranks: each leaves it only after every rank
// has entered it. The fences order this rank's own plain loads and stores of the windows around
// the barrier's, for the compiler and the processor: the one before keeps them from moving past
// this rank's entry, the one after keeps later ones from moving before its exit (a full fence
// each side, as MPI_Win_sync is in Open MPI's shared-memory windows). The barrier's own
// messages go through shared memory with release and acquire ordering of their own.
void meet(MPI_Comm comm) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  mpi_check(MPI_Barrier(comm), "MPI_Barrier (grouped allreduce)");
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// A round over the elements [b, b + m): chunk c is rank c's to reduce. Window layout, in
// elements of T: the slots of the p - 1 other ranks' parts (`cap` each), then the finished
// chunk. No meeting is needed after the copies out: the next round's (or call's) writes to a
// slot or a finished chunk come after a meeting that every rank reaches only when done here.
template <typename T>
void round(const PieceView<T>& v, std::int64_t b, std::int64_t m, std::int64_t cap, ReduceOp op,
           int divisor, const ShmSegment& w, MPI_Comm comm, int rank, int p) {
  auto lo = [&](int c) { return b + m * c / p; };
  auto slot = [&](int owner, int s) { return reinterpret_cast<T*>(w.base[owner]) + s * cap; };
  for (int c = 0; c < p; ++c) {  // 1. my parts of the others' chunks, into their slots
    if (c == rank) continue;
    T* dst = slot(c, (rank - c - 1 + p) % p);
    v.runs(lo(c), lo(c + 1) - lo(c), [&](T* at, std::int64_t k, std::int64_t pos) {
      std::memcpy(dst + pos, at, static_cast<std::size_t>(k) * sizeof(T));
    });
  }
  meet(comm);
  T* done = slot(rank, p - 1);  // 2. my chunk: reduced in my pieces, published in my window
  v.runs(lo(rank), lo(rank + 1) - lo(rank), [&](T* at, std::int64_t k, std::int64_t pos) {
    for (int s = 0; s + 2 < p; ++s) combine(op, at, slot(rank, s) + pos, k, 1);
    combine_and_copy(op, at, slot(rank, p - 2) + pos, done + pos, k, divisor);
  });
  meet(comm);
  for (int c = 0; c < p; ++c) {  // 3. the others' finished chunks, into my pieces
    if (c == rank) continue;
    const T* src = slot(c, p - 1);
    v.runs(lo(c), lo(c + 1) - lo(c), [&](T* at, std::int64_t k, std::int64_t pos) {
      std::memcpy(at, src + pos, static_cast<std::size_t>(k) * sizeof(T));
    });
  }
}

template <typename T>
void reduce(const std::vector<BufferPiece>& pieces, std::int64_t count, ReduceOp op, int divisor,
            const ShmSegment& w, MPI_Comm comm, int rank, int size) {
  const PieceView<T> v(pieces);
  const std::int64_t cap = slot_bytes(size) / static_cast<std::int64_t>(sizeof(T));
  const std::int64_t per_round = cap * size;  // every chunk of a round fits its `cap`
  for (std::int64_t b = 0; b < count; b += per_round) {
    round(v, b, std::min(per_round, count - b), cap, op, divisor, w, comm, rank, size);
  }
}

// Rounds of at most `cap` elements of each rank's chunk; slot s of rank c's window holds rank
// (c + s + 1) % p's part of it, as in round() above. The meeting after the reduction frees the
// slots for the next round's (or call's) writes.
template <typename T>
void scatter_reduce(const T* send, T* recv, const std::vector<std::int64_t>& counts, ReduceOp op,
                    const ShmSegment& w, MPI_Comm comm, int rank, int p) {
  const std::int64_t cap = slot_bytes(p) / static_cast<std::int64_t>(sizeof(T));
  std::vector<std::int64_t> off(p + 1, 0);
  for (int c = 0; c < p; ++c) off[c + 1] = off[c] + counts[c];
  const std::int64_t longest = *std::max_element(counts.begin(), counts.end());
  auto slot = [&](int owner, int s) { return reinterpret_cast<T*>(w.base[owner]) + s * cap; };
  auto take = [&](int c, std::int64_t b) {
    return std::clamp<std::int64_t>(counts[c] - b, 0, cap);
  };
  for (std::int64_t b = 0; b < longest; b += cap) {
    for (int c = 0; c < p; ++c) {  // my parts of the others' chunks, into their slots
      const std::int64_t k = take(c, b);
      if (c == rank || k <= 0) continue;
      std::memcpy(slot(c, (rank - c - 1 + p) % p), send + off[c] + b,
                  static_cast<std::size_t>(k) * sizeof(T));
    }
    meet(comm);
    if (const std::int64_t k = take(rank, b); k > 0) {  // my chunk, in rank order, into recv
      auto part = [&](int r) -> const T* {
        return r == rank ? send + off[rank] + b : slot(rank, (r - rank - 1 + p) % p);
      };
      T* out = recv + b;
      std::memcpy(out, part(0), static_cast<std::size_t>(k) * sizeof(T));
      for (int r = 1; r < p; ++r) combine(op, out, part(r), k, 1);
    }
    meet(comm);
  }
}

// Rounds of at most `step` bytes of each part of each set (`step` = a slot's bytes / sets):
// sub-slot s * (p - 1) + t of rank c's window holds set s of rank (c + t + 1) % p's values
// of part c, all within the bytes of slots 0 to p - 2; slot p - 1 holds the owner's result,
// as in round() above, at the same byte for every `sets`.
void owner_parts(const PieceView<char>& v, std::int64_t part_bytes, std::int64_t elem, int sets,
                 const OwnerPass& pass, const ShmSegment& w, MPI_Comm comm, int rank, int p) {
  const std::int64_t step = slot_bytes(p) / sets / 64 * 64;
  TORCH_INTERNAL_ASSERT(step > 0 && step % elem == 0);
  auto slot = [&](int owner, int s, int t) { return w.base[owner] + (s * (p - 1) + t) * step; };
  char* const results = w.base[rank] + (p - 1) * slot_bytes(p);
  auto part = [&](int s, int c) { return (static_cast<std::int64_t>(s) * p + c) * part_bytes; };
  struct Run {
    char* at;
    std::int64_t pos, n;
  };
  std::vector<std::vector<Run>> own(static_cast<std::size_t>(sets));
  std::vector<std::size_t> next(own.size());
  std::vector<const void*> rows(static_cast<std::size_t>(sets) * p);
  for (std::int64_t b = 0; b < part_bytes; b += step) {
    const std::int64_t k = std::min(step, part_bytes - b);
    for (int s = 0; s < sets; ++s) {  // my values of the others' parts, into their windows
      for (int c = 0; c < p; ++c) {
        if (c == rank) continue;
        char* dst = slot(c, s, (rank - c - 1 + p) % p);
        v.runs(part(s, c) + b, k, [&](char* at, std::int64_t n, std::int64_t pos) {
          std::memcpy(dst + pos, at, static_cast<std::size_t>(n));
        });
      }
    }
    meet(comm);
    // every rank's values of my part (mine where they lie), cut where any set's pieces end
    for (int s = 0; s < sets; ++s) {
      own[s].clear();
      next[s] = 0;
      v.runs(part(s, rank) + b, k,
             [&](char* at, std::int64_t n, std::int64_t pos) { own[s].push_back({at, pos, n}); });
    }
    for (std::int64_t pos = 0; pos < k;) {
      std::int64_t end = k;
      for (int s = 0; s < sets; ++s) {
        const Run& r = own[s][next[s]];
        end = std::min(end, r.pos + r.n);
        for (int j = 0; j < p; ++j) {
          rows[s * p + j] =
              j == rank ? r.at + (pos - r.pos) : slot(rank, s, (j - rank - 1 + p) % p) + pos;
        }
      }
      pass(rows, results + pos, (b + pos) / elem, (end - pos) / elem);
      for (int s = 0; s < sets; ++s) {
        if (own[s][next[s]].pos + own[s][next[s]].n == end) ++next[s];
      }
      pos = end;
    }
    meet(comm);
    for (int c = 0; c < p; ++c) {  // every owner's result, into my pieces of the last set
      const char* src = w.base[c] + (p - 1) * slot_bytes(p);
      v.runs(part(sets - 1, c) + b, k, [&](char* at, std::int64_t n, std::int64_t pos) {
        std::memcpy(at, src + pos, static_cast<std::size_t>(n));
      });
    }
  }
  // The next call may lay the window out otherwise (another dtype's slots): it writes only
  // once every rank has copied its results out.
  meet(comm);
}

}  // namespace

bool shared_owner_parts(const std::vector<BufferPiece>& pieces, std::int64_t part_bytes,
                        std::int64_t elem, const OwnerPass& pass, MPI_Comm comm, int rank, int size,
                        int sets) {
  TORCH_INTERNAL_ASSERT(elem > 0 && 64 % elem == 0 && part_bytes % elem == 0 && size > 1 &&
                        sets >= 1);
  std::int64_t total = 0;
  for (const auto& piece : pieces) {
    TORCH_INTERNAL_ASSERT(piece.bytes % elem == 0);
    total += piece.bytes;
  }
  TORCH_INTERNAL_ASSERT(total == part_bytes * size * sets);
  const ShmSegment* w = segment_of(comm);
  if (w == nullptr) return false;
  ++g_owner_calls;
  owner_parts(PieceView<char>(pieces), part_bytes, elem, sets, pass, *w, comm, rank, size);
  return true;
}

std::int64_t shared_owner_parts_calls() { return g_owner_calls.load(); }

bool shared_reduce_scatter(const void* send, void* recv, const std::vector<std::int64_t>& counts,
                           c10::ScalarType dt, ReduceOp op, MPI_Comm comm, int rank, int size) {
  TORCH_INTERNAL_ASSERT(shared_reduce_scatter_takes(dt, op) &&
                        counts.size() == static_cast<std::size_t>(size));
  const ShmSegment* w = segment_of(comm);
  if (w == nullptr) return false;
  ++g_scatter_calls;
  switch (dt) {
    case c10::kFloat:
      scatter_reduce(static_cast<const float*>(send), static_cast<float*>(recv), counts, op, *w,
                     comm, rank, size);
      break;
    case c10::kDouble:
      scatter_reduce(static_cast<const double*>(send), static_cast<double*>(recv), counts, op, *w,
                     comm, rank, size);
      break;
    case c10::kInt:
      scatter_reduce(static_cast<const std::int32_t*>(send), static_cast<std::int32_t*>(recv),
                     counts, op, *w, comm, rank, size);
      break;
    default:
      scatter_reduce(static_cast<const std::int64_t*>(send), static_cast<std::int64_t*>(recv),
                     counts, op, *w, comm, rank, size);
  }
  return true;
}

bool shared_reduce_scatter_takes(c10::ScalarType dt, ReduceOp op) {
  const bool type = dt == c10::kFloat || dt == c10::kDouble || dt == c10::kInt || dt == c10::kLong;
  return type && (op == ReduceOp::Sum || op == ReduceOp::Min || op == ReduceOp::Max);
}

std::int64_t shared_reduce_scatter_calls() { return g_scatter_calls.load(); }

bool shared_allreduce_pieces(const std::vector<BufferPiece>& pieces, std::int64_t count,
                             c10::ScalarType dt, ReduceOp op, MPI_Comm comm, int rank, int size) {
  TORCH_CHECK(dt == c10::kFloat || dt == c10::kDouble || dt == c10::kInt || dt == c10::kLong,
              "fluxmpi_py: the shared-memory allreduce does not take ", dt);
  const ShmSegment* w = segment_of(comm);
  if (w == nullptr) return false;
  ++g_calls;
  const int divisor = op == ReduceOp::Average ? size : 1;
  if (op == ReduceOp::Average) op = ReduceOp::Sum;
  switch (dt) {
    case c10::kFloat: reduce<float>(pieces, count, op, divisor, *w, comm, rank, size); break;
    case c10::kDouble: reduce<double>(pieces, count, op, divisor, *w, comm, rank, size); break;
    case c10::kInt: reduce<std::int32_t>(pieces, count, op, 1, *w, comm, rank, size); break;
    default: reduce<std::int64_t>(pieces, count, op, 1, *w, comm, rank, size);
  }
  return true;
}

std::int64_t shared_pieces_calls() { return g_calls.load(); }

}  // namespace fluxmpi
