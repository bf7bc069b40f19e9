// fluxmpi's node-aware (hierarchical) allreduce: the ranks of each host reduce onto their
// host's leader over shared memory, the leaders (one per host) allreduce across the hosts, and
// each leader broadcasts the result inside its host. Across hosts only one rank per host
// sends, once; every rank ends with the leader's bits, so all ranks hold identical values.
#pragma once

#include <mpi.h>

#include <cstdint>

namespace fluxmpi {

// How the MPI backend's allreduce runs in a job spanning hosts with more than one rank on
// some host (on one host, or with one rank per host, these options change nothing). Every rank
// must hold the same values: each decides from them alone. The node-aware path takes sums
// (and averages), min, max and prod of any dtype from min_bytes up to, not including,
// max_bytes; outside that range MPI_Allreduce runs, and fluxmpi's ring only if
// ring_across_hosts.
//
// Defaults, measured (docs/measurements.md, "Across hosts"; 2 virtual hosts x 2 ranks, links
// of 10 and 1 Gbit/s): from 64 KiB to 4 MiB the node-aware path matches MPI_Allreduce on
// 10 Gbit/s and beats it on 1 Gbit/s (1.6x at 64 KiB); from 16 MiB MPI_Allreduce is ahead
// (1.1-1.3x). The ring, tuned for shared memory, took 1.3-2.1x MPI_Allreduce's time from
// 1 to 16 MiB across hosts.
struct HierarchicalOptions {
  bool enabled = true;  // FLUXMPI_HIERARCHICAL=0 turns the node-aware path off
  std::int64_t min_bytes = std::int64_t(64) << 10;
  std::int64_t max_bytes = std::int64_t(16) << 20;
  bool ring_across_hosts = false;
};

// This process's options: the defaults (FLUXMPI_HIERARCHICAL=0 applied on first use) until
// set_hierarchical_options replaces them.
HierarchicalOptions hierarchical_options();

// Replace the options (ValueError naming a negative min_bytes or max_bytes). Not collective: call
// it with the same values on every rank, between collectives.
void set_hierarchical_options(const HierarchicalOptions& opts);

// The hosts of a communicator, as the hierarchical allreduce sees them; the same on every rank.
struct NodeLayout {
  MPI_Comm node = MPI_COMM_NULL;     // the ranks of this host (MPI_COMM_TYPE_SHARED)
  MPI_Comm leaders = MPI_COMM_NULL;  // node rank 0 of every host; MPI_COMM_NULL elsewhere
  int nodes = 1;                     // how many hosts
  int max_node_size = 1;             // the most ranks on one host
  bool spans_hosts_with_neighbours() const { return nodes > 1 && max_node_size > 1; }
};

// The layout of `comm`, made on first use (a collective: every rank of `comm` must ask at the
// same point) and kept for the process; the communicators it holds are never freed (MPI
// frees them at MPI_Finalize).
const NodeLayout& node_layout(MPI_Comm comm);

// Whether an allreduce of `bytes` takes the node-aware path under `opts` on `layout`.
bool hierarchical_applies(const HierarchicalOptions& opts, std::int64_t bytes,
                          const NodeLayout& layout);

// Whether fluxmpi's ring may run on `layout` under `opts` (its own options decide the rest).
bool ring_allowed(const HierarchicalOptions& opts, const NodeLayout& layout);

// How many allreduces this process has sent through the hierarchical path (for tests).
std::int64_t hierarchical_calls();

// In place: buf <- the reduction by `op` over every rank of the layout's hosts, of `count`
// elements of `type` (esz bytes each). A blocking collective: the caller holds the
// BlockingCall. Returns after the host's broadcast; a divisor is the caller's to apply.
void hierarchical_allreduce(void* buf, std::int64_t count, MPI_Datatype type, std::size_t esz,
                            MPI_Op op, const NodeLayout& layout);

}  // namespace fluxmpi
