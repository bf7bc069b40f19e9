#include <mpi.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/mpi_backend.h"
#include "backend/mpi_check.h"
#include "backend/mpi_direct.h"
#include "backend/mpi_envelope.h"
#include "backend/mpi_hierarchical.h"
#include "backend/mpi_ring.h"
#include "backend/mpi_shared_pieces.h"
#include "backend/mpi_types.h"
#include "backend/pieces.h"
#include "runtime/call_watch.h"
#include "runtime/environment.h"
#include "runtime/group.h"

namespace fluxmpi {

namespace {

// MPI counts are ints: move large buffers in chunks of at most 2^30 elements.
constexpr std::int64_t kMaxChunk = std::int64_t(1) << 30;

template <typename T>
void divide_in_place(T* buf, std::int64_t count, int divisor) {
  const T d = static_cast<T>(divisor);
  if (exact_inverse(divisor)) {  // the same bits at a multiply's cost (backend/pieces.h)
    const T inv = static_cast<T>(1) / d;
    for (std::int64_t i = 0; i < count; ++i) buf[i] *= inv;
    return;
  }
  for (std::int64_t i = 0; i < count; ++i) buf[i] /= d;
}

// Byte counts and their offsets as MPI's ints. The ops layer checks the 2 GiB limit on every
// rank alike before any data moves, so a failure here is an internal error.
struct IntCounts {
  std::vector<int> counts, displs;
  explicit IntCounts(const std::vector<std::int64_t>& bytes) {
    std::int64_t off = 0;
    for (std::int64_t b : bytes) {
      TORCH_INTERNAL_ASSERT(b >= 0 && off + b <= std::numeric_limits<int>::max(),
                            "fluxmpi_py: a collective part past 2 GiB reached the MPI backend");
      counts.push_back(static_cast<int>(b));
      displs.push_back(static_cast<int>(off));
      off += b;
    }
  }
};

int int_bytes(std::int64_t n) {
  TORCH_INTERNAL_ASSERT(n >= 0 && n <= std::numeric_limits<int>::max(),
                        "fluxmpi_py: a collective part past 2 GiB reached the MPI backend");
  return static_cast<int>(n);
}

// The communicator a backend works on: the world's is read from env() at each call (Init
// may adopt another communicator after a shutdown), a group's is fixed.
struct CommView {
  MPI_Comm comm;
  int rank;
  int size;
  int group;  // for BlockingCall: 0 the world, else the group's index
};

class MpiBackend final : public Backend {
 public:
  MpiBackend() = default;  // the world
  MpiBackend(MPI_Comm comm, int rank, int size, int group)
      : fixed_(true), view_{comm, rank, size, group} {}

 private:
  CommView c() const {
    if (!fixed_) {
      const auto& e = env();
      return {e.comm, e.rank, e.size, 0};
    }
    return view_;
  }

  bool fixed_ = false;
  CommView view_{MPI_COMM_NULL, 0, 1, 0};

  // The ring (backend/mpi_ring.h), when its options send this buffer there: sum / divisor in
  // place. Returns false, having done nothing, when MPI_Allreduce should run instead.
  bool ring(void* buf, std::int64_t count, c10::ScalarType dt, int divisor) {
    const CommView e = c();
    const RingOptions opts = ring_options();
    if (!ring_applies(opts, count, dt, divisor, e.size)) return false;
    if (!ring_allowed(hierarchical_options(), layout())) return false;
    BlockingCall guard("allreduce", e.group, count * c10::elementSize(dt));
    ring_allreduce(buf, count, dt, divisor, opts, e.comm, e.rank, e.size);
    return true;
  }

  // The node-aware path (backend/mpi_hierarchical.h), when the job spans hosts and its options
  // send this buffer there: `op` over every rank in place. Returns false, having done nothing,
  // when the ring or MPI_Allreduce should run instead.
  bool hierarchical(void* buf, std::int64_t count, c10::ScalarType dt, ReduceOp op) {
    const CommView e = c();
    const HierarchicalOptions opts = hierarchical_options();
    const std::int64_t bytes = count * static_cast<std::int64_t>(c10::elementSize(dt));
    if (e.size < 2 || !opts.enabled || bytes < opts.min_bytes || bytes >= opts.max_bytes) {
      return false;
    }
    if (!hierarchical_applies(opts, bytes, layout())) return false;
    BlockingCall guard("allreduce", e.group, bytes);
    hierarchical_allreduce(buf, count, mpi_type(dt), c10::elementSize(dt), mpi_op(op, dt),
                           layout());
    return true;
  }

  // Which ranks share a host: a collective the first time, reached by every rank at the same
  // call (the callers decide from agreed sizes and options alone).
  const NodeLayout& layout() {
    const CommView e = c();
    if (layout_comm_ != e.comm) {
      BlockingCall guard("node layout", e.group);
      layout_ = &node_layout(e.comm);
      layout_comm_ = e.comm;
    }
    return *layout_;
  }

  const NodeLayout* layout_ = nullptr;
  MPI_Comm layout_comm_ = MPI_COMM_NULL;

 public:
  const char* name() const override { return "mpi"; }

  bool fuses_division() const override { return true; }

  void allreduce_divided(void* buf, std::int64_t count, c10::ScalarType dt, int divisor) override {
    TORCH_CHECK(dt == c10::kFloat || dt == c10::kDouble,
                "fluxmpi_py: allreduce_divided takes float or double, got ", dt);
    TORCH_CHECK(divisor >= 1, "fluxmpi_py: allreduce_divided by ", divisor);
    if (!hierarchical(buf, count, dt, ReduceOp::Sum)) {
      if (ring(buf, count, dt, divisor)) return;
      allreduce(buf, count, dt, ReduceOp::Sum);  // declines the hierarchical path again
    }
    if (divisor == 1) return;
    if (dt == c10::kFloat) {
      divide_in_place(static_cast<float*>(buf), count, divisor);
    } else {
      divide_in_place(static_cast<double*>(buf), count, divisor);
    }
  }

  void allreduce(void* buf, std::int64_t count, c10::ScalarType dt, ReduceOp op) override {
    if (hierarchical(buf, count, dt, op)) return;
    if (op == ReduceOp::Sum && ring(buf, count, dt, 1)) return;
    const CommView v = c();
    BlockingCall guard("allreduce", v.group, count * c10::elementSize(dt));
    auto type = mpi_type(dt);
    auto mop = mpi_op(op, dt);
    auto* p = static_cast<char*>(buf);
    std::size_t esz = c10::elementSize(dt);
    for (std::int64_t off = 0; off < count; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - off));
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, p + off * esz, n, type, mop, v.comm), "MPI_Allreduce");
    }
  }

  // The small calls' agreements (backend/envelope.h, direct.h); each is a BlockingCall there.
  void allreduce_envelope(void* buf, std::int64_t bytes) override {
    mpi_allreduce_envelope(buf, bytes, c().comm, c().group);
  }
  void exchange_direct(DirectExchange& x) override {
    const CommView v = c();
    DirectSlots* shm = direct_slots(v.comm);
    if (mpi_exchange_direct(x, v.comm, v.rank, v.size, v.group, shm)) {
      // Every rank saw the same passed call: they make the slots here together.
      const bool one_host = layout().nodes == 1;
      BlockingCall guard("direct slots", v.group);
      make_direct_slots(v.comm, one_host);
    }
  }
  std::int64_t direct_slot_bytes() override {
    const DirectSlots* s = direct_slots(c().comm);
    return s != nullptr && s->shared() ? kDirectSlotBytes : 0;
  }

  bool allreduces_plainly(std::int64_t count, c10::ScalarType dt, ReduceOp op,
                          bool divided) override {
    const CommView e = c();
    const HierarchicalOptions h = hierarchical_options();
    const std::int64_t bytes = count * static_cast<std::int64_t>(c10::elementSize(dt));
    // The node-aware path may apply, unless this communicator's hosts are known (the layout is
    // made at the same call on every rank) and it does not.
    const bool known = layout_comm_ == e.comm && layout_ != nullptr;
    if (h.enabled && bytes >= h.min_bytes && bytes < h.max_bytes &&
        (!known || hierarchical_applies(h, bytes, *layout_))) {
      return false;
    }
    if (divided) return !ring_applies(ring_options(), count, dt, e.size, e.size);
    return op != ReduceOp::Sum || !ring_applies(ring_options(), count, dt, 1, e.size);
  }

  bool allreduce_in_gloo_order(void* buf, std::int64_t count, c10::ScalarType dt) override {
    const CommView v = c();
    BlockingCall guard("allreduce", v.group, count * c10::elementSize(dt));
    gloo_order_allreduce(buf, count, dt, v.comm, v.rank, v.size);
    return true;
  }

  bool allreduce_pieces(const std::vector<BufferPiece>& pieces, std::int64_t count,
                        c10::ScalarType dt, ReduceOp op) override {
    const CommView e = c();
    const RingOptions opts = ring_options();
    const std::int64_t bytes = count * static_cast<std::int64_t>(c10::elementSize(dt));
    if (!ring_list_applies(opts, bytes, dt, op, e.size)) return false;
    const NodeLayout& hosts = layout();
    if (hosts.nodes == 1 && opts.list_shared_memory) {  // one host: one copy each way
      BlockingCall guard("allreduce", e.group, bytes);
      if (shared_allreduce_pieces(pieces, count, dt, op, e.comm, e.rank, e.size)) return true;
    }
    if (!ring_allowed(hierarchical_options(), hosts)) return false;
    BlockingCall guard("allreduce", e.group, bytes);
    ring_allreduce_pieces(pieces, count, dt, op, opts, e.comm, e.rank, e.size);
    return true;
  }

  void broadcast(void* buf, std::int64_t count, c10::ScalarType dt, int root) override {
    const CommView v = c();
    BlockingCall guard("broadcast", v.group, count * c10::elementSize(dt));
    auto* p = static_cast<char*>(buf);
    std::size_t esz = c10::elementSize(dt);
    // bytes travel as bytes: no datatype conversion, any dtype
    std::int64_t bytes = count * static_cast<std::int64_t>(esz);
    for (std::int64_t off = 0; off < bytes; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      mpi_check(MPI_Bcast(p + off, n, MPI_BYTE, root, v.comm), "MPI_Bcast");
    }
  }

  void reduce(const void* send, void* recv, std::int64_t count, c10::ScalarType dt, ReduceOp op,
              int root) override {
    const CommView v = c();
    BlockingCall guard("reduce", v.group, count * c10::elementSize(dt));
    auto type = mpi_type(dt);
    auto mop = mpi_op(op, dt);
    std::size_t esz = c10::elementSize(dt);
    bool is_root = v.rank == root;
    for (std::int64_t off = 0; off < count; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - off));
      const void* s = static_cast<const char*>(send) + off * esz;
      void* r = is_root ? static_cast<char*>(recv) + off * esz : nullptr;
      if (is_root && s == r) s = MPI_IN_PLACE;
      mpi_check(MPI_Reduce(s, r, n, type, mop, root, v.comm), "MPI_Reduce");
    }
  }

  void allgather(const void* send, void* recv, std::int64_t count, c10::ScalarType dt) override {
    const CommView v = c();
    std::int64_t bytes = count * static_cast<std::int64_t>(c10::elementSize(dt));
    BlockingCall guard("allgather", v.group, bytes);
    TORCH_CHECK(bytes * v.size < std::numeric_limits<int>::max(), "fluxmpi_py: allgather of ",
                bytes, " bytes per rank is too large");
    mpi_check(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes),
                            MPI_BYTE, v.comm),
              "MPI_Allgather");
  }

  void allgatherv(const void* send, std::int64_t send_bytes, void* recv,
                  const std::vector<std::int64_t>& recv_bytes) override {
    const CommView v = c();
    BlockingCall guard("allgather", v.group, send_bytes);
    IntCounts r(recv_bytes);
    mpi_check(MPI_Allgatherv(send, int_bytes(send_bytes), MPI_BYTE, recv, r.counts.data(),
                             r.displs.data(), MPI_BYTE, v.comm),
              "MPI_Allgatherv");
  }

  void gatherv(const void* send, std::int64_t send_bytes, void* recv,
               const std::vector<std::int64_t>& recv_bytes, int root) override {
    const CommView v = c();
    BlockingCall guard("gather", v.group, send_bytes);
    IntCounts r(recv_bytes);
    mpi_check(MPI_Gatherv(send, int_bytes(send_bytes), MPI_BYTE, recv, r.counts.data(),
                          r.displs.data(), MPI_BYTE, root, v.comm),
              "MPI_Gatherv");
  }

  void scatterv(const void* send, const std::vector<std::int64_t>& send_bytes, void* recv,
                std::int64_t recv_bytes, int root) override {
    const CommView v = c();
    BlockingCall guard("scatter", v.group, recv_bytes);
    IntCounts s(send_bytes);
    mpi_check(MPI_Scatterv(send, s.counts.data(), s.displs.data(), MPI_BYTE, recv,
                           int_bytes(recv_bytes), MPI_BYTE, root, v.comm),
              "MPI_Scatterv");
  }

  void alltoallv(const void* send, const std::vector<std::int64_t>& send_bytes, void* recv,
                 const std::vector<std::int64_t>& recv_bytes) override {
    const CommView v = c();
    std::int64_t sent = 0;
    for (std::int64_t n : send_bytes) sent += n;
    BlockingCall guard("alltoall", v.group, sent);
    IntCounts s(send_bytes), r(recv_bytes);
    mpi_check(MPI_Alltoallv(send, s.counts.data(), s.displs.data(), MPI_BYTE, recv, r.counts.data(),
                            r.displs.data(), MPI_BYTE, v.comm),
              "MPI_Alltoallv");
  }

  // Open MPI 4.1 here: MPI_Alltoall took 0.89x MPI_Alltoallv's time at 3 ranks from 1 MiB
  // to 4 MiB and 0.6x at 4 KiB, the same at 2 ranks (docs/measurements.md).
  void alltoall_equal(const void* send, void* recv, std::int64_t part_bytes, int size) override {
    const CommView v = c();
    TORCH_INTERNAL_ASSERT(size == v.size, "alltoall_equal on a communicator of another size");
    BlockingCall guard("alltoall", v.group, part_bytes * size);
    const int n = int_bytes(part_bytes);
    int_bytes(part_bytes * v.size);  // the ops layer checked the 2 GiB limit
    mpi_check(MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, v.comm), "MPI_Alltoall");
  }

  void reduce_scatter(const void* send, void* recv, const std::vector<std::int64_t>& counts,
                      c10::ScalarType dt, ReduceOp op) override {
    const CommView v = c();
    std::int64_t total = 0;
    for (std::int64_t n : counts) total += n;
    const bool large =
        total * static_cast<std::int64_t>(c10::elementSize(dt)) >= kSharedReduceScatterMinBytes;
    const bool shared = large && v.size > 1 && shared_reduce_scatter_takes(dt, op) &&
                        ring_options().list_shared_memory && layout().nodes == 1;
    BlockingCall guard("reduce_scatter", v.group,
                       total * static_cast<std::int64_t>(c10::elementSize(dt)));
    if (shared && shared_reduce_scatter(send, recv, counts, dt, op, v.comm, v.rank, v.size)) return;
    if (!large &&
        std::all_of(counts.begin(), counts.end(), [&](std::int64_t n) { return n == counts[0]; })) {
      // Equal parts (every rank sees the same counts): the block form, as fast or faster than
      // MPI_Reduce_scatter below 128 KiB here (above, some launches took 10x: 308 us against 31).
      mpi_check(MPI_Reduce_scatter_block(send, recv, int_bytes(counts[0]), mpi_type(dt),
                                         mpi_op(op, dt), v.comm),
                "MPI_Reduce_scatter_block");
      return;
    }
    std::vector<int> parts;
    for (std::int64_t n : counts) parts.push_back(int_bytes(n));  // elements, within int as bytes
    mpi_check(MPI_Reduce_scatter(send, recv, parts.data(), mpi_type(dt), mpi_op(op, dt), v.comm),
              "MPI_Reduce_scatter");
  }

  bool reduce_parts_by_owner(const std::vector<BufferPiece>& pieces, std::int64_t part_count,
                             c10::ScalarType dt, const OwnerPass& pass, int sets) override {
    const CommView v = c();
    if (v.size < 2 || !ring_options().list_shared_memory || layout().nodes != 1) return false;
    const auto elem = static_cast<std::int64_t>(c10::elementSize(dt));
    BlockingCall guard("reduce_scatter", v.group, part_count * elem * v.size * sets);
    return shared_owner_parts(pieces, part_count * elem, elem, pass, v.comm, v.rank, v.size, sets);
  }

  void barrier() override {
    const CommView v = c();
    BlockingCall guard("barrier", v.group, 0);
    mpi_check(MPI_Barrier(v.comm), "MPI_Barrier");
  }
};

}  // namespace

Backend& world_mpi_backend() {
  static MpiBackend backend;
  return backend;
}

namespace {
// The runtime's world group serves this backend (runtime/group.h cannot name the layer above).
const bool kWorldBackendRegistered = (set_world_backend(&world_mpi_backend), true);
}  // namespace

std::unique_ptr<Backend> make_mpi_backend(MPI_Comm comm, int rank, int size, int group) {
  return std::make_unique<MpiBackend>(comm, rank, size, group);
}

}  // namespace fluxmpi
