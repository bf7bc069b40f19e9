#include "ops/carried_offer.h"

#include <c10/core/GradMode.h>

#include <cstring>

#include "backend/select.h"
#include "runtime/group.h"

namespace fluxmpi {

namespace {

// The sum over the ranks into the average, as allreduce_divided does it (float and double:
// each element divided in its own type) or divide_by (integers).
void average_in_place(const at::Tensor& c, int world, bool divided) {
  if (!divided) return divide_by(c, world);
  if (c.scalar_type() == c10::kFloat) {
    auto* p = c.data_ptr<float>();
    const float d = static_cast<float>(world);
    for (std::int64_t i = 0; i < c.numel(); ++i) p[i] /= d;
  } else {
    auto* p = c.data_ptr<double>();
    const double d = static_cast<double>(world);
    for (std::int64_t i = 0; i < c.numel(); ++i) p[i] /= d;
  }
}

}  // namespace

// A reduction's offer to ride in its agreement (ops/carried.h): a good host call of 1 to
// max_reduction_carry_bytes bytes on the wire, whose combine an envelope computes as MPI would and,
// for an allreduce, that the MPI backend would send as one MPI_Allreduce. Floats only on 2 ranks:
// there each rank adds the other's values to its own, in any algorithm, so the bits are MPI's;
// on more, MPI's algorithm for the data alone (a ring at some sizes) orders the additions
// differently from the envelope's. `c` gets the contiguous wire buffer. `allreduce`: else a
// reduce_, which then rides an allreduce.
bool offer_reduction(const at::Tensor& t, ReduceOp op, SumOrder order, std::int64_t root,
                     Signature& s, Offer& o) {
  const bool allreduce = root < 0;
  const Group& e = current_group();
  if (s.error != ErrorClass::None || e.size() < 2 || !t.is_cpu() || t.numel() == 0) return false;
  if (order != SumOrder::Fastest) return false;
  const auto dt = t.scalar_type();
  const auto wire = wire_dtype(dt, op, HalfReduction::Fp32);
  const auto wop = wire_op(op, dt);
  const std::int64_t bytes = t.numel() * static_cast<std::int64_t>(c10::elementSize(wire));
  if (!envelope_reduces(wire, wop)) return false;
  if (e.size() > 2 && c10::isFloatingType(wire)) return false;
  Backend& b = backend_for(t);
  if (bytes > max_reduction_carry_bytes(e, b.direct_slot_bytes())) return false;
  o.divided = allreduce && op == ReduceOp::Average && b.fuses_division() &&
              (wire == c10::kFloat || wire == c10::kDouble);
  if (allreduce && !b.allreduces_plainly(t.numel(), wire, wop, o.divided)) return false;
  s.carry_bytes = bytes;
  o.c = staging(t, wire);
  o.carry.kind = kEnvelopeReduce;
  o.carry.dtype = wire;
  o.carry.op = wop;
  o.carry.data = o.c.data_ptr();
  o.carry.bytes = bytes;
  o.carry.root = root;
  o.carry.dest = o.c.data_ptr();
  return true;
}

void take_reduction(const at::Tensor& t, ReduceOp op, const Offer& o, int world) {
  c10::AutoGradMode no_grad(false);
  if (o.carry.result != o.c.data_ptr()) {
    std::memcpy(o.c.data_ptr(), o.carry.result, static_cast<std::size_t>(o.carry.bytes));
  }
  if (op == ReduceOp::Average) average_in_place(o.c, world, o.divided);
  write_back(o.c, t);
}

bool offer_broadcast(const at::Tensor& t, std::int64_t root, const Signature& s, Offer& o) {
  const Group& e = current_group();
  const std::int64_t bytes =
      t.defined() ? t.numel() * static_cast<std::int64_t>(t.element_size()) : 0;
  if (s.error != ErrorClass::None || e.size() < 2 || !t.is_cpu() || bytes == 0 ||
      bytes > max_broadcast_carry_bytes(e)) {
    return false;
  }
  const bool is_root = e.rank() == root;
  o.carry.kind = kEnvelopeTake;
  o.carry.bytes = bytes;
  o.carry.present = is_root;
  o.carry.root = root;
  o.c = staging(t, t.scalar_type());
  o.carry.data = is_root ? o.c.data_ptr() : nullptr;
  o.carry.dest = is_root ? nullptr : o.c.data_ptr();
  return true;
}

void take_broadcast(const at::Tensor& t, const Offer& o) {
  c10::AutoGradMode no_grad(false);
  if (o.carry.result != o.c.data_ptr()) {
    std::memcpy(o.c.data_ptr(), o.carry.result, static_cast<std::size_t>(o.carry.bytes));
  }
  write_back(o.c, t);
}

}  // namespace fluxmpi
