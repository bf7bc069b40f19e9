// How the NCCL backend puts each dtype and reduction on the wire. Pure logic (c10 headers only,
// no CUDA, no NCCL), so the CPU build's tests compile and check it (tests/test_cuda_switch.py).
//
// NCCL reduces int8, uint8, int32, int64, float16, bfloat16, float32 and float64 natively.
// Where its native result would differ from the MPI path, the buffer goes through a device
// temporary of another dtype instead:
//   - float16/bfloat16 sum and prod: NCCL would accumulate in 16 bits. The MPI path computes
//     each combine in fp32, so these travel as a float32 temporary, accumulate in fp32 and round
//     once at the end (never less accurate than the MPI path; bit-identical at 2 ranks).
//     Min and max round nothing, so they stay native.
//   - int16 has no NCCL type: it travels as int32. Sum and prod wrap modulo 2^16 after the
//     narrowing copy, as int16 arithmetic does on the MPI path; min and max are exact.
//   - bool has no NCCL type, but its bytes are 0 or 1: it is reduced as uint8 in place, with
//     sum/max -> max (logical or) and prod/min -> min (logical and), the MPI path's MPI_LOR and
//     MPI_LAND, without a copy and without the overflow a uint8 sum would have past 255 ranks.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "backend/backend.h"

namespace fluxmpi::nccl {

enum class Move {
  Native,       // NCCL reduces the caller's buffer as it is
  Reinterpret,  // the same bytes, reduced as `wire` (bool as uint8)
  Convert,      // through a device temporary of dtype `wire`, copied back afterwards
};

struct WirePlan {
  c10::ScalarType wire;  // the dtype NCCL sees
  ReduceOp op;           // the reduction NCCL applies (never Average)
  Move move;
};

// True for the dtypes NCCL has a type for.
constexpr bool nccl_native(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Char:
    case c10::ScalarType::Byte:
    case c10::ScalarType::Int:
    case c10::ScalarType::Long:
    case c10::ScalarType::Half:
    case c10::ScalarType::BFloat16:
    case c10::ScalarType::Float:
    case c10::ScalarType::Double: return true;
    default: return false;
  }
}

// The plan for a reduction (allreduce, reduce) of dtype `t` with `op`; nullopt when the NCCL
// backend cannot reduce this dtype or op (Average must be lowered by the ops layer first).
constexpr std::optional<WirePlan> reduction_plan(c10::ScalarType t, ReduceOp op) {
  if (op == ReduceOp::Average) return std::nullopt;
  if (op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor) {
    return std::nullopt;  // NCCL has no bitwise reductions (the ops layer refuses them first)
  }
  switch (t) {
    case c10::ScalarType::Half:
    case c10::ScalarType::BFloat16:
      if (op == ReduceOp::Sum || op == ReduceOp::Prod) {
        return WirePlan{c10::ScalarType::Float, op, Move::Convert};
      }
      return WirePlan{t, op, Move::Native};
    case c10::ScalarType::Short: return WirePlan{c10::ScalarType::Int, op, Move::Convert};
    case c10::ScalarType::Bool: {
      bool any = op == ReduceOp::Sum || op == ReduceOp::Max;
      return WirePlan{c10::ScalarType::Byte, any ? ReduceOp::Max : ReduceOp::Min,
                      Move::Reinterpret};
    }
    default:
      if (nccl_native(t)) return WirePlan{t, op, Move::Native};
      return std::nullopt;
  }
}

// The plan when the caller accepts 16 bits on the wire (Backend::allreduce_wire16): float16
// and bfloat16 reduce natively, each combine rounded to 16 bits, at half the bytes of the
// fp32 temporary; every other dtype as reduction_plan.
constexpr std::optional<WirePlan> wire16_plan(c10::ScalarType t, ReduceOp op) {
  if ((t == c10::ScalarType::Half || t == c10::ScalarType::BFloat16) && op != ReduceOp::Average) {
    return WirePlan{t, op, Move::Native};
  }
  return reduction_plan(t, op);
}

}  // namespace fluxmpi::nccl
