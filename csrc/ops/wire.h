// The buffers and dtypes a reduction travels in: the wire dtype and op, the contiguous staging
// buffer, the result written back, the average's division (ops/collectives.h, ops/carried_offer.h).
#pragma once

#include <ATen/ATen.h>

#include "backend/reduce_op.h"

namespace fluxmpi {

// How float16 / bfloat16 sums, products and averages travel.
//  Fp32: widened to fp32, reduced, rounded once (twice the bytes; exact fp32 accumulation,
//        e.g. 2048 + 1 + 1 + 1 gives 2052, where rounding to fp16 after each add gives 2048).
//  Wire16: in 16 bits, each pairwise combine computed in fp32 and rounded (half the bytes:
//        for deliberate compression); average pre-scales by 1/world so the sum cannot overflow.
enum class HalfReduction { Fp32, Wire16 };

// float16 or bfloat16.
bool is_half(c10::ScalarType t);
// The dtype a reduction travels in: fp32 for 16-bit float sums, products and averages
// (HalfReduction::Fp32), int64 for averages of narrower integers (the sum must not wrap).
c10::ScalarType wire_dtype(c10::ScalarType dt, ReduceOp op, HalfReduction half);
// The backend op for `op`: Average is a sum (min for bool: the floor of a mean of 0/1 values).
ReduceOp wire_op(ReduceOp op, c10::ScalarType dt);
// Turn a sum over `world` ranks into the average: the floor of the mean for integers.
void divide_by(const at::Tensor& x, int world);
// Writes through data_ptr() bypass the dispatcher, so tell autograd that `t` changed, as any
// in-place op would (a saved tensor modified by a collective then fails loudly in backward).
void bump_version(const at::Tensor& t);
// A contiguous buffer with t's values in dtype `dt`: t itself when it already is one.
at::Tensor staging(const at::Tensor& t, c10::ScalarType dt);
// A result computed in buffer `c` (staging) back into `t`.
void write_back(const at::Tensor& c, const at::Tensor& t);

}  // namespace fluxmpi
