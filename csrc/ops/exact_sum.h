// The element kernels of DistributedOptimizer(deterministic=True) (training/exact_sum.py): one
// pass that rounds a gradient onto the fixed-point grid and adds it into its int64 accumulator,
// one that turns the reduced int64 sum back into the parameter's dtype, and one that does both
// for the ranks' values of a shard at once (training/_exact_shards.py). No MPI: the data
// movement between ranks is the caller's. Each element is computed on its own, in float64,
// with the same roundings as the torch ops they replace, so the results are the same bits.
#pragma once

#include <ATen/core/Tensor.h>

namespace fluxmpi {

// For each element x of `grad` (float32, float64, float16 or bfloat16, on the CPU): if
// |x| < bound, q = round(x * scale) (float64, to nearest, ties to even), else q = 0 (the caller
// drops the values); acc = accumulate ? acc + q : q. `acc`: a contiguous CPU int64 tensor of
// grad's numel. Returns the largest |x| (0 for an empty grad), NaN when grad holds a NaN, found
// in the same pass over memory (block by block). `scale` must be a power of two (the product is
// then exact).
double exact_quantize(const at::Tensor& grad, const at::Tensor& acc, double scale, double bound,
                      bool accumulate);

// out = dtype(float64(sum) / divisor), elementwise: `sum` a contiguous CPU int64 tensor, `out` a
// contiguous CPU floating tensor of its numel (float32, float64, float16 or bfloat16).
void exact_dequantize(const at::Tensor& sum, const at::Tensor& out, double divisor);

// The two above fused over the ranks' values of one segment: `rows` is 2-d (one row per rank,
// each row contiguous; the row stride is free), `out` a contiguous 1-d tensor of rows' dtype and
// row length. out[j] = dtype(float64(sum over r of q(rows[r][j])) / divisor), q as
// exact_quantize rounds (0 at or beyond `bound`), the sum in int64: the same bits as
// exact_quantize on each row into one accumulator, then exact_dequantize. Returns the largest
// |x| over all rows (NaN when one is a NaN). `out` may be one of the rows.
double exact_sum_rows(const at::Tensor& rows, const at::Tensor& out, double scale, double bound,
                      double divisor);

}  // namespace fluxmpi
