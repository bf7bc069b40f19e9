// The element kernels of DistributedOptimizer(deterministic=True) (training/exact_sum.py): one
// pass that rounds a gradient onto the fixed-point grid and adds it into its int64 accumulator,
// one that turns the reduced int64 sum back into the parameter's dtype, and one that does both
// for the ranks' values of a shard at once (training/_exact_shards.py). No MPI: the data
// movement between ranks is the caller's. Each element is computed on its own, in float64,
// with the same roundings as the torch ops they replace, so the results are the same bits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

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
// exact_quantize rounds (0 at or beyond `bound`), the sum exact: the same bits as
// exact_quantize on each row into one accumulator, then exact_dequantize. Returns the largest
// |x| over all rows (NaN when one is a NaN). `out` may be one of the rows.
// Block by block (2048 elements): where every row's |x * scale| is below 2**51 and their sum
// below 2**52, the integers are added in float64 (exact there, so the same integers and bits;
// AVX2 where the CPU has it, never FMA); elsewhere in int64, then converted back.
double exact_sum_rows(const at::Tensor& rows, const at::Tensor& out, double scale, double bound,
                      double divisor);

// exact_sum_rows over `n` elements of `dtype` at each of `rows` (one pointer a rank, any
// order: the sum is exact) into `out` (which may be one of them). For callers that checked
// their buffers (ops/exact_shards.cpp): a bad argument is our bug.
double exact_sum_parts(const std::vector<const void*>& rows, void* out, std::int64_t n,
                       c10::ScalarType dtype, double scale, double bound, double divisor);

// Turns the float64 pass off (false: every block in int64) or on; returns the previous
// setting. For tests that compare the two passes.
bool set_exact_float64_pass(bool on);

// How many blocks the owner's passes of this process summed in float64, and in int64.
std::pair<std::int64_t, std::int64_t> exact_sum_block_counts();

}  // namespace fluxmpi
