#include "backend/mpi_ring.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "backend/mpi_check.h"
#include "backend/mpi_shared_pieces.h"
#include "backend/pieces.h"

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

// One MPI message: `count` of `type` at `addr`. Over a range of a PieceView, the memory
// itself when the range is one run, else an hindexed datatype over its runs (MPI_BOTTOM and
// absolute addresses), freed with the message.
class Message {
 public:
  Message(void* addr, std::int64_t n, MPI_Datatype type)
      : addr_(addr), count_(static_cast<int>(n)), type_(type) {}
  template <typename T>
  Message(const PieceView<T>& v, std::int64_t off, std::int64_t n, MPI_Datatype type) {
    thread_local std::vector<int> lengths;
    thread_local std::vector<MPI_Aint> where;
    lengths.clear();
    where.clear();
    T* first = nullptr;
    v.runs(off, n, [&](T* at, std::int64_t k, std::int64_t) {
      if (first == nullptr) first = at;
      MPI_Aint a = 0;
      MPI_Get_address(at, &a);
      lengths.push_back(static_cast<int>(k));
      where.push_back(a);
    });
    if (lengths.size() == 1) {
      addr_ = first;
      count_ = lengths[0];
      type_ = type;
      return;
    }
    mpi_check(MPI_Type_create_hindexed(static_cast<int>(lengths.size()), lengths.data(),
                                       where.data(), type, &type_),
              "MPI_Type_create_hindexed (ring allreduce)");
    mpi_check(MPI_Type_commit(&type_), "MPI_Type_commit (ring allreduce)");
    owned_ = true;
    addr_ = MPI_BOTTOM;
    count_ = 1;
  }
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  ~Message() {
    if (owned_) MPI_Type_free(&type_);
  }

  void* addr() const { return addr_; }
  int count() const { return count_; }
  MPI_Datatype type() const { return type_; }

 private:
  void* addr_ = nullptr;
  int count_ = 0;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  bool owned_ = false;
};

// One ring step: send `send_n` elements to `right` while receiving `recv_n` from `left`, both
// cut into pieces of `piece` elements. The right neighbour receives this very chunk, cut the
// same way, so every message is matched whatever the two chunk lengths (a chunk may be one
// element shorter, or empty). send_at(offset, n) and recv_at(offset, n) give the messages of
// a piece; after(offset, n) runs once a piece arrived. With no piece to receive at some k a
// rank only sends, and vice versa; no cycle of senders can wait on each other, since each
// piece k sent is a piece k received.
template <typename SendAt, typename RecvAt, typename After>
void ring_step(std::int64_t send_n, std::int64_t recv_n, std::int64_t piece, int right, int left,
               MPI_Comm comm, SendAt send_at, RecvAt recv_at, After after) {
  const std::int64_t ns = (send_n + piece - 1) / piece, nr = (recv_n + piece - 1) / piece;
  for (std::int64_t k = 0; k < std::max(ns, nr); ++k) {
    const std::int64_t off = k * piece;
    const std::int64_t sn = k < ns ? std::min(piece, send_n - off) : 0;
    const std::int64_t rn = k < nr ? std::min(piece, recv_n - off) : 0;
    if (sn > 0 && rn > 0) {
      const Message s = send_at(off, sn), r = recv_at(off, rn);
      mpi_check(MPI_Sendrecv(s.addr(), s.count(), s.type(), right, kRingTag, r.addr(), r.count(),
                             r.type(), left, kRingTag, comm, MPI_STATUS_IGNORE),
                "MPI_Sendrecv (ring allreduce)");
    } else if (sn > 0) {
      const Message s = send_at(off, sn);
      mpi_check(MPI_Send(s.addr(), s.count(), s.type(), right, kRingTag, comm),
                "MPI_Send (ring allreduce)");
    } else {
      const Message r = recv_at(off, rn);
      mpi_check(MPI_Recv(r.addr(), r.count(), r.type(), left, kRingTag, comm, MPI_STATUS_IGNORE),
                "MPI_Recv (ring allreduce)");
    }
    if (rn > 0) after(off, rn);
  }
}

// Where a ring's chunks lie and which way it turns. By default rank r sends to r + 1 and chunk
// c is [count * c / size, count * (c + 1) / size). gloo's order (GlooOrder) turns the other way
// and lays chunk c over gloo's region (c + 1) % size, cut where gloo cuts: each element is
// then summed as gloo's ring sums it (see gloo_order_allreduce in mpi_ring.h).
struct ChunkLayout {
  bool mirror = false;
  std::vector<std::int64_t> bounds;  // size + 1 region boundaries; empty: the default cut
};

template <typename T>
void ring(const PieceView<T>& v, std::int64_t count, ReduceOp op, int divisor,
          const RingOptions& opts, MPI_Datatype type, MPI_Comm comm, int rank, int size,
          const ChunkLayout& layout = ChunkLayout()) {
  // Thread-local: the engine thread and an inline caller never share it.
  thread_local std::vector<T> staging;
  const std::int64_t chunk_bytes = (count / size + 1) * static_cast<std::int64_t>(sizeof(T));
  const std::int64_t seg_bytes =
      std::clamp(chunk_bytes / 4, opts.min_segment_bytes, opts.max_segment_bytes);
  const std::int64_t seg = std::max<std::int64_t>(1, seg_bytes / sizeof(T));
  if (static_cast<std::int64_t>(staging.size()) < seg) staging.resize(seg);
  T* tmp = staging.data();
  auto mod = [&](int x) { return ((x % size) + size) % size; };
  const bool cut = !layout.bounds.empty();
  const int shift = layout.mirror ? 1 : 0;
  auto lo = [&](int c) { return cut ? layout.bounds[mod(c + shift)] : count * c / size; };
  auto len = [&](int c) {
    const int g = mod(c + shift);
    return cut ? layout.bounds[g + 1] - layout.bounds[g] : count * (c + 1) / size - lo(c);
  };
  const int dir = layout.mirror ? -1 : 1;
  const int right = mod(rank + dir), left = mod(rank - dir);
  // Reduce-scatter: after step s, chunk (rank - dir * (s + 1)) holds the reduction of s + 2
  // ranks here.
  for (int s = 0; s + 1 < size; ++s) {
    const int sc = mod(rank - dir * s), rc = mod(rank - dir * (s + 1));
    const int div = s + 2 == size ? divisor : 1;
    ring_step(
        len(sc), len(rc), seg, right, left, comm,
        [&](std::int64_t off, std::int64_t n) { return Message(v, lo(sc) + off, n, type); },
        [&](std::int64_t, std::int64_t n) { return Message(tmp, n, type); },
        [&](std::int64_t off, std::int64_t n) {
          v.runs(lo(rc) + off, n, [&](T* d, std::int64_t k, std::int64_t pos) {
            combine(op, d, tmp + pos, k, div);
          });
        });
  }
  // Allgather: pass the finished chunks around the ring, straight into place.
  for (int s = 0; s + 1 < size; ++s) {
    const int sc = mod(rank + dir * (1 - s)), rc = mod(rank - dir * s);
    ring_step(
        len(sc), len(rc), kMaxPiece, right, left, comm,
        [&](std::int64_t off, std::int64_t n) { return Message(v, lo(sc) + off, n, type); },
        [&](std::int64_t off, std::int64_t n) { return Message(v, lo(rc) + off, n, type); },
        [](std::int64_t, std::int64_t) {});
  }
}

template <typename T>
void ring_over(const std::vector<BufferPiece>& pieces, std::int64_t count, ReduceOp op, int divisor,
               const RingOptions& opts, MPI_Datatype type, MPI_Comm comm, int rank, int size) {
  ring(PieceView<T>(pieces), count, op, divisor, opts, type, comm, rank, size);
}

bool ring_integer(c10::ScalarType dt) { return dt == c10::kInt || dt == c10::kLong; }

// gloo's ring (gloo/allreduce.cc, the algorithm torch's ProcessGroupGloo runs for a CPU
// allreduce) cuts its buffer into segments of at most 1 MiB, at least two per rank and the same
// number for each; rank c's region is its run of segments, the last regions short or empty.
constexpr std::int64_t kGlooMaxSegmentBytes = std::int64_t(1) << 20;

std::vector<std::int64_t> gloo_bounds(std::int64_t count, std::int64_t esz, int size) {
  const std::int64_t total = count * esz;
  const std::int64_t max_seg = esz * std::max<std::int64_t>(1, kGlooMaxSegmentBytes / esz);
  std::int64_t segments =
      std::max<std::int64_t>((total + max_seg - 1) / max_seg, std::int64_t(2) * size);
  segments = (segments + size - 1) / size * size;
  const std::int64_t per_rank = segments / size;
  const std::int64_t seg_bytes = ((total + segments - 1) / segments + esz - 1) / esz * esz;
  std::vector<std::int64_t> bounds(size + 1);
  for (int c = 0; c <= size; ++c) bounds[c] = std::min(c * per_rank * seg_bytes / esz, count);
  return bounds;
}

std::atomic<int> g_sum_order{-1};  // -1: FLUXMPI_SUM_ORDER not read yet
std::atomic<std::int64_t> g_gloo_order_calls{0};

}  // namespace

SumOrder parse_sum_order(const std::string& name) {
  if (name == "fastest") return SumOrder::Fastest;
  TORCH_CHECK_VALUE(name == "gloo", "fluxmpi_py: the sum order is 'fastest' or 'gloo', got '", name,
                    "'");
  return SumOrder::Gloo;
}

const char* sum_order_name(SumOrder order) { return order == SumOrder::Gloo ? "gloo" : "fastest"; }

SumOrder sum_order() {
  int v = g_sum_order.load();
  if (v < 0) {
    const char* s = std::getenv("FLUXMPI_SUM_ORDER");
    SumOrder o = SumOrder::Fastest;
    if (s != nullptr && *s != '\0') {
      try {
        o = parse_sum_order(s);
      } catch (const c10::ValueError&) {
        TORCH_CHECK_VALUE(false, "fluxmpi_py: FLUXMPI_SUM_ORDER must be 'fastest' or 'gloo', got '",
                          s, "'");
      }
    }
    int expected = -1;
    g_sum_order.compare_exchange_strong(expected, static_cast<int>(o));
    v = g_sum_order.load();
  }
  return static_cast<SumOrder>(v);
}

void set_sum_order(SumOrder order) { g_sum_order.store(static_cast<int>(order)); }

bool gloo_order_applies(SumOrder order, c10::ScalarType dt, ReduceOp op, int world) {
  return order == SumOrder::Gloo && op == ReduceOp::Sum && world >= 3 &&
         (dt == c10::kFloat || dt == c10::kDouble || dt == c10::kHalf || dt == c10::kBFloat16);
}

std::int64_t gloo_order_calls() { return g_gloo_order_calls.load(); }

void gloo_order_allreduce(void* buf, std::int64_t count, c10::ScalarType dt, MPI_Comm comm,
                          int rank, int size) {
  TORCH_CHECK(gloo_order_applies(SumOrder::Gloo, dt, ReduceOp::Sum, size),
              "fluxmpi_py: gloo's order sums float, double, float16 or bfloat16 over 3 or more "
              "ranks, got ",
              dt, " over ", size);
  ++g_gloo_order_calls;
  const std::int64_t esz = static_cast<std::int64_t>(c10::elementSize(dt));
  ChunkLayout layout;
  layout.mirror = true;
  layout.bounds = gloo_bounds(count, esz, size);
  const RingOptions opts = ring_options();
  const std::vector<BufferPiece> one{{buf, count * esz}};
  switch (dt) {
    case c10::kFloat:
      return ring(PieceView<float>(one), count, ReduceOp::Sum, 1, opts, MPI_FLOAT, comm, rank, size,
                  layout);
    case c10::kDouble:
      return ring(PieceView<double>(one), count, ReduceOp::Sum, 1, opts, MPI_DOUBLE, comm, rank,
                  size, layout);
    case c10::kHalf:  // each addition in fp32, rounded to float16: gloo's float16 sum
      return ring(PieceView<c10::Half>(one), count, ReduceOp::Sum, 1, opts, MPI_UINT16_T, comm,
                  rank, size, layout);
    default:
      return ring(PieceView<c10::BFloat16>(one), count, ReduceOp::Sum, 1, opts, MPI_UINT16_T, comm,
                  rank, size, layout);
  }
}

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
  TORCH_CHECK_VALUE(
      opts.sum_min_bytes >= 0 && opts.average_min_bytes >= 0 && opts.list_min_bytes >= 0,
      "ring thresholds must be >= 0 bytes, got sum_min_bytes=", opts.sum_min_bytes,
      ", average_min_bytes=", opts.average_min_bytes, " and list_min_bytes=", opts.list_min_bytes);
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

bool ring_list_applies(const RingOptions& opts, std::int64_t bytes, c10::ScalarType dt, ReduceOp op,
                       int world) {
  if (!opts.enabled || world == 1 || bytes <= 0 || bytes < opts.list_min_bytes) return false;
  const bool floating = dt == c10::kFloat || dt == c10::kDouble;
  if (!floating && !ring_integer(dt)) return false;
  return op == ReduceOp::Sum || op == ReduceOp::Min || op == ReduceOp::Max ||
         (op == ReduceOp::Average && floating);
}

std::int64_t ring_calls() { return g_ring_calls.load() + shared_pieces_calls(); }

void ring_allreduce(void* buf, std::int64_t count, c10::ScalarType dt, int divisor,
                    const RingOptions& opts, MPI_Comm comm, int rank, int size) {
  TORCH_CHECK(dt == c10::kFloat || dt == c10::kDouble,
              "fluxmpi_py: the ring allreduce takes float or double, got ", dt);
  ++g_ring_calls;
  const std::vector<BufferPiece> one{
      {buf, count * static_cast<std::int64_t>(c10::elementSize(dt))}};
  if (dt == c10::kFloat) {
    ring_over<float>(one, count, ReduceOp::Sum, divisor, opts, MPI_FLOAT, comm, rank, size);
  } else {
    ring_over<double>(one, count, ReduceOp::Sum, divisor, opts, MPI_DOUBLE, comm, rank, size);
  }
}

void ring_allreduce_pieces(const std::vector<BufferPiece>& pieces, std::int64_t count,
                           c10::ScalarType dt, ReduceOp op, const RingOptions& opts, MPI_Comm comm,
                           int rank, int size) {
  const bool floating = dt == c10::kFloat || dt == c10::kDouble;
  TORCH_CHECK(floating || ring_integer(dt),
              "fluxmpi_py: the ring allreduce takes float, double, int32 or int64, got ", dt);
  TORCH_CHECK(op != ReduceOp::Average || floating,
              "fluxmpi_py: the ring averages float and double only, got ", dt);
  ++g_ring_calls;
  const int divisor = op == ReduceOp::Average ? size : 1;
  if (op == ReduceOp::Average) op = ReduceOp::Sum;
  switch (dt) {
    case c10::kFloat:
      return ring_over<float>(pieces, count, op, divisor, opts, MPI_FLOAT, comm, rank, size);
    case c10::kDouble:
      return ring_over<double>(pieces, count, op, divisor, opts, MPI_DOUBLE, comm, rank, size);
    case c10::kInt:
      return ring_over<std::int32_t>(pieces, count, op, 1, opts, MPI_INT32_T, comm, rank, size);
    default:
      return ring_over<std::int64_t>(pieces, count, op, 1, opts, MPI_INT64_T, comm, rank, size);
  }
}

}  // namespace fluxmpi
