// An envelope: one message that carries a call's cross-rank check and, for a small call, its
// data, so that the call costs one round trip instead of two (ops/carried.h builds them).
// Layout, in int64 words: EnvelopeHead, then `lanes` words reduced by max, then the payload
// (padded to whole words). Every rank passes an envelope of the same size; the reduction
// (one MPI_Allreduce with a user-defined op over one element of a contiguous type, so MPI
// never splits it) takes the max of the lanes and combines the payloads:
//  - kEnvelopeReduce: elementwise `op` over `count` elements of `dtype`, as MPI's own op would;
//  - kEnvelopeTake: the payload of the rank whose `present` is 1 (a broadcast's root).
// When the ranks' heads differ (kind, dtype, op, bytes), the result's kind is kEnvelopePoisoned
// and its payload is garbage: the caller then moves the data as if nothing was carried.
// Every combine is commutative, so every rank gets the same bytes.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "backend/reduce_op.h"

namespace fluxmpi {

constexpr std::int64_t kEnvelopeNone = 0;
constexpr std::int64_t kEnvelopeReduce = 1;
constexpr std::int64_t kEnvelopeTake = 2;
constexpr std::int64_t kEnvelopePoisoned = -1;

struct EnvelopeHead {
  std::int64_t kind = kEnvelopeNone;
  std::int64_t dtype = -1;   // c10::ScalarType of the payload's elements (kEnvelopeReduce)
  std::int64_t op = -1;      // ReduceOp (kEnvelopeReduce)
  std::int64_t bytes = 0;    // the payload's bytes
  std::int64_t present = 0;  // kEnvelopeTake: 1 on the rank whose payload everyone takes
  std::int64_t lanes = 0;    // int64 words after the head, reduced by max
};

constexpr std::int64_t kEnvelopeHeadWords =
    static_cast<std::int64_t>(sizeof(EnvelopeHead) / sizeof(std::int64_t));

// Whether kEnvelopeReduce combines `dtype` with `op` exactly as MPI's predefined op does on
// every rank (integers and bool with any op; float and double with sum and prod only: min and
// max of a NaN depend on the operand order MPI's own op uses).
bool envelope_reduces(c10::ScalarType dtype, ReduceOp op);

// `in` combined into `io` elementwise, `bytes` bytes of `dtype` with `op`, as MPI's predefined
// op would (word-aligned buffers). Returns false, having done nothing, for a pair that
// envelope_reduces refuses. Never throws.
bool combine_elements(const void* in, void* io, std::int64_t bytes, c10::ScalarType dtype,
                      ReduceOp op);

// The reduction of envelope `in` into `inout` (both of the layout above). Never throws: it runs
// inside MPI.
void combine_envelopes(const void* in, void* inout);

// The envelope's total bytes for `lanes` max lanes and a payload of `payload_bytes`.
std::int64_t envelope_bytes(std::int64_t lanes, std::int64_t payload_bytes);

}  // namespace fluxmpi
