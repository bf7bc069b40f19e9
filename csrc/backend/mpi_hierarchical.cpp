#include "backend/mpi_hierarchical.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "backend/mpi_check.h"

namespace fluxmpi {

namespace {

// MPI counts are ints: move large buffers in pieces of at most 2^30 elements.
constexpr std::int64_t kMaxPiece = std::int64_t(1) << 30;

std::atomic<std::int64_t> g_calls{0};

struct Settings {
  std::mutex mu;
  bool loaded = false;
  HierarchicalOptions opts;
};

Settings& settings() {
  static Settings s;
  return s;
}

HierarchicalOptions from_environment() {
  HierarchicalOptions o;
  const char* s = std::getenv("FLUXMPI_HIERARCHICAL");
  if (s != nullptr && std::strcmp(s, "0") == 0) o.enabled = false;
  return o;
}

}  // namespace

HierarchicalOptions hierarchical_options() {
  auto& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.loaded) {
    s.opts = from_environment();
    s.loaded = true;
  }
  return s.opts;
}

void set_hierarchical_options(const HierarchicalOptions& opts) {
  TORCH_CHECK_VALUE(opts.min_bytes >= 0 && opts.max_bytes >= 0,
                    "fluxmpi_py: HierarchicalOptions.min_bytes and max_bytes must be >= 0, got ",
                    opts.min_bytes, " and ", opts.max_bytes);
  auto& s = settings();
  std::lock_guard<std::mutex> lock(s.mu);
  s.opts = opts;
  s.loaded = true;
}

const NodeLayout& node_layout(MPI_Comm comm) {
  // Reached only with the engine held (the engine thread or an inline caller); the lock
  // guards the map against a reader on another thread all the same.
  static std::mutex mu;
  static auto* layouts = new std::map<MPI_Comm, NodeLayout>();  // leaked: lives for the process
  std::lock_guard<std::mutex> lock(mu);
  auto it = layouts->find(comm);
  if (it != layouts->end()) return it->second;
  NodeLayout l;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  mpi_check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &l.node),
            "MPI_Comm_split_type (hierarchical allreduce)");
  int node_rank = 0, node_size = 1;
  MPI_Comm_rank(l.node, &node_rank);
  MPI_Comm_size(l.node, &node_size);
  mpi_check(MPI_Comm_split(comm, node_rank == 0 ? 0 : MPI_UNDEFINED, rank, &l.leaders),
            "MPI_Comm_split (hierarchical allreduce)");
  MPI_Comm_set_errhandler(l.node, MPI_ERRORS_RETURN);
  if (l.leaders != MPI_COMM_NULL) MPI_Comm_set_errhandler(l.leaders, MPI_ERRORS_RETURN);
  // how many leaders (= hosts), and the largest host
  int mine[2] = {node_rank == 0 ? 1 : 0, node_size};
  int sum_max[2] = {0, 0};
  mpi_check(MPI_Allreduce(&mine[0], &sum_max[0], 1, MPI_INT, MPI_SUM, comm),
            "MPI_Allreduce (hierarchical layout)");
  mpi_check(MPI_Allreduce(&mine[1], &sum_max[1], 1, MPI_INT, MPI_MAX, comm),
            "MPI_Allreduce (hierarchical layout)");
  l.nodes = sum_max[0];
  l.max_node_size = sum_max[1];
  return layouts->emplace(comm, l).first->second;
}

bool hierarchical_applies(const HierarchicalOptions& opts, std::int64_t bytes,
                          const NodeLayout& layout) {
  return opts.enabled && bytes >= opts.min_bytes && bytes < opts.max_bytes && bytes > 0 &&
         layout.spans_hosts_with_neighbours();
}

bool ring_allowed(const HierarchicalOptions& opts, const NodeLayout& layout) {
  return opts.ring_across_hosts || !layout.spans_hosts_with_neighbours();
}

std::int64_t hierarchical_calls() { return g_calls.load(); }

void hierarchical_allreduce(void* buf, std::int64_t count, MPI_Datatype type, std::size_t esz,
                            MPI_Op op, const NodeLayout& layout) {
  g_calls.fetch_add(1);
  int node_rank = 0;
  MPI_Comm_rank(layout.node, &node_rank);
  auto* p = static_cast<char*>(buf);
  for (std::int64_t off = 0; off < count; off += kMaxPiece) {
    const int n = static_cast<int>(std::min(kMaxPiece, count - off));
    char* at = p + off * static_cast<std::int64_t>(esz);
    // 1. inside the host, onto its leader (shared memory)
    mpi_check(MPI_Reduce(node_rank == 0 ? MPI_IN_PLACE : at, node_rank == 0 ? at : nullptr, n, type,
                         op, 0, layout.node),
              "MPI_Reduce (hierarchical allreduce, inside the host)");
    // 2. across the hosts, one leader each
    if (layout.leaders != MPI_COMM_NULL) {
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, at, n, type, op, layout.leaders),
                "MPI_Allreduce (hierarchical allreduce, across hosts)");
    }
    // 3. inside the host, from its leader
    mpi_check(MPI_Bcast(at, n, type, 0, layout.node),
              "MPI_Bcast (hierarchical allreduce, inside the host)");
  }
}

}  // namespace fluxmpi
