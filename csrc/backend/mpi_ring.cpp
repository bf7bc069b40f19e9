#include "backend/mpi_ring.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "backend/mpi_check.h"

namespace fluxmpi {

namespace {

// MPI counts are ints: the allgather phase moves a chunk in pieces of at most 2^30 elements.
constexpr std::int64_t kMaxPiece = std::int64_t(1) << 30;
constexpr int kRingTag = 0x464d;  // on fluxmpi's own communicator, never the user's

RingOptions from_environment() {
  RingOptions o;
  const char* s = std::getenv("FLUXMPI_RING_MIN_BYTES");
  if (s == nullptr || *s == '\0') return o;
  char* end = nullptr;
  long long n = std::strtoll(s, &end, 10);
  TORCH_CHECK_VALUE(end != s && *end == '\0' && n >= 0,
                    "fluxmpi_py: FLUXMPI_RING_MIN_BYTES must be a byte count >= 0, got '", s, "'");
  if (n == 0) {
    o.enabled = false;
  } else {
    o.sum_min_bytes = static_cast<std::int64_t>(n);
  }
  return o;
}

std::atomic<std::int64_t> g_ring_calls{0};

struct Settings {
  std::mutex mu;
  bool loaded = false;  // false until the environment was read or options were set
  RingOptions opts;
};

Settings& settings() {
  static Settings s;
  return s;
}

// One ring step: send `send_n` elements to `right` while receiving `recv_n` from `left`, both
// cut into pieces of `piece` elements. The right neighbour receives this very chunk, cut the
// same way, so every message is matched whatever the two chunk lengths (a chunk may be one
// element shorter, or empty). A received piece goes to recv_at(offset) and then after(offset,
// n, where). With no piece to receive at some k a rank only sends, and vice versa; no cycle of
// senders can wait on each other, since each piece k sent is a piece k received.
template <typename T, typename RecvAt, typename After>
void ring_step(const T* send, std::int64_t send_n, std::int64_t recv_n, std::int64_t piece,
               MPI_Datatype type, int right, int left, MPI_Comm comm, RecvAt recv_at, After after) {
  const std::int64_t ns = (send_n + piece - 1) / piece, nr = (recv_n + piece - 1) / piece;
  for (std::int64_t k = 0; k < std::max(ns, nr); ++k) {
    const std::int64_t off = k * piece;
    const int sn = k < ns ? static_cast<int>(std::min(piece, send_n - off)) : 0;
    const int rn = k < nr ? static_cast<int>(std::min(piece, recv_n - off)) : 0;
    T* dst = rn > 0 ? recv_at(off) : nullptr;
    if (sn > 0 && rn > 0) {
      mpi_check(MPI_Sendrecv(send + off, sn, type, right, kRingTag, dst, rn, type, left, kRingTag,
                             comm, MPI_STATUS_IGNORE),
                "MPI_Sendrecv (ring allreduce)");
    } else if (sn > 0) {
      mpi_check(MPI_Send(send + off, sn, type, right, kRingTag, comm), "MPI_Send (ring allreduce)");
    } else {
      mpi_check(MPI_Recv(dst, rn, type, left, kRingTag, comm, MPI_STATUS_IGNORE),
                "MPI_Recv (ring allreduce)");
    }
    if (rn > 0) after(off, rn, dst);
  }
}

template <typename T>
void ring(T* buf, std::int64_t count, int divisor, const RingOptions& opts, MPI_Datatype type,
          MPI_Comm comm, int rank, int size) {
  // Thread-local: the engine thread and an inline caller never share it.
  thread_local std::vector<T> staging;
  const std::int64_t chunk_bytes = (count / size + 1) * static_cast<std::int64_t>(sizeof(T));
  const std::int64_t seg_bytes =
      std::clamp(chunk_bytes / 4, opts.min_segment_bytes, opts.max_segment_bytes);
  const std::int64_t seg = std::max<std::int64_t>(1, seg_bytes / sizeof(T));
  if (static_cast<std::int64_t>(staging.size()) < seg) staging.resize(seg);
  T* tmp = staging.data();
  auto lo = [&](int c) { return count * c / size; };
  auto mod = [&](int x) { return ((x % size) + size) % size; };
  const int right = mod(rank + 1), left = mod(rank - 1);
  const T inv = static_cast<T>(divisor);
  // Reduce-scatter: after step s, chunk (rank - s - 1) holds the sum of s + 2 ranks here.
  for (int s = 0; s + 1 < size; ++s) {
    const int sc = mod(rank - s), rc = mod(rank - s - 1);
    const bool divide = s + 2 == size && divisor != 1;
    T* acc = buf + lo(rc);
    ring_step(
        buf + lo(sc), lo(sc + 1) - lo(sc), lo(rc + 1) - lo(rc), seg, type, right, left, comm,
        [&](std::int64_t) { return tmp; },
        [&](std::int64_t off, int n, const T* got) {
          T* d = acc + off;
          if (divide) {
            for (int i = 0; i < n; ++i) d[i] = (d[i] + got[i]) / inv;
          } else {
            for (int i = 0; i < n; ++i) d[i] += got[i];
          }
        });
  }
  // Allgather: pass the finished chunks around the ring, straight into place.
  for (int s = 0; s + 1 < size; ++s) {
    const int sc = mod(rank + 1 - s), rc = mod(rank - s);
    T* dst = buf + lo(rc);
    ring_step(
        buf + lo(sc), lo(sc + 1) - lo(sc), lo(rc + 1) - lo(rc), kMaxPiece, type, right, left, comm,
        [&](std::int64_t off) { return dst + off; }, [](std::int64_t, int, const T*) {});
  }
}

}  // namespace

RingOptions ring_options() {
  Settings& s = settings();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.loaded) {
    s.opts = from_environment();  // throws on a bad value, every time until it is fixed
    s.loaded = true;
  }
  return s.opts;
}

void set_ring_options(const RingOptions& opts) {
  TORCH_CHECK_VALUE(opts.sum_min_bytes >= 0 && opts.average_min_bytes >= 0,
                    "ring thresholds must be >= 0 bytes, got sum_min_bytes=", opts.sum_min_bytes,
                    " and average_min_bytes=", opts.average_min_bytes);
  TORCH_CHECK_VALUE(opts.min_segment_bytes >= 1 && opts.min_segment_bytes <= opts.max_segment_bytes,
                    "ring segments need 1 <= min_segment_bytes <= max_segment_bytes, got ",
                    opts.min_segment_bytes, " and ", opts.max_segment_bytes);
  Settings& s = settings();
  std::lock_guard<std::mutex> lk(s.mu);
  s.opts = opts;
  s.loaded = true;
}

bool ring_applies(const RingOptions& opts, std::int64_t count, c10::ScalarType dt, int divisor,
                  int world) {
  if (!opts.enabled || world == 1 || (dt != c10::kFloat && dt != c10::kDouble)) return false;
  std::int64_t from = opts.sum_min_bytes;
  if (divisor != 1) from = std::min(from, opts.average_min_bytes);
  return count * static_cast<std::int64_t>(c10::elementSize(dt)) >= from;
}

std::int64_t ring_calls() { return g_ring_calls.load(); }

void ring_allreduce(void* buf, std::int64_t count, c10::ScalarType dt, int divisor,
                    const RingOptions& opts, MPI_Comm comm, int rank, int size) {
  TORCH_CHECK(dt == c10::kFloat || dt == c10::kDouble,
              "fluxmpi_py: the ring allreduce takes float or double, got ", dt);
  ++g_ring_calls;
  if (dt == c10::kFloat) {
    ring(static_cast<float*>(buf), count, divisor, opts, MPI_FLOAT, comm, rank, size);
  } else {
    ring(static_cast<double*>(buf), count, divisor, opts, MPI_DOUBLE, comm, rank, size);
  }
}

}  // namespace fluxmpi
