// fluxmpi's own ring allreduce over MPI point-to-point messages (reduce-scatter, then
// allgather), used by the MPI backend for large float and double sums and averages instead of
// MPI_Allreduce, and for grouped calls' lists of tensors reduced where they lie (pieces: the
// messages are MPI datatypes over the tensors' memory, since Open MPI refuses MPI_SUM on such
// datatypes in MPI_Allreduce). Every element is reduced on exactly one rank and then copied to the
// others, so all ranks hold identical bits; an average divides inside the last reduction step,
// which saves a whole pass over the buffer.
#pragma once

#include <mpi.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/reduce_op.h"

namespace fluxmpi {

// When the ring runs and how it cuts its messages. Every rank must hold the same values: each
// rank decides from them alone whether a call takes the ring or MPI_Allreduce and where its
// messages are cut, and ranks that decide differently wait for each other forever.
//
// Defaults, measured here (2 ranks, Open MPI 4.1, shared memory,
// benchmarks/bench_collectives.py): Open MPI's algorithm falls out of cache above ~32 MiB,
// where the ring is about 2x faster (64 MiB: 20.7 ms vs 40.1 ms), while from 1 to 16 MiB the
// two are within noise or MPI is a little ahead; so plain sums take the ring from 16 MiB and
// averages, which save their division pass, from 1 MiB. A chunk moves in segments of a
// quarter chunk, between 256 KiB and 2 MiB: each segment is one MPI_Sendrecv (~10-20 us of
// handshake over shared memory), so 128 KiB segments made the ring 1.7x slower than
// MPI_Allreduce on ResNet-50's 1-9 MiB gradients; and 2 MiB stays in cache.
struct RingOptions {
  bool enabled = true;  // false: MPI_Allreduce always (FLUXMPI_RING_MIN_BYTES=0)
  std::int64_t sum_min_bytes = std::int64_t(16) << 20;     // FLUXMPI_RING_MIN_BYTES sets it
  std::int64_t average_min_bytes = std::int64_t(1) << 20;  // or sum_min_bytes, if smaller
  std::int64_t min_segment_bytes = std::int64_t(256) << 10;
  std::int64_t max_segment_bytes = std::int64_t(2) << 20;
  // A grouped allreduce of a list whose tensors of one dtype total at least this many bytes
  // reduces them where they lie (ring_allreduce_pieces), skipping the pack into one buffer and
  // the unpack, which cost about one flat allreduce at 4 MB here (docs/measurements.md).
  std::int64_t list_min_bytes = std::int64_t(1) << 20;
  // Such a list moves through shared memory when every rank is on one host
  // (backend/mpi_shared_pieces.h); false: through this ring, whose messages are MPI datatypes
  // over the tensors (two copies each way on Open MPI's shared memory; the path across hosts).
  bool list_shared_memory = true;
};

// This process's options: the defaults, with FLUXMPI_RING_MIN_BYTES applied on first use (a
// byte count; 0 turns the ring off), until set_ring_options replaces them.
RingOptions ring_options();

// Replace the options (ValueError naming a negative threshold or a segment range that is not
// 1 <= min_segment_bytes <= max_segment_bytes). Not collective: call it with the same values
// on every rank, between collectives.
void set_ring_options(const RingOptions& opts);

// Whether `opts` send an allreduce of `count` elements of `dt` over `world` ranks through the
// ring: a float or double sum (divisor 1) or average (divisor > 1) over more than one rank,
// at or above its threshold.
bool ring_applies(const RingOptions& opts, std::int64_t count, c10::ScalarType dt, int divisor,
                  int world);

// Whether `opts` send a list of `bytes` bytes of `dt` over `world` ranks through
// ring_allreduce_pieces: float or double sum, average, min or max; integer sum, min or max;
// more than one rank; at or above list_min_bytes (and above 0).
bool ring_list_applies(const RingOptions& opts, std::int64_t bytes, c10::ScalarType dt, ReduceOp op,
                       int world);

// How many allreduces this process has sent through the ring (either form) (tests check with it
// that their options reach the ring).
std::int64_t ring_calls();

// In place: buf <- (sum over the ranks of `comm`) / divisor, for kFloat or kDouble, cut into
// segments by `opts`. A blocking collective: the caller holds the BlockingCall.
void ring_allreduce(void* buf, std::int64_t count, c10::ScalarType dt, int divisor,
                    const RingOptions& opts, MPI_Comm comm, int rank, int size);

// In place over the `count` elements of `dt` laid out in `pieces` in order (which must not
// overlap), as if they were one buffer: `op` (Sum, Min, Max; Average divides the sum by
// `size` in the last reduction step). Received segments land in a contiguous scratch buffer
// and are reduced into the pieces; the pieces' parts travel as MPI_Type_create_hindexed
// datatypes over their own memory. Bitwise identical on every rank, like ring_allreduce.
void ring_allreduce_pieces(const std::vector<BufferPiece>& pieces, std::int64_t count,
                           c10::ScalarType dt, ReduceOp op, const RingOptions& opts, MPI_Comm comm,
                           int rank, int size);

// This process's SumOrder (backend/reduce_op.h): FLUXMPI_SUM_ORDER ("fastest" or "gloo"; ValueError
// otherwise) on first use, until set_sum_order. Not collective: ranks whose orders differ raise at
// their next allreduce, on every rank (ops/collectives.cpp signs the call with it).
SumOrder sum_order();
void set_sum_order(SumOrder order);
SumOrder parse_sum_order(const std::string& name);  // ValueError naming the bad name
const char* sum_order_name(SumOrder order);

// Whether a sum of `dt` over `world` ranks in `order` takes gloo_order_allreduce: Gloo, a sum,
// 3 or more ranks, float, double, float16 or bfloat16.
bool gloo_order_applies(SumOrder order, c10::ScalarType dt, ReduceOp op, int world);

// In place: buf <- the sum over the ranks of `comm`, element by element in gloo's ring order:
// region c of gloo's cut (its 1 MiB segments, an equal number per rank) sums as
// x_c + (x_{c+1} + (... + (x_{c-2} + x_{c-1}))), each addition rounded to `dt`. This ring turns
// the other way from ring_allreduce's, its chunk c over gloo's region c + 1. A blocking
// collective: the caller holds the BlockingCall.
void gloo_order_allreduce(void* buf, std::int64_t count, c10::ScalarType dt, MPI_Comm comm,
                          int rank, int size);

// How many gloo_order_allreduce calls this process has made (for tests).
std::int64_t gloo_order_calls();

}  // namespace fluxmpi
