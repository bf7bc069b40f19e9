#include "backend/envelope.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace fluxmpi {

namespace {

template <typename T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {  // wraps as MPI's own integer sum does, without UB
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename T>
T mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

template <typename T, typename F>
void each(const void* in, void* io, std::int64_t n, F f) {
  // memcpy-free typed access: the payload starts on a word boundary (envelope.h).
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(io);
  for (std::int64_t i = 0; i < n; ++i) b[i] = f(a[i], b[i]);
}

// Each returns false, having done nothing, for a pair that envelope_reduces refuses (the
// reduction runs inside MPI: it must not throw).
template <typename T>
bool combine_typed(const void* in, void* io, std::int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: each<T>(in, io, n, [](T a, T b) { return add(a, b); }); return true;
    case ReduceOp::Prod: each<T>(in, io, n, [](T a, T b) { return mul(a, b); }); return true;
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case ReduceOp::Min: each<T>(in, io, n, [](T a, T b) { return std::min(a, b); }); break;
      case ReduceOp::Max: each<T>(in, io, n, [](T a, T b) { return std::max(a, b); }); break;
      case ReduceOp::BAnd: each<T>(in, io, n, [](T a, T b) { return T(a & b); }); break;
      case ReduceOp::BOr: each<T>(in, io, n, [](T a, T b) { return T(a | b); }); break;
      case ReduceOp::BXor: each<T>(in, io, n, [](T a, T b) { return T(a ^ b); }); break;
      default: return false;
    }
    return true;
  }
  return false;
}

// MPI's logical ops on C bools (backend/mpi_backend.cpp mpi_op): sum and max are "or", min
// and prod "and"; the bitwise ones their logical forms. Bytes are 0 or 1.
bool combine_bool(const void* in, void* io, std::int64_t n, ReduceOp op) {
  using B = std::uint8_t;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Max:
    case ReduceOp::BOr: each<B>(in, io, n, [](B a, B b) { return B(a || b); }); return true;
    case ReduceOp::Min:
    case ReduceOp::Prod:
    case ReduceOp::BAnd: each<B>(in, io, n, [](B a, B b) { return B(a && b); }); return true;
    case ReduceOp::BXor: each<B>(in, io, n, [](B a, B b) { return B(!a != !b); }); return true;
    default: return false;
  }
}

}  // namespace

bool combine_elements(const void* in, void* io, std::int64_t bytes, c10::ScalarType dt,
                      ReduceOp op) {
  const auto n = bytes / static_cast<std::int64_t>(c10::elementSize(dt));
  switch (dt) {
    case c10::kFloat: return combine_typed<float>(in, io, n, op);
    case c10::kDouble: return combine_typed<double>(in, io, n, op);
    case c10::kChar: return combine_typed<std::int8_t>(in, io, n, op);
    case c10::kShort: return combine_typed<std::int16_t>(in, io, n, op);
    case c10::kInt: return combine_typed<std::int32_t>(in, io, n, op);
    case c10::kLong: return combine_typed<std::int64_t>(in, io, n, op);
    case c10::kByte: return combine_typed<std::uint8_t>(in, io, n, op);
    case c10::kBool: return combine_bool(in, io, n, op);
    default: return false;
  }
}

namespace {

bool same_payload(const EnvelopeHead& a, const EnvelopeHead& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.op == b.op && a.bytes == b.bytes;
}

}  // namespace

bool envelope_reduces(c10::ScalarType dt, ReduceOp op) {
  if (op == ReduceOp::Average) return false;  // lowered to a sum by the caller
  switch (dt) {
    case c10::kFloat:
    case c10::kDouble: return op == ReduceOp::Sum || op == ReduceOp::Prod;
    case c10::kChar:
    case c10::kShort:
    case c10::kInt:
    case c10::kLong:
    case c10::kByte:
    case c10::kBool: return true;
    default: return false;
  }
}

std::int64_t envelope_bytes(std::int64_t lanes, std::int64_t payload_bytes) {
  const std::int64_t words = (payload_bytes + 7) / 8;
  return (kEnvelopeHeadWords + lanes + words) * 8;
}

void combine_envelopes(const void* in, void* inout) {
  EnvelopeHead a, b;
  std::memcpy(&a, in, sizeof a);
  std::memcpy(&b, inout, sizeof b);
  const auto* la = static_cast<const std::int64_t*>(in) + kEnvelopeHeadWords;
  auto* lb = static_cast<std::int64_t*>(inout) + kEnvelopeHeadWords;
  const std::int64_t lanes = std::min(a.lanes, b.lanes);
  for (std::int64_t i = 0; i < lanes; ++i) lb[i] = std::max(la[i], lb[i]);
  const void* pa = la + a.lanes;
  void* pb = lb + b.lanes;
  if (a.lanes != b.lanes || !same_payload(a, b)) {
    b.kind = kEnvelopePoisoned;  // absorbing: stays poisoned whatever it meets next
  } else if (b.kind == kEnvelopeReduce) {
    if (!combine_elements(pa, pb, b.bytes, static_cast<c10::ScalarType>(b.dtype),
                          static_cast<ReduceOp>(b.op))) {
      b.kind = kEnvelopePoisoned;
    }
  } else if (b.kind == kEnvelopeTake && a.present != 0 && b.present == 0) {
    std::memcpy(pb, pa, static_cast<std::size_t>(b.bytes));
    b.present = 1;
  }
  std::memcpy(inout, &b, sizeof b);
}

}  // namespace fluxmpi
