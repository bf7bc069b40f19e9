#include <mpi.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "runtime/environment.h"

namespace fluxmpi {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Average: return "average";
  }
  return "?";
}

ReduceOp parse_op(const std::string& name) {
  if (name == "sum" || name == "+") return ReduceOp::Sum;
  if (name == "average" || name == "avg" || name == "mean") return ReduceOp::Average;
  if (name == "min") return ReduceOp::Min;
  if (name == "max") return ReduceOp::Max;
  if (name == "prod" || name == "product" || name == "*") return ReduceOp::Prod;
  TORCH_CHECK_VALUE(false, "fluxmpi_py: unknown reduction op '", name,
                    "'; expected one of sum, average, min, max, prod");
}

namespace {

// MPI has no 16-bit float types. They travel as 16-bit words and reduce through our own
// MPI_Op, which computes every pair in fp32 and rounds once per combine.
template <typename T, typename F>
void combine16(void* in, void* inout, int* len, F f) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

template <typename T>
struct Ops16 {
  static void sum(void* in, void* io, int* n, MPI_Datatype*) {
    combine16<T>(in, io, n, [](float x, float y) { return x + y; });
  }
  static void prod(void* in, void* io, int* n, MPI_Datatype*) {
    combine16<T>(in, io, n, [](float x, float y) { return x * y; });
  }
  static void min(void* in, void* io, int* n, MPI_Datatype*) {
    combine16<T>(in, io, n, [](float x, float y) { return std::min(x, y); });
  }
  static void max(void* in, void* io, int* n, MPI_Datatype*) {
    combine16<T>(in, io, n, [](float x, float y) { return std::max(x, y); });
  }
};

struct UserOps {
  MPI_Op half[4];
  MPI_Op bf16[4];
  UserOps() {
    MPI_Op_create(&Ops16<c10::Half>::sum, 1, &half[0]);
    MPI_Op_create(&Ops16<c10::Half>::min, 1, &half[1]);
    MPI_Op_create(&Ops16<c10::Half>::max, 1, &half[2]);
    MPI_Op_create(&Ops16<c10::Half>::prod, 1, &half[3]);
    MPI_Op_create(&Ops16<c10::BFloat16>::sum, 1, &bf16[0]);
    MPI_Op_create(&Ops16<c10::BFloat16>::min, 1, &bf16[1]);
    MPI_Op_create(&Ops16<c10::BFloat16>::max, 1, &bf16[2]);
    MPI_Op_create(&Ops16<c10::BFloat16>::prod, 1, &bf16[3]);
  }
  // Not freed: MPI_Op_free after MPI_Finalize is an error, and these live for the process.
};

UserOps& user_ops() {
  static UserOps* ops = new UserOps();
  return *ops;
}

MPI_Datatype mpi_type(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return MPI_FLOAT;
    case c10::kDouble: return MPI_DOUBLE;
    case c10::kHalf:
    case c10::kBFloat16: return MPI_UINT16_T;
    case c10::kChar: return MPI_INT8_T;
    case c10::kShort: return MPI_INT16_T;
    case c10::kInt: return MPI_INT32_T;
    case c10::kLong: return MPI_INT64_T;
    case c10::kByte: return MPI_UINT8_T;
    case c10::kBool: return MPI_C_BOOL;
    default: TORCH_CHECK_TYPE(false, "fluxmpi_py: dtype ", t, " is not supported by MPI backend");
  }
}

MPI_Op mpi_op(ReduceOp op, c10::ScalarType t) {
  TORCH_INTERNAL_ASSERT(op != ReduceOp::Average, "average must be lowered to sum by the caller");
  int i = static_cast<int>(op);
  if (t == c10::kHalf) return user_ops().half[i];
  if (t == c10::kBFloat16) return user_ops().bf16[i];
  if (t == c10::kBool) {
    // logical or/and for min/max/sum/prod on bools
    return (op == ReduceOp::Sum || op == ReduceOp::Max) ? MPI_LOR : MPI_LAND;
  }
  static const MPI_Op table[4] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD};
  return table[i];
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  TORCH_CHECK(false, "fluxmpi_py: ", what, " failed: ", std::string(msg, len));
}

// MPI counts are ints: move large buffers in chunks of at most 2^30 elements.
constexpr std::int64_t kMaxChunk = std::int64_t(1) << 30;

// Large float sums use our own ring allreduce (reduce-scatter, then allgather) over
// MPI_Sendrecv instead of MPI_Allreduce. Measured here (2 ranks, Open MPI 4.1, shared memory,
// benchmarks/bench_collectives.py): Open MPI's algorithm falls out of cache above ~32 MiB,
// where the ring is about 2x faster (64 MiB: 20.7 ms vs 40.1 ms), while from 1 to 16 MiB the
// two are within noise or MPI is a little ahead. So a plain sum takes the ring from 16 MiB. An
// average takes it from 1 MiB: the ring divides inside its last reduction step, which saves a
// whole pass over the buffer (~2.5 ms per 25 MiB). Each segment travels through a small
// staging buffer that stays in cache. Every element is reduced on exactly one rank and then
// copied to the others, so all ranks hold identical bits. FLUXMPI_RING_MIN_BYTES sets the
// plain-sum threshold (default 16 MiB; 0 turns the ring off for sums and averages).
// A chunk moves in segments of a quarter chunk, between 256 KiB and 2 MiB: each segment is one
// MPI_Sendrecv (~10-20 us of handshake over shared memory), so 128 KiB segments made the ring
// 1.7x slower than MPI_Allreduce on ResNet-50's 1-9 MiB gradients; and 2 MiB stays in cache.
constexpr std::int64_t kRingMinSegmentBytes = std::int64_t(256) << 10;
constexpr std::int64_t kRingMaxSegmentBytes = std::int64_t(2) << 20;
constexpr std::int64_t kRingMinAverageBytes = std::int64_t(1) << 20;
constexpr int kRingTag = 0x464d;  // on fluxmpi's own communicator, never the user's

std::int64_t ring_min_bytes() {
  static const std::int64_t v = [] {
    const char* s = std::getenv("FLUXMPI_RING_MIN_BYTES");
    if (s == nullptr || *s == '\0') return std::int64_t(16) << 20;
    char* end = nullptr;
    long long n = std::strtoll(s, &end, 10);
    TORCH_CHECK_VALUE(end != s && *end == '\0' && n >= 0,
                      "fluxmpi_py: FLUXMPI_RING_MIN_BYTES must be a byte count >= 0, got '", s,
                      "'");
    return n == 0 ? std::numeric_limits<std::int64_t>::max() : static_cast<std::int64_t>(n);
  }();
  return v;
}

// One ring step: send `send_n` elements to `right` while receiving `recv_n` from `left`, both
// cut into pieces of `piece` elements. The right neighbour receives this very chunk, cut the
// same way, so every message is matched whatever the two chunk lengths (a chunk may be one
// element shorter, or empty). A received piece goes to recv_at(offset) and then after(offset,
// n, where). With no piece to receive at some k a rank only sends, and vice versa; no cycle of
// senders can wait on each other, since each piece k sent is a piece k received.
template <typename T, typename RecvAt, typename After>
void ring_step(const T* send, std::int64_t send_n, std::int64_t recv_n, std::int64_t piece,
               MPI_Datatype type, int right, int left, MPI_Comm comm, RecvAt recv_at,
               After after) {
  const std::int64_t ns = (send_n + piece - 1) / piece, nr = (recv_n + piece - 1) / piece;
  for (std::int64_t k = 0; k < std::max(ns, nr); ++k) {
    const std::int64_t off = k * piece;
    const int sn = k < ns ? static_cast<int>(std::min(piece, send_n - off)) : 0;
    const int rn = k < nr ? static_cast<int>(std::min(piece, recv_n - off)) : 0;
    T* dst = rn > 0 ? recv_at(off) : nullptr;
    if (sn > 0 && rn > 0) {
      check(MPI_Sendrecv(send + off, sn, type, right, kRingTag, dst, rn, type, left, kRingTag,
                         comm, MPI_STATUS_IGNORE),
            "MPI_Sendrecv (ring allreduce)");
    } else if (sn > 0) {
      check(MPI_Send(send + off, sn, type, right, kRingTag, comm), "MPI_Send (ring allreduce)");
    } else {
      check(MPI_Recv(dst, rn, type, left, kRingTag, comm, MPI_STATUS_IGNORE),
            "MPI_Recv (ring allreduce)");
    }
    if (rn > 0) after(off, rn, dst);
  }
}

template <typename T>
void ring_allreduce(T* buf, std::int64_t count, int divisor, MPI_Datatype type, MPI_Comm comm,
                    int rank, int size) {
  // Thread-local: the engine thread and an inline caller never share it.
  thread_local std::vector<T> staging;
  const std::int64_t chunk_bytes = (count / size + 1) * static_cast<std::int64_t>(sizeof(T));
  const std::int64_t seg_bytes =
      std::clamp(chunk_bytes / 4, kRingMinSegmentBytes, kRingMaxSegmentBytes);
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
    ring_step(buf + lo(sc), lo(sc + 1) - lo(sc), lo(rc + 1) - lo(rc), seg, type, right, left,
              comm, [&](std::int64_t) { return tmp; },
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
    ring_step(buf + lo(sc), lo(sc + 1) - lo(sc), lo(rc + 1) - lo(rc), kMaxChunk, type, right,
              left, comm, [&](std::int64_t off) { return dst + off; },
              [](std::int64_t, int, const T*) {});
  }
}

template <typename T>
void divide_in_place(T* buf, std::int64_t count, int divisor) {
  const T d = static_cast<T>(divisor);
  for (std::int64_t i = 0; i < count; ++i) buf[i] /= d;
}

class MpiBackend final : public Backend {
 private:
  // The ring, when it is the faster choice for this buffer (see ring_min_bytes): sum / divisor
  // in place. Returns false, having done nothing, when MPI_Allreduce should run instead.
  bool ring(void* buf, std::int64_t count, c10::ScalarType dt, int divisor) {
    const auto& e = env();
    if (e.size == 1 || (dt != c10::kFloat && dt != c10::kDouble)) return false;
    std::int64_t from = ring_min_bytes();
    if (from == std::numeric_limits<std::int64_t>::max()) return false;  // turned off
    if (divisor != 1) from = std::min(from, kRingMinAverageBytes);
    if (count * static_cast<std::int64_t>(c10::elementSize(dt)) < from) return false;
    BlockingCall guard("allreduce");
    if (dt == c10::kFloat) {
      ring_allreduce(static_cast<float*>(buf), count, divisor, MPI_FLOAT, e.comm, e.rank, e.size);
    } else {
      ring_allreduce(static_cast<double*>(buf), count, divisor, MPI_DOUBLE, e.comm, e.rank,
                     e.size);
    }
    return true;
  }

 public:
  const char* name() const override { return "mpi"; }

  bool fuses_division() const override { return true; }

  void allreduce_divided(void* buf, std::int64_t count, c10::ScalarType dt,
                         int divisor) override {
    TORCH_CHECK(dt == c10::kFloat || dt == c10::kDouble,
                "fluxmpi_py: allreduce_divided takes float or double, got ", dt);
    TORCH_CHECK(divisor >= 1, "fluxmpi_py: allreduce_divided by ", divisor);
    if (ring(buf, count, dt, divisor)) return;
    allreduce(buf, count, dt, ReduceOp::Sum);
    if (divisor == 1) return;
    if (dt == c10::kFloat) {
      divide_in_place(static_cast<float*>(buf), count, divisor);
    } else {
      divide_in_place(static_cast<double*>(buf), count, divisor);
    }
  }

  void allreduce(void* buf, std::int64_t count, c10::ScalarType dt, ReduceOp op) override {
    if (op == ReduceOp::Sum && ring(buf, count, dt, 1)) return;
    BlockingCall guard("allreduce");
    auto type = mpi_type(dt);
    auto mop = mpi_op(op, dt);
    auto* p = static_cast<char*>(buf);
    std::size_t esz = c10::elementSize(dt);
    for (std::int64_t off = 0; off < count; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - off));
      check(MPI_Allreduce(MPI_IN_PLACE, p + off * esz, n, type, mop, env().comm), "MPI_Allreduce");
    }
  }

  void broadcast(void* buf, std::int64_t count, c10::ScalarType dt, int root) override {
    BlockingCall guard("broadcast");
    auto* p = static_cast<char*>(buf);
    std::size_t esz = c10::elementSize(dt);
    // bytes travel as bytes: no datatype conversion, any dtype
    std::int64_t bytes = count * static_cast<std::int64_t>(esz);
    for (std::int64_t off = 0; off < bytes; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      check(MPI_Bcast(p + off, n, MPI_BYTE, root, env().comm), "MPI_Bcast");
    }
  }

  void reduce(const void* send, void* recv, std::int64_t count, c10::ScalarType dt, ReduceOp op,
              int root) override {
    BlockingCall guard("reduce");
    auto type = mpi_type(dt);
    auto mop = mpi_op(op, dt);
    std::size_t esz = c10::elementSize(dt);
    bool is_root = env().rank == root;
    for (std::int64_t off = 0; off < count; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - off));
      const void* s = static_cast<const char*>(send) + off * esz;
      void* r = is_root ? static_cast<char*>(recv) + off * esz : nullptr;
      if (is_root && s == r) s = MPI_IN_PLACE;
      check(MPI_Reduce(s, r, n, type, mop, root, env().comm), "MPI_Reduce");
    }
  }

  void allgather(const void* send, void* recv, std::int64_t count, c10::ScalarType dt) override {
    BlockingCall guard("allgather");
    std::int64_t bytes = count * static_cast<std::int64_t>(c10::elementSize(dt));
    TORCH_CHECK(bytes * env().size < std::numeric_limits<int>::max(),
                "fluxmpi_py: allgather of ", bytes, " bytes per rank is too large");
    check(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes),
                        MPI_BYTE, env().comm),
          "MPI_Allgather");
  }

  void barrier() override {
    BlockingCall guard("barrier");
    check(MPI_Barrier(env().comm), "MPI_Barrier");
  }
};

}  // namespace

Backend& mpi_backend() {
  static MpiBackend backend;
  return backend;
}

}  // namespace fluxmpi
