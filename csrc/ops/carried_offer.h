// What a small in-place call (allreduce_, reduce_, bcast_) offers to carry in its agreement
// (ops/carried.h), and how a carried result reaches its tensor: only once the agreement passed
// on every rank.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "ops/carried.h"
#include "ops/consensus.h"
#include "ops/wire.h"

namespace fluxmpi {

struct Offer {
  Carry carry;
  at::Tensor c;          // the contiguous buffer that is sent, and that takes the result
  bool divided = false;  // an average of floats divided as allreduce_divided does
};

// A reduction's offer (`root` < 0: an allreduce, else a reduce_ to `root`); sets s.carry_bytes.
// False where the call does not ride (a bad call, too large, a combine an envelope would not
// compute with MPI's bits).
bool offer_reduction(const at::Tensor& t, ReduceOp op, SumOrder order, std::int64_t root,
                     Signature& s, Offer& o);
// The carried reduction into `t` (a rank that takes the result).
void take_reduction(const at::Tensor& t, ReduceOp op, const Offer& o, int world);

// A broadcast's offer: any dtype rides as bytes, the root's reach every rank.
bool offer_broadcast(const at::Tensor& t, std::int64_t root, const Signature& s, Offer& o);
// The root's bytes into `t` (a rank other than the root).
void take_broadcast(const at::Tensor& t, const Offer& o);

}  // namespace fluxmpi
