#include "ops/collectives.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/GradMode.h>

#include <cstring>
#include <sstream>

#include "backend/mpi_ring.h"
#include "backend/select.h"
#include "ops/carried_offer.h"
#include "runtime/environment.h"
#include "runtime/group.h"
#include "runtime/hash.h"

namespace fluxmpi {

namespace {

bool supported_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kHalf:
    case c10::kBFloat16:
    case c10::kFloat:
    case c10::kDouble:
    case c10::kChar:
    case c10::kShort:
    case c10::kInt:
    case c10::kLong:
    case c10::kByte:
    case c10::kBool: return true;
    default: return false;
  }
}

}  // namespace

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "no tensor";
  if (t.is_nested()) return "nested tensor of dtype " + dtype_name(t.scalar_type());
  std::ostringstream s;
  s << "tensor of shape " << t.sizes() << ", dtype " << dtype_name(t.scalar_type()) << ", on "
    << c10::DeviceTypeName(t.device().type(), /*lower_case=*/true);
  return s.str();
}

namespace {

// Shape and device type: a CPU tensor on one rank and a CUDA tensor on another would go to
// different backends (MPI and NCCL) and wait for each other forever.
std::int64_t shape_hash(const at::Tensor& t) {
  auto sizes = t.sizes();
  const auto seed =
      static_cast<std::int64_t>(sizes.size()) + (static_cast<std::int64_t>(t.device().type()) << 8);
  return hash_bytes(sizes.data(), sizes.size() * sizeof(std::int64_t), seed);
}

Signature signature_of(CallKind kind, const at::Tensor& t) {
  Signature s;
  s.kind = kind;
  if (t.defined() && !t.is_nested()) {  // a nested tensor has no sizes: validate_tensor refuses it
    s.dtype = static_cast<std::int64_t>(t.scalar_type());
    s.numel = t.numel();
    s.detail = shape_hash(t);
  }
  return s;
}

}  // namespace

ErrorClass validate_tensor(const at::Tensor& t, std::string& msg) {
  if (!t.defined()) {
    msg = "expected a tensor, got an undefined tensor";
    return ErrorClass::Type;
  }
  if (t.is_nested()) {
    msg =
        "nested tensors are not supported; pass its components (.unbind()) or a padded "
        "tensor (.to_padded_tensor(0))";
    return ErrorClass::Type;
  }
  if (t.layout() != c10::kStrided) {
    std::ostringstream s;
    s << "tensor has layout " << t.layout()
      << ", only dense (strided) tensors are supported; call .to_dense() first";
    msg = s.str();
    return ErrorClass::Type;
  }
  if (!supported_dtype(t.scalar_type())) {
    msg = "tensor dtype " + dtype_name(t.scalar_type()) +
          " is not supported; expected one of torch.float16, torch.bfloat16, torch.float32, "
          "torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, "
          "torch.bool";
    if (t.is_complex()) {  // as_pairs passed it on as it is: an ordering op, or a conj view
      msg += t.is_conj() ? "; complex tensors move as pairs of reals: call .resolve_conj() first"
                         : "; complex tensors reduce with op 'sum' or 'average' only (as pairs "
                           "of reals), and move in broadcasts, gathers and alltoall";
    }
    return ErrorClass::Type;
  }
  if (!device_supported(t)) {
    std::ostringstream s;
    s << "tensor is on " << t.device() << ", which this build cannot communicate";
    msg = s.str();
    return ErrorClass::Type;
  }
  if (t.is_cuda()) {
    if (auto why = cuda_refusal(); !why.empty()) {
      msg = "tensor is on " + t.device().str() + ", but NCCL cannot run here: " + why;
      return ErrorClass::Value;
    }
  }
  if (at::has_internal_overlap(t) == at::MemOverlap::Yes) {
    msg =
        "tensor has elements that share memory (e.g. made by expand()), so it cannot hold "
        "a result in place; pass a .clone() of it";
    return ErrorClass::Value;
  }
  return ErrorClass::None;
}

void allreduce_data(Backend& b, const at::Tensor& t, ReduceOp op, int world, HalfReduction half,
                    SumOrder order) {
  if (t.numel() == 0) return;
  c10::AutoGradMode no_grad(false);  // a collective is not a step of any autograd graph
  const auto dt = t.scalar_type();
  if (gloo_order_applies(order, dt, op, world)) {
    at::Tensor c = staging(t, dt);  // 16-bit floats stay 16-bit: gloo rounds every addition
    if (b.allreduce_in_gloo_order(c.data_ptr(), c.numel(), dt)) {
      write_back(c, t);
      return;
    }
  }
  const auto wire = wire_dtype(dt, op, half);
  at::Tensor c = staging(t, wire);
  // 16 bits on the wire: pre-scale (computed in fp32, rounded once) so the sum cannot overflow.
  const bool prescale = op == ReduceOp::Average && is_half(wire);
  if (prescale) c.mul_(1.0 / world);
  if (op == ReduceOp::Average && !prescale && b.fuses_division() &&
      (wire == c10::kFloat || wire == c10::kDouble)) {
    b.allreduce_divided(c.data_ptr(), c.numel(), wire, world);  // no separate division pass
  } else {
    if (half == HalfReduction::Wire16 && is_half(wire)) {
      b.allreduce_wire16(c.data_ptr(), c.numel(), wire, wire_op(op, dt));
    } else {
      b.allreduce(c.data_ptr(), c.numel(), wire, wire_op(op, dt));
    }
    if (op == ReduceOp::Average && !prescale) divide_by(c, world);
  }
  write_back(c, t);
}

void broadcast_data(Backend& b, const at::Tensor& t, int root) {
  if (t.numel() == 0) return;
  c10::AutoGradMode no_grad(false);
  at::Tensor c = staging(t, t.scalar_type());
  b.broadcast(c.data_ptr(), c.numel(), c.scalar_type(), root);
  if (current_group().rank() != root) write_back(c, t);  // the root's values do not change
}

void reduce_data(Backend& b, const at::Tensor& t, ReduceOp op, int root, int rank, int world) {
  if (t.numel() == 0) return;
  c10::AutoGradMode no_grad(false);
  const bool is_root = rank == root;
  const auto dt = t.scalar_type();
  const auto wire = wire_dtype(dt, op, HalfReduction::Fp32);
  // A non-root rank only sends: from t itself when it is already a contiguous buffer of the
  // wire dtype, else from a copy. Either way its tensor is left unchanged.
  at::Tensor c = staging(t, wire);
  b.reduce(c.data_ptr(), is_root ? c.data_ptr() : nullptr, c.numel(), wire, wire_op(op, dt), root);
  if (!is_root) return;
  if (op == ReduceOp::Average) divide_by(c, world);
  write_back(c, t);
}

namespace {
thread_local bool premul_sum_signature = false;
}  // namespace

PremulSumScope::PremulSumScope() { premul_sum_signature = true; }
PremulSumScope::~PremulSumScope() { premul_sum_signature = false; }

void sign_sum_order(Signature& s, SumOrder order) {
  if (order != SumOrder::Gloo) return;
  if (s.op == static_cast<std::int64_t>(ReduceOp::Sum)) s.op = kGlooSumSignatureOp;
  if (s.op == kPremulSumSignatureOp) s.op = kGlooPremulSumSignatureOp;
}

ReduceOp signature_reduce_op(std::int64_t op) {
  if (op == kPremulSumSignatureOp || op == kGlooSumSignatureOp || op == kGlooPremulSumSignatureOp) {
    return ReduceOp::Sum;
  }
  return static_cast<ReduceOp>(op);
}

SumOrder signature_sum_order(std::int64_t op) {
  return op == kGlooSumSignatureOp || op == kGlooPremulSumSignatureOp ? SumOrder::Gloo
                                                                      : SumOrder::Fastest;
}

// Parse op/root without throwing: errors become this rank's part of the agreement.
ReduceOp parse_op_into(const std::string& name, Signature& s, std::string& msg) {
  try {
    auto op = parse_op(name);
    s.op = static_cast<std::int64_t>(op);
    if (premul_sum_signature && op == ReduceOp::Sum) s.op = kPremulSumSignatureOp;
    return op;
  } catch (const c10::Error& e) {
    s.error = ErrorClass::Value;
    msg = e.what_without_backtrace();
    return ReduceOp::Sum;
  }
}

void check_op_dtype(ReduceOp op, const at::Tensor& t, Signature& s, std::string& msg) {
  if (s.error != ErrorClass::None || !is_bitwise(op) || !t.defined()) return;
  if (!c10::isIntegralType(t.scalar_type(), /*includeBool=*/true)) {
    s.error = ErrorClass::Type;
    msg = std::string("op '") + op_name(op) +
          "' is bitwise: it takes integer or bool tensors, got " + describe(t) +
          "; use sum, min, max, prod or average for floating-point tensors";
  } else if (!t.is_cpu()) {
    s.error = ErrorClass::Value;
    msg = std::string("op '") + op_name(op) + "' runs on CPU tensors only (NCCL has no bitwise " +
          "reductions), got " + describe(t) + "; move the tensor to the CPU for this call";
  }
}

namespace {

// This rank's part of the agreement for tensor `t`: a local error (the caller's first, then
// the tensor's own) or none. `msg` gets the error's text.
void validate_into(const at::Tensor& t, const std::string& local_error, Signature& s,
                   std::string& msg) {
  if (s.error != ErrorClass::None) return;
  if (!local_error.empty()) {
    s.error = ErrorClass::Type;
    msg = local_error;
    return;
  }
  s.error = validate_tensor(t, msg);
}

// Complex tensors move as pairs of reals in a broadcast, and in sums and averages, the only
// reductions the pairs give right. The agreement still compares the complex dtype and shape
// (signature_of the tensor itself).
at::Tensor as_pairs(const at::Tensor& t, ReduceOp op) {
  return op == ReduceOp::Sum || op == ReduceOp::Average ? fluxmpi::as_pairs(t) : t;
}

}  // namespace

at::Tensor as_pairs(const at::Tensor& t) {
  return t.defined() && t.is_complex() && !t.is_conj() ? at::view_as_real(t) : t;
}

void allreduce_checked(const at::Tensor& tensor, const std::string& opname,
                       const std::string& local_error) {
  const Group& e = current_group();
  Signature s = signature_of(CallKind::Allreduce, tensor);
  std::string msg;
  ReduceOp op = parse_op_into(opname, s, msg);
  SumOrder order = SumOrder::Fastest;
  if (op == ReduceOp::Sum && s.error == ErrorClass::None) {
    try {
      order = sum_order();  // a bad FLUXMPI_SUM_ORDER: this rank's ValueError, on every rank
    } catch (const c10::ValueError& e) {
      s.error = ErrorClass::Value;
      msg = e.what_without_backtrace();
    }
  }
  sign_sum_order(s, order);
  const at::Tensor t = as_pairs(tensor, op);
  validate_into(t, local_error, s, msg);
  check_op_dtype(op, t, s, msg);
  s.joinable = Joinable::Allreduce;
  bool joined = false;
  Offer o;
  const bool offered = offer_reduction(t, op, order, /*root=*/-1, s, o);
  agree(
      s, "allreduce_()", msg, [&] { return describe(tensor); }, nullptr, &joined,
      offered ? &o.carry : nullptr);
  if (o.carry.carried) return take_reduction(t, op, o, e.size());
  if (joined) {
    AllreduceParts p{t.device().type(), {{t.scalar_type(), t.numel(), /*list=*/false}}};
    share_with_joined(p, /*is_joined=*/false);
  }
  allreduce_data(backend_for(t), t, op, e.size(), HalfReduction::Fp32, order);
}

void broadcast_checked(const at::Tensor& tensor, std::int64_t root,
                       const std::string& local_error) {
  current_group();  // "call Init first"
  Signature s = signature_of(CallKind::Broadcast, tensor);
  std::string msg;
  const at::Tensor t = as_pairs(tensor);
  validate_into(t, local_error, s, msg);
  check_root(root, s, msg);
  Offer o;
  const bool offered = offer_broadcast(t, root, s, o);
  if (offered) s.carry_bytes = o.carry.bytes;
  agree(
      s, "bcast_()", msg, [&] { return describe(tensor); }, nullptr, nullptr,
      offered ? &o.carry : nullptr);
  if (o.carry.carried) {
    if (current_group().rank() == root) return;  // the root's values do not change
    return take_broadcast(t, o);
  }
  broadcast_data(backend_for(t), t, static_cast<int>(root));
}

void reduce_checked(const at::Tensor& tensor, const std::string& opname, std::int64_t root,
                    const std::string& local_error) {
  const Group& e = current_group();
  Signature s = signature_of(CallKind::Reduce, tensor);
  std::string msg;
  ReduceOp op = parse_op_into(opname, s, msg);
  const at::Tensor t = as_pairs(tensor, op);
  validate_into(t, local_error, s, msg);
  check_op_dtype(op, t, s, msg);
  check_root(root, s, msg);
  Offer o;
  const bool offered = offer_reduction(t, op, SumOrder::Fastest, root, s, o);
  agree(
      s, "reduce_()", msg, [&] { return describe(tensor); }, nullptr, nullptr,
      offered ? &o.carry : nullptr);
  if (o.carry.carried) {
    if (e.rank() != root) return;  // the other ranks' tensors stay as they were
    return take_reduction(t, op, o, e.size());
  }
  reduce_data(backend_for(t), t, op, static_cast<int>(root), e.rank(), e.size());
}

void barrier_checked() {
  Signature s;
  s.kind = CallKind::Barrier;
  agree(s, "barrier()", "");
  mpi_backend().barrier();
}

}  // namespace fluxmpi
