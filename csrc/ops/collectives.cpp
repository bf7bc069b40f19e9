#include "ops/collectives.h"

#include <ATen/ATen.h>

#include <sstream>

#include "backend/select.h"
#include "runtime/environment.h"

namespace fluxmpi {

namespace {

bool supported_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kHalf: case c10::kBFloat16: case c10::kFloat: case c10::kDouble:
    case c10::kChar: case c10::kShort: case c10::kInt: case c10::kLong: case c10::kByte:
    case c10::kBool:
      return true;
    default:
      return false;
  }
}

std::string describe(const at::Tensor& t) {
  std::ostringstream s;
  s << "tensor of shape " << t.sizes() << ", dtype " << t.scalar_type();
  return s.str();
}

std::int64_t shape_hash(const at::Tensor& t) {
  auto sizes = t.sizes();
  return hash_bytes(sizes.data(), sizes.size() * sizeof(std::int64_t), static_cast<int>(sizes.size()));
}

Signature signature_of(CallKind kind, const at::Tensor& t) {
  Signature s;
  s.kind = kind;
  if (t.defined()) {
    s.dtype = static_cast<std::int64_t>(t.scalar_type());
    s.numel = t.numel();
    s.detail = shape_hash(t);
  }
  return s;
}

bool is_half(c10::ScalarType t) { return t == c10::kHalf || t == c10::kBFloat16; }

}  // namespace

ErrorClass validate_tensor(const at::Tensor& t, std::string& msg) {
  if (!t.defined()) {
    msg = "expected a tensor, got an undefined tensor";
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
    std::ostringstream s;
    s << "tensor dtype " << t.scalar_type()
      << " is not supported; expected one of float16, bfloat16, float32, float64, int8, "
         "int16, int32, int64, uint8, bool";
    msg = s.str();
    return ErrorClass::Type;
  }
  if (!device_supported(t)) {
    std::ostringstream s;
    s << "tensor is on " << t.device() << ", which this build cannot communicate";
    msg = s.str();
    return ErrorClass::Type;
  }
  return ErrorClass::None;
}

void allreduce_data(Backend& b, const at::Tensor& t, ReduceOp op, int world) {
  if (t.numel() == 0) return;
  at::Tensor c = t.is_contiguous() ? t : t.contiguous();
  auto dt = c.scalar_type();
  if (op == ReduceOp::Average) {
    if (is_half(dt)) {
      c.mul_(1.0 / world);  // computed in fp32 per element, so the sum cannot overflow
      b.allreduce(c.data_ptr(), c.numel(), dt, ReduceOp::Sum);
    } else {
      b.allreduce(c.data_ptr(), c.numel(), dt, ReduceOp::Sum);
      if (world > 1) {
        if (c10::isFloatingType(dt)) {
          c.div_(world);
        } else if (dt != c10::kBool) {
          c.div_(world, "floor");
        }
      }
    }
  } else {
    b.allreduce(c.data_ptr(), c.numel(), dt, op);
  }
  if (!c.is_same(t)) t.copy_(c);
}

void broadcast_data(Backend& b, const at::Tensor& t, int root) {
  if (t.numel() == 0) return;
  at::Tensor c = t.is_contiguous() ? t : t.contiguous();
  b.broadcast(c.data_ptr(), c.numel(), c.scalar_type(), root);
  if (!c.is_same(t)) t.copy_(c);
}

void reduce_data(Backend& b, const at::Tensor& t, ReduceOp op, int root, int rank, int world) {
  if (t.numel() == 0) return;
  bool is_root = rank == root;
  auto dt = t.scalar_type();
  bool prescale = op == ReduceOp::Average && is_half(dt);
  // Non-root buffers stay unchanged: they send from a copy whenever we must modify the data.
  at::Tensor send;
  if (is_root) {
    send = t.is_contiguous() ? t : t.contiguous();
    if (prescale) send.mul_(1.0 / world);
  } else {
    send = prescale ? t.mul(1.0 / world).contiguous() : t.contiguous();
  }
  b.reduce(send.data_ptr(), is_root ? send.data_ptr() : nullptr, send.numel(), dt,
           op == ReduceOp::Average ? ReduceOp::Sum : op, root);
  if (!is_root) return;
  if (op == ReduceOp::Average && !prescale && world > 1) {
    if (c10::isFloatingType(dt)) {
      send.div_(world);
    } else if (dt != c10::kBool) {
      send.div_(world, "floor");
    }
  }
  if (!send.is_same(t)) t.copy_(send);
}

namespace {

// Parse op/root without throwing: errors become this rank's part of the agreement.
ReduceOp parse_op_into(const std::string& name, Signature& s, std::string& msg) {
  try {
    auto op = parse_op(name);
    s.op = static_cast<std::int64_t>(op);
    return op;
  } catch (const c10::Error& e) {
    s.error = ErrorClass::Value;
    msg = e.what_without_backtrace();
    return ReduceOp::Sum;
  }
}

void check_root(std::int64_t root, int size, Signature& s, std::string& msg) {
  s.root = root;
  if (s.error == ErrorClass::None && (root < 0 || root >= size)) {
    s.error = ErrorClass::Value;
    msg = "root_rank " + std::to_string(root) + " is out of range; expected 0 <= root_rank < " +
          std::to_string(size);
  }
}

void validate_into(const at::Tensor& t, Signature& s, std::string& msg) {
  if (s.error != ErrorClass::None) return;
  s.error = validate_tensor(t, msg);
  if (s.error == ErrorClass::None) msg = describe(t);
}

}  // namespace

void allreduce_checked(const at::Tensor& t, const std::string& opname) {
  const auto& e = env();
  Signature s = signature_of(CallKind::Allreduce, t);
  std::string msg;
  ReduceOp op = parse_op_into(opname, s, msg);
  validate_into(t, s, msg);
  agree(s, "fluxmpi_py.allreduce_", msg);
  allreduce_data(backend_for(t), t, op, e.size);
}

void broadcast_checked(const at::Tensor& t, std::int64_t root) {
  const auto& e = env();
  Signature s = signature_of(CallKind::Broadcast, t);
  std::string msg;
  check_root(root, e.size, s, msg);
  validate_into(t, s, msg);
  agree(s, "fluxmpi_py.bcast_", msg);
  broadcast_data(backend_for(t), t, static_cast<int>(root));
}

void reduce_checked(const at::Tensor& t, const std::string& opname, std::int64_t root) {
  const auto& e = env();
  Signature s = signature_of(CallKind::Reduce, t);
  std::string msg;
  ReduceOp op = parse_op_into(opname, s, msg);
  check_root(root, e.size, s, msg);
  validate_into(t, s, msg);
  agree(s, "fluxmpi_py.reduce_", msg);
  reduce_data(backend_for(t), t, op, static_cast<int>(root), e.rank, e.size);
}

}  // namespace fluxmpi
