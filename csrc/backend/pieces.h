// A buffer made of pieces (a grouped call's tensors, in order) seen as one sequence of
// elements, and the elementwise reductions the MPI backend's own algorithms apply to it
// (mpi_ring.cpp, mpi_shared_pieces.cpp). Header-only templates.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/reduce_op.h"

namespace fluxmpi {

// Elements of T laid out over pieces, in order (a flat buffer is one piece).
template <typename T>
class PieceView {
 public:
  explicit PieceView(const std::vector<BufferPiece>& pieces) : pieces_(pieces) {
    starts_.reserve(pieces.size() + 1);
    starts_.push_back(0);
    for (const auto& p : pieces) {
      starts_.push_back(starts_.back() + p.bytes / static_cast<std::int64_t>(sizeof(T)));
    }
  }

  // f(at, k, pos) for each contiguous run of the elements [off, off + n): `k` elements at
  // `at`, the run starting `pos` elements into the range.
  template <typename F>
  void runs(std::int64_t off, std::int64_t n, F f) const {
    std::size_t i = std::upper_bound(starts_.begin(), starts_.end(), off) - starts_.begin() - 1;
    for (std::int64_t pos = 0; pos < n; ++i) {
      const std::int64_t in = off + pos - starts_[i];
      const std::int64_t k = std::min(starts_[i + 1] - starts_[i] - in, n - pos);
      if (k > 0) f(static_cast<T*>(pieces_[i].ptr) + in, k, pos);
      pos += k;
    }
  }

 private:
  const std::vector<BufferPiece>& pieces_;
  std::vector<std::int64_t> starts_;
};

// Whether x / divisor may be computed as x * (1 / divisor): where the divisor is a power of
// two its reciprocal is exact, so the bits are the division's, at a multiply's cost (a divide
// has a fraction of a multiply's throughput).
inline bool exact_inverse(int divisor) { return divisor > 0 && (divisor & (divisor - 1)) == 0; }

// d <- op(d, got) over n elements; `divisor` > 1 (sums only): then divided, the last step of
// an average. Min and max as Open MPI's MPI_MIN and MPI_MAX.
template <typename T>
void combine(ReduceOp op, T* d, const T* got, std::int64_t n, int divisor) {
  switch (op) {
    case ReduceOp::Sum:
      if (divisor != 1) {
        const T by = static_cast<T>(divisor);
        if (exact_inverse(divisor)) {
          const T inv = static_cast<T>(1) / by;
          for (std::int64_t i = 0; i < n; ++i) d[i] = (d[i] + got[i]) * inv;
        } else {
          for (std::int64_t i = 0; i < n; ++i) d[i] = (d[i] + got[i]) / by;
        }
      } else {
        for (std::int64_t i = 0; i < n; ++i) d[i] += got[i];
      }
      return;
    case ReduceOp::Min:
      for (std::int64_t i = 0; i < n; ++i) d[i] = d[i] < got[i] ? d[i] : got[i];
      return;
    case ReduceOp::Max:
      for (std::int64_t i = 0; i < n; ++i) d[i] = d[i] > got[i] ? d[i] : got[i];
      return;
    default: TORCH_INTERNAL_ASSERT(false, "the ring reduces sum, min and max, got ", op_name(op));
  }
}

// combine(), then the result also written to `copy` (one pass instead of a combine and a
// memcpy).
template <typename T>
void combine_and_copy(ReduceOp op, T* d, const T* got, T* copy, std::int64_t n, int divisor) {
  switch (op) {
    case ReduceOp::Sum:
      if (divisor != 1) {
        const T by = static_cast<T>(divisor);
        if (exact_inverse(divisor)) {
          const T inv = static_cast<T>(1) / by;
          for (std::int64_t i = 0; i < n; ++i) copy[i] = d[i] = (d[i] + got[i]) * inv;
        } else {
          for (std::int64_t i = 0; i < n; ++i) copy[i] = d[i] = (d[i] + got[i]) / by;
        }
      } else {
        for (std::int64_t i = 0; i < n; ++i) copy[i] = d[i] = d[i] + got[i];
      }
      return;
    case ReduceOp::Min:
      for (std::int64_t i = 0; i < n; ++i) copy[i] = d[i] = d[i] < got[i] ? d[i] : got[i];
      return;
    case ReduceOp::Max:
      for (std::int64_t i = 0; i < n; ++i) copy[i] = d[i] = d[i] > got[i] ? d[i] : got[i];
      return;
    default: TORCH_INTERNAL_ASSERT(false, "the ring reduces sum, min and max, got ", op_name(op));
  }
}

}  // namespace fluxmpi
