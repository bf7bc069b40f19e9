#include "ops/wire.h"

namespace fluxmpi {

namespace {

bool is_narrow_int(c10::ScalarType t) {
  return t == c10::kChar || t == c10::kShort || t == c10::kInt || t == c10::kByte;
}

}  // namespace

bool is_half(c10::ScalarType t) { return t == c10::kHalf || t == c10::kBFloat16; }

// The dtype a reduction travels in: fp32 for 16-bit float sums, products and averages (see
// HalfReduction), int64 for averages of narrower integers (the sum must not wrap).
c10::ScalarType wire_dtype(c10::ScalarType dt, ReduceOp op, HalfReduction half) {
  if (is_half(dt) && half == HalfReduction::Fp32 && op != ReduceOp::Min && op != ReduceOp::Max)
    return c10::kFloat;
  if (op == ReduceOp::Average && is_narrow_int(dt)) return c10::kLong;
  return dt;
}

// Average is not a backend op. For bool, the floor of the mean of 0/1 values is "all of them".
ReduceOp wire_op(ReduceOp op, c10::ScalarType dt) {
  if (op != ReduceOp::Average) return op;
  return dt == c10::kBool ? ReduceOp::Min : ReduceOp::Sum;
}

// Turn a sum over `world` ranks into the average: the floor of the mean for integers.
void divide_by(const at::Tensor& x, int world) {
  if (world == 1 || x.scalar_type() == c10::kBool) return;
  if (c10::isFloatingType(x.scalar_type())) {
    x.div_(world);
  } else {
    x.div_(world, "floor");
  }
}

at::Tensor staging(const at::Tensor& t, c10::ScalarType dt) {
  if (t.scalar_type() == dt && t.is_contiguous()) return t;
  return at::empty(t.sizes(), t.options().dtype(dt)).copy_(t);
}

// Writes through data_ptr() bypass the dispatcher, so tell autograd that `t` changed, as any
// in-place op would (a saved tensor modified by a collective then fails loudly in backward).
void bump_version(const at::Tensor& t) {
  if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

void write_back(const at::Tensor& c, const at::Tensor& t) {
  if (c.is_same(t)) {
    bump_version(t);
  } else {
    t.copy_(c);
  }
}

}  // namespace fluxmpi
